"""Combiners: facts joined from several probes, computed once and read by rules.

A rule module never imports another rule module; a fact two rules need, or one that joins two
probes' evidence, lives here as a pure function of Evidence.
"""

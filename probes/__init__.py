"""Probes: collect evidence from the live host (or replay a capture). They never import agent or reports."""

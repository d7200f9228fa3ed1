"""Renderers: each reads only the Report document (a dict) and writes one view of it."""

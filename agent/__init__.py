"""trainprobe: host-side diagnostics for machine-learning training nodes."""
__version__ = "0.1.0"

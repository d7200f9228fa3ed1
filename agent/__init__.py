"""trainprobe: host-side diagnostics for machine-learning training nodes."""
__version__ = "0.1.0"


def entry() -> None:
    """The `trainprobe` command. Ctrl-C while the command line itself is still being imported is
    already the contract's 130, not a traceback."""
    import sys
    try:
        from trainprobe.agent.cli import run
    except KeyboardInterrupt:
        print("\ntrainprobe: interrupted", file=sys.stderr)
        sys.exit(130)
    run()

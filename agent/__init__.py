"""trainprobe: host-side diagnostics for machine-learning training nodes."""
__version__ = "0.1.0"


def entry() -> None:
    """The `trainprobe` command. Ctrl-C while the command line itself is still being imported is
    already the contract's 130, not a traceback.

    Once the command has finished (its output flushed, every probe's process reaped, its files
    renamed into place), the interpreter's own teardown (freeing every object, module by module)
    is CPU the watched node pays for nothing: the process leaves at once. Only a run that loaded
    bcc exits normally, so bcc's own exit hook still detaches what it attached (the probes detach
    first; the hook is the second line of defence)."""
    import gc
    import sys

    # The start-up's objects (modules, classes, functions) live as long as the process: the cyclic
    # collector would scan them over and over while they are created (about a tenth of the
    # start-up's CPU) and again at every full collection after. They are set aside once imported.
    gc.disable()
    try:
        from trainprobe.agent.cli import run
    except KeyboardInterrupt:
        print("\ntrainprobe: interrupted", file=sys.stderr)
        sys.exit(130)
    finally:
        gc.freeze()
        gc.enable()
    try:
        run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if "bcc" in sys.modules:
            raise
        _leave(code)


def _leave(code: int) -> None:
    import os
    import sys
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError, OSError):
        code = code or 1
    try:
        sys.stderr.flush()
    except (ValueError, OSError):
        pass
    os._exit(code)

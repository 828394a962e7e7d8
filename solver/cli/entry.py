"""The console script: runs the CLI, and turns an interrupt that arrives before the CLI's
own handlers exist (while modules load) or after they are done (while Python shuts down)
into the same one line and exit 130 (143 for SIGTERM)."""

from __future__ import annotations

import os
import sys


def run() -> None:
    from . import interrupts

    interrupts.install()
    try:
        try:
            from .main import main

            main()
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:  # what Python would print for sys.exit("text")
                sys.stderr.write(f"{exc.code}\n")
                code = 1
        _flush()
    except BaseException:  # an interrupt while modules load or at the end, whatever Python made of it
        if not interrupts.received():
            raise
        sys.stderr.write(interrupts.message() + "\n")
        sys.stderr.flush()
        os._exit(interrupts.exit_code())
    # The work is done and the streams are flushed: leave without Python's shutdown, where
    # a late Ctrl-C is only "Exception ignored" and OR-Tools' native threads may abort.
    os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # a closed pipe: nothing more to say there
            pass

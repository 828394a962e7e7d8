"""The console script: runs the CLI, and turns an interrupt that arrives before the CLI's
own handlers exist (while modules load) into the same one line and exit 130."""

from __future__ import annotations

import os
import sys


def run() -> None:
    from . import interrupts

    interrupts.install()
    try:
        from .cli import main

        main()
    except SystemExit:
        raise
    except BaseException:  # an interrupt while modules load, whatever Python made of it
        if not interrupts.received():
            raise
        sys.stderr.write("omni-autoconf: interrupted; nothing was written\n")
        sys.stderr.flush()
        os._exit(130)

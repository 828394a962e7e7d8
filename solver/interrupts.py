"""Ctrl-C, remembered: the first thing the console script installs.

An interrupt can land anywhere, including inside the import of a C extension, where
Python turns it into an ImportError. The handler records it, so that whatever exception
it becomes, the command line still ends with one line and exit 130.
"""

from __future__ import annotations

import signal

_received = False


def _handler(signum, frame) -> None:
    global _received
    _received = True
    raise KeyboardInterrupt


def install() -> None:
    signal.signal(signal.SIGINT, _handler)


def received() -> bool:
    return _received

"""Ctrl-C, remembered: the first thing the console script installs.

An interrupt can land anywhere, including inside the import of a C extension, where
Python turns it into an ImportError. The handler records it, so that whatever exception
it becomes, the command line still ends with one line and exit 130. The line says
whether the output file had been written (in full) before the interrupt.
"""

from __future__ import annotations

import contextlib
import signal
import threading

_received = False
_written: str | None = None  # the output file, once it is in place
_deferred = False  # inside deferred(): record, do not raise


def _handler(signum, frame) -> None:
    global _received
    _received = True
    if not _deferred:
        raise KeyboardInterrupt


def install() -> None:
    signal.signal(signal.SIGINT, _handler)


def received() -> bool:
    return _received


def mark_written(path: str) -> None:
    global _written
    _written = path


def message() -> str:
    if _written is not None:
        return f"omni-autoconf: interrupted; {_written} was written in full before it"
    return "omni-autoconf: interrupted; nothing was written"


@contextlib.contextmanager
def deferred():
    """Hold a Ctrl-C until the block is done (the final write: whole, or not at all),
    then raise it. Main thread only; elsewhere the block just runs."""
    global _deferred
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, _handler)
    _deferred, before = True, _received
    try:
        yield
    finally:
        _deferred = False
        signal.signal(signal.SIGINT, previous)
    if _received and not before:
        raise KeyboardInterrupt

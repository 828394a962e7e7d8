"""Ctrl-C and SIGTERM, remembered: the first thing the console script installs.

An interrupt can land anywhere, including inside the import of a C extension, where
Python turns it into an ImportError. The handler records it, so that whatever exception
it becomes, the command line still ends with one line and exit 130. SIGTERM (what
Kubernetes and systemd send to stop a process, whose default action ends Python with no
word) takes the same path and ends with exit 143. The line says whether the output file had
been written (in full) before the signal.
"""

from __future__ import annotations

import contextlib
import signal
import threading

from ..errors import EXIT_INTERRUPTED, EXIT_TERMINATED

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: int | None = None  # the first signal that arrived
_written: str | None = None  # the output file, once it is in place
_deferred = False  # inside deferred(): record, do not raise


def _handler(signum, frame) -> None:
    global _received
    if _received is None:
        _received = signum
    if not _deferred:
        raise KeyboardInterrupt


def install() -> None:
    for signum in _SIGNALS:
        signal.signal(signum, _handler)


def received() -> bool:
    return _received is not None


def exit_code() -> int:
    """143 for SIGTERM (128 + 15, what a shell reports for it), 130 for Ctrl-C."""
    return EXIT_TERMINATED if _received == signal.SIGTERM else EXIT_INTERRUPTED


def mark_written(path: str) -> None:
    global _written
    _written = path


def message() -> str:
    what = "terminated (SIGTERM)" if _received == signal.SIGTERM else "interrupted"
    if _written is not None:
        return f"omni-autoconf: {what}; {_written} was written in full before it"
    return f"omni-autoconf: {what}; nothing was written"


@contextlib.contextmanager
def deferred():
    """Hold a Ctrl-C or SIGTERM until the block is done (the final write: whole, or not at
    all), then raise it. Main thread only; elsewhere the block just runs."""
    global _deferred
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in _SIGNALS}
    for signum in _SIGNALS:
        signal.signal(signum, _handler)
    _deferred, before = True, received()
    try:
        yield
    finally:
        _deferred = False
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received() and not before:
        raise KeyboardInterrupt

"""Domain errors. The CLI turns each into one readable line and an exit code.

Exit codes (the README's table): 0 a plan was written / the config starts; 1 no plan was
written (proven infeasible, or the time limit came before any plan) / a problem is
predicted; 2 the tool could not answer (invalid input, or an internal error); 130
interrupted (Ctrl-C, SIGINT); 143 terminated (SIGTERM, what Kubernetes and systemd send).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_NO_PLAN = 1
EXIT_NO_ANSWER = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM's number 15, the status a shell gives a process SIGTERM ended


class AutoconfError(Exception):
    """Base class of every error this package raises on purpose."""

    exit_code = EXIT_NO_ANSWER


class InputError(AutoconfError):
    """Bad input: unknown GPU or model, malformed option or file, impossible number. Exit 2."""


class CatalogError(InputError):
    """A catalog file is malformed; the message names the file and the field."""


class NvmlUnavailable(InputError):
    """NVML (the NVIDIA driver) cannot be used on this machine."""


class NoPlanError(AutoconfError):
    """No plan was found. Exit 1.

    `status` is "infeasible" (proven: `reasons` says which requirements conflict, and
    `fixes` may be filled by the caller) or "unknown" (the time limit came first: no
    explanation and no fixes, since nothing was proven).
    """

    exit_code = EXIT_NO_PLAN

    def __init__(self, message: str, reasons: list[str], conflict: list[dict] | None = None, status: str = "infeasible"):
        super().__init__(message)
        self.message = message
        self.reasons = reasons
        self.status = status
        self.conflict = conflict or []  # the requirement groups that cannot hold together
        self.fixes: list = []
        self.fix_search_note = ""  # set when the fix search stopped early

    def __str__(self) -> str:
        lines = [super().__str__()] + [f"  - {r}" for r in self.reasons]
        return "\n".join(lines)


def closest_names(name: str, known: list[str], listing: str) -> str:
    """The tail of an "unknown NAME" message: the closest known names (case and punctuation
    ignored) and where the whole list is, never the whole list."""
    import difflib
    import re

    def key(text: str) -> str:
        return re.sub(r"[^0-9a-z]", "", text.lower())

    by_key: dict[str, str] = {}
    for k in known:
        by_key.setdefault(key(k), k)
    found = difflib.get_close_matches(key(name), list(by_key), n=3, cutoff=0.6)
    names = [by_key[k] for k in found]
    hint = f"; did you mean {' or '.join(names)}?" if names else ""
    return f"{hint} ({listing} lists all {len(known)})"

"""Domain errors. The CLI turns each into one readable line and an exit code."""

from __future__ import annotations


class AutoconfError(Exception):
    """Base class of every error this package raises on purpose."""

    exit_code = 2


class InputError(AutoconfError):
    """Bad input: unknown GPU or model, malformed option, impossible number. Exit 2."""

    exit_code = 2


class CatalogError(InputError):
    """A catalog file is malformed; the message names the file and the field."""


class NoPlanError(AutoconfError):
    """No plan satisfies the constraints. Exit 1; `reasons` says which stage and GPU."""

    exit_code = 1

    def __init__(self, message: str, reasons: list[str], conflict: list[dict] | None = None):
        super().__init__(message)
        self.message = message
        self.reasons = reasons
        self.conflict = conflict or []  # the requirement groups that cannot hold together
        self.fixes: list = []  # filled by fixes.propose_fixes where the caller asks for them

    def __str__(self) -> str:
        lines = [super().__str__()] + [f"  - {r}" for r in self.reasons]
        return "\n".join(lines)


class NvmlUnavailable(AutoconfError):
    """NVML (the NVIDIA driver) cannot be used on this machine."""

    exit_code = 2

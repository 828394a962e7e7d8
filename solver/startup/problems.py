"""The problems `check` and the planner predict: each a stable code with its severity, the
stage and GPU it concerns, vLLM's (or vLLM-Omni's) words, and the figures behind them."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..vllm.facts import GiB, gib_text  # noqa: F401 (re-exported)

# Problem codes, with their severity: an error means the stage (or the GPU) fails; a
# warning means it starts, but with less than the plan's safety margin.
PROBLEM_CODES = {
    "schema-unsupported": "error",
    "pipeline-key-mismatch": "error",
    "device-layout-invalid": "error",
    "unknown-device": "error",
    "tp-mismatch": "error",
    "tp-not-divisible": "error",
    "engine-config-invalid": "error",
    "admission-exceeded": "error",
    "startup-refused": "error",
    "free-memory-capped": "error",
    "load-oom": "error",
    "pinned-kv-oom": "error",
    "diffusion-peak-beyond-free": "error",
    "no-kv-memory": "error",
    "kv-below-max-model-len": "error",
    "cfg-rows-unpaired": "error",
    "gpu-oversubscribed": "error",
    "fraction-below-usage": "warning",
    "unknown-key": "warning",
    "declared-sum-over-one": "warning",
    "no-kv-fraction-capped": "warning",
    "stage-batch-rule": "warning",
    "pinned-kv-beyond-fraction": "warning",
    "beyond-max-position": "warning",
    "below-margin": "warning",
}


@dataclass(frozen=True)
class CheckProblem:
    code: str
    stage: str | None
    gpu: int | None
    message: str
    numbers: dict[str, float] = field(default_factory=dict)
    line: int | None = None  # the line of the file it concerns, where known (a key's, else its stage's)

    @property
    def severity(self) -> str:
        return PROBLEM_CODES[self.code]

    def as_dict(self) -> dict:
        return {"code": self.code, "severity": self.severity, "stage": self.stage, "gpu": self.gpu,
                "message": self.message, "numbers": self.numbers, "line": self.line}


def dedup(problems: list[CheckProblem]) -> list[CheckProblem]:
    """Each (code, stage, GPU) once, in the order first found (co-resident sets repeat them)."""
    seen, out = set(), []
    for p in problems:
        key = (p.code, p.stage, p.gpu)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out

"""Independent re-check of a plan, written apart from the CP-SAT model on purpose.

It re-derives every GPU's sums from the plan's own figures (devices, TP, fraction, memory
terms) with vLLM's arithmetic, so a modelling slip in `cpsat` cannot pass silently:

- per GPU and time slot: sum of ceil(C x util) + outside terms + reserves <= C
- every rank of a KV stage keeps at least `min_requests` requests of max_model_len
- every generation stage's fraction covers its weights, activations and overheads
- vLLM-Omni's admission rule (memory-facts §4): sum int(C x util) + 2 GiB per stage with
  CUDA graphs + 1 GiB external + 1 GiB margin <= C
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import vllm_facts as F
from .memory import tokens_needed

if TYPE_CHECKING:
    from .planner import Plan
    from .problem import Problem


def resident_sets(stage_plans, gpu_index: int) -> list[list]:
    """The sets of stages resident on a GPU at the same time, one per time slot."""
    on = [sp for sp in stage_plans if gpu_index in sp.devices]
    slots = sorted({sp.start for sp in on if sp.start is not None}) or [None]
    return [[sp for sp in on if sp.start is None or sp.start == slot] for slot in slots]


def check_plan(problem: "Problem", plan: "Plan") -> list[str]:
    """Every violated rule, in words; an empty list means the plan holds."""
    issues: list[str] = []
    n = len(problem.gpus)
    for sp in plan.stages:
        if len(sp.devices) != sp.tensor_parallel_size or len(set(sp.devices)) != len(sp.devices):
            issues.append(f"{sp.stage.name}: devices {sp.devices} do not match TP={sp.tensor_parallel_size}")
        if any(not 0 <= d < n for d in sp.devices):
            issues.append(f"{sp.stage.name}: device index out of range in {sp.devices}")
        if not 0 < sp.util_steps <= sp.resolution:
            issues.append(f"{sp.stage.name}: gpu_memory_utilization {sp.gpu_memory_utilization} not in (0, 1]")
        for d in sp.devices:
            total = problem.gpus[d].total_bytes
            budget = -(-total * sp.util_steps // sp.resolution) - sp.memory.inside_bytes
            if sp.stage.has_kv_cache:
                need = tokens_needed(sp.knobs.max_model_len * _min_requests(problem, sp)) * sp.memory.kv_bytes_per_token
                if budget < need:
                    issues.append(f"{sp.stage.name} on GPU {d}: KV {budget} B < {need} B for its minimum requests")
            elif budget < 0:
                issues.append(f"{sp.stage.name} on GPU {d}: fraction short of its needs by {-budget} B")
    for g, gpu in enumerate(problem.gpus):
        for resident in resident_sets(plan.stages, g):
            used = sum(-(-gpu.total_bytes * sp.util_steps // sp.resolution) for sp in resident)
            used += sum(sp.memory.outside_bytes for sp in resident)
            if used + problem.reserve_bytes > gpu.total_bytes:
                names = ",".join(sp.stage.name for sp in resident)
                issues.append(
                    f"GPU {g}: {names} use {used} B + reserve {problem.reserve_bytes} B > total {gpu.total_bytes} B"
                )
            admission = sum(gpu.total_bytes * sp.util_steps // sp.resolution for sp in resident)
            admission += sum(F.GRAPH_RESERVE_BYTES for sp in resident if not sp.knobs.enforce_eager)
            admission += F.ADMISSION_EXTERNAL_RESERVE_BYTES + F.ADMISSION_SAFETY_MARGIN_BYTES
            if admission > gpu.total_bytes:
                issues.append(f"GPU {g}: admission rule needs {admission} B > total {gpu.total_bytes} B")
    return issues


def _min_requests(problem: "Problem", sp) -> int:
    return next(s.min_requests for s in problem.stages if s.name == sp.stage.name)

"""vLLM-Omni's admission: what each GPU keeps free once all stages are up, and the
parallel_stage_init rule that refuses a launch whose declared fractions do not fit
(vllm-omni 0.30.0 wheel, vllm_omni/engine/stage_admission.py)."""

from __future__ import annotations

from ..inputs.gpus import Gpu
from ..vllm import facts as F
from ..vllm.facts import GiB
from .problems import CheckProblem
from .problems import gib_text as _g

# What vLLM-Omni's admission keeps back on every GPU: 1 GiB external + 1 GiB safety (vllm-omni
# 0.30.0 wheel, vllm_omni/engine/stage_admission.py _DEFAULT_EXTERNAL_RESERVE_BYTES,
# _DEFAULT_SAFETY_MARGIN_BYTES).
ADMISSION_RESERVE_BYTES = F.ADMISSION_EXTERNAL_RESERVE_BYTES + F.ADMISSION_SAFETY_MARGIN_BYTES


def margin_bytes(buffer_bytes: int) -> int:
    """What each GPU keeps free once all stages are up: the admission reserve plus the user's
    --buffer."""
    return ADMISSION_RESERVE_BYTES + buffer_bytes


def admission_problems(runs: list, gpus: list[Gpu], sets) -> list[CheckProblem]:
    """vLLM-Omni's parallel_stage_init admission rule (vllm_omni/engine/stage_admission.py),
    per co-resident set; `runs` are startup.StageRun (their devices, fractions and eager flag)."""
    found = []
    for gpu in gpus:
        worst = None
        for members in sets:
            on = [r for r in (runs[i] for i in members) if gpu.index in r.devices]
            kv = sum(gpu.total_bytes * r.util_steps // r.resolution for r in on)
            graphs = sum(F.GRAPH_RESERVE_BYTES for r in on if not r.knobs.enforce_eager)
            need = kv + graphs + ADMISSION_RESERVE_BYTES
            if on and need > gpu.total_bytes and (worst is None or need > worst[0]):
                worst = (need, on)
        undeclared = sorted({r.stage_id for members in sets for r in (runs[i] for i in members)
                             if gpu.index in r.devices and not r.bounded and r.util_steps == 0})
        for sid in undeclared:
            found.append(CheckProblem(
                "admission-exceeded", f"stage{sid}", gpu.index,
                f"parallel_stage_init admission cannot account for local replicas of stage {sid} (diffusion, no "
                "gpu_memory_utilization): declare its fraction, what it holds at its largest request", {}))
        if worst is not None:
            need, on = worst
            names = [f"stage{r.stage_id}/replica0" for r in on]
            found.append(CheckProblem(
                "admission-exceeded", None, gpu.index,
                "parallel_stage_init admission failed — per-device budget exceeds capacity. Lower "
                "gpu_memory_utilization, reduce co-located stages, or disable parallel_stage_init. "
                f"device {gpu.index}: need {_g(need)} GiB > {_g(gpu.total_bytes)} GiB (contributors {names})",
                {"need_gib": round(need / GiB, 2), "capacity_gib": round(gpu.total_bytes / GiB, 2)},
            ))
    return found

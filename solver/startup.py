"""Predict what happens when vLLM-Omni starts an existing config, before any GPU is touched.

Stages start one after another in stage order (memory-facts §1). For each stage, on each of
its GPUs: its CUDA context (and, from vLLM 0.11, NCCL) exists before the free-memory
snapshot; then requested = ceil(total x util) is checked against free memory (§2):
upstream vLLM refuses to start, vLLM-Omni (0.24+, the default mode) caps the request to
what is free and the stage silently gets less KV. Then vLLM's own checks: no memory for
cache blocks, or not enough for one request of max_model_len. A KV stage then holds its
whole budget; a generation stage what it really uses (weights, activations, overheads,
§7). Memory outside the fractions (contexts, NCCL, CUDA graphs) must still fit the GPU.
With `parallel_init`, vLLM-Omni's admission rule (§4) is checked first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import vllm_facts as F
from .catalog import PipelineSpec, StageSpec
from .configfile import ConfigFile, StageSetting
from .errors import InputError
from .gpus import Gpu
from .memory import StageKnobs, StageMemory, kv_tokens, requested_bytes, stage_memory, tokens_needed
from .vllm_facts import GiB, OmniVersion

PROBLEM_CODES = (
    "unknown-device",
    "tp-mismatch",
    "tp-not-divisible",
    "admission-exceeded",
    "startup-refused",
    "free-memory-capped",
    "load-oom",
    "no-kv-memory",
    "kv-below-max-model-len",
    "gpu-oversubscribed",
)


def _g(nbytes: float) -> str:
    return f"{nbytes / GiB:.2f}"  # vLLM's format_gib


@dataclass(frozen=True)
class CheckProblem:
    code: str
    stage: str | None
    gpu: int | None
    message: str
    numbers: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"code": self.code, "stage": self.stage, "gpu": self.gpu, "message": self.message, "numbers": self.numbers}


@dataclass(frozen=True)
class StageOutcome:
    spec: StageSpec
    devices: tuple[int, ...]
    tensor_parallel_size: int
    gpu_memory_utilization: float
    knobs: StageKnobs
    memory: StageMemory | None  # None when the stage could not be modelled (bad TP)
    started: bool
    requested_bytes: int
    budget_bytes_per_gpu: dict[int, int]
    kv_cache_bytes: int
    kv_cache_tokens: int

    @property
    def max_concurrency(self) -> float:
        if not self.spec.has_kv_cache or self.knobs.max_model_len <= 0:
            return 0.0
        return self.kv_cache_tokens / self.knobs.max_model_len


@dataclass(frozen=True)
class GpuOutcome:
    gpu: Gpu
    stages: tuple[str, ...]
    used_bytes: int

    @property
    def free_bytes(self) -> int:
        return self.gpu.total_bytes - self.used_bytes


@dataclass(frozen=True)
class CheckReport:
    config: ConfigFile
    version: OmniVersion
    upstream: bool
    parallel_init: bool
    stages: tuple[StageOutcome, ...]
    gpus: tuple[GpuOutcome, ...]
    problems: tuple[CheckProblem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class ResolvedSetting:
    """A stage's setting with vLLM's defaults filled in."""

    spec: StageSpec
    devices: tuple[int, ...]
    tensor_parallel_size: int
    gpu_memory_utilization: float
    knobs: StageKnobs
    explicit_devices: bool
    explicit_tp: bool


def default_utilization(version: OmniVersion) -> float:
    """vLLM's default gpu_memory_utilization: 0.9 up to 0.11, 0.92 in 0.33 (memory-facts §2)."""
    return F.DEFAULT_GPU_MEMORY_UTILIZATION_033 if version.vllm >= (0, 33) else F.DEFAULT_GPU_MEMORY_UTILIZATION


def resolve_settings(pipeline: PipelineSpec, config: ConfigFile, version: OmniVersion) -> list[ResolvedSetting]:
    """Match the file's stages to the pipeline's and fill what the file leaves out."""
    by_id: dict[int, StageSetting] = {}
    for st in config.stages:
        if st.stage_id in by_id:
            raise InputError(f"{config.path}: stage_id {st.stage_id} appears twice")
        if not 0 <= st.stage_id < len(pipeline.stages):
            raise InputError(f"{config.path}: stage_id {st.stage_id} is not a stage of {pipeline.name}")
        by_id[st.stage_id] = st
    out = []
    for spec in pipeline.stages:
        st = by_id.get(spec.stage_id)
        if st is None:
            raise InputError(f"{config.path}: no stage {spec.stage_id} ({spec.name}) for {pipeline.name}")
        tp = st.tensor_parallel_size or 1
        util = st.gpu_memory_utilization if st.gpu_memory_utilization is not None else default_utilization(version)
        if not 0 < util <= 1:
            raise InputError(f"{config.path}: stage {spec.stage_id} gpu_memory_utilization {util} is not in (0, 1]")
        kv_dtype = "fp8" if str(st.kv_cache_dtype or "auto").startswith("fp8") else "auto"
        knobs = StageKnobs(
            max_model_len=st.max_model_len or spec.transformer.max_position,
            max_num_seqs=st.max_num_seqs or F.DEFAULT_MAX_NUM_SEQS,
            max_num_batched_tokens=st.max_num_batched_tokens or F.DEFAULT_MAX_NUM_BATCHED_TOKENS,
            enforce_eager=bool(st.enforce_eager),
            kv_cache_dtype=kv_dtype,
        )
        out.append(
            ResolvedSetting(
                spec=spec,
                devices=st.devices if st.devices is not None else tuple(range(tp)),
                tensor_parallel_size=tp,
                gpu_memory_utilization=util,
                knobs=knobs,
                explicit_devices=st.devices is not None,
                explicit_tp=st.tensor_parallel_size is not None,
            )
        )
    return out


def _layout_problems(rs: ResolvedSetting, num_gpus: int) -> list[CheckProblem]:
    name, tp, devices = rs.spec.name, rs.tensor_parallel_size, rs.devices
    found = []
    bad = [d for d in devices if not 0 <= d < num_gpus]
    if bad:
        found.append(CheckProblem("unknown-device", name, bad[0],
                                  f"{name}: devices {','.join(map(str, devices))} name GPU {bad[0]}, "
                                  f"but only GPUs 0..{num_gpus - 1} exist", {"device": bad[0], "num_gpus": num_gpus}))
    if len(devices) != tp or len(set(devices)) != len(devices):
        found.append(CheckProblem("tp-mismatch", name, None,
                                  f"{name}: {len(devices)} device(s) {','.join(map(str, devices))} for "
                                  f"tensor_parallel_size {tp} (vLLM needs one distinct GPU per rank)",
                                  {"devices": len(devices), "tensor_parallel_size": tp}))
    heads = rs.spec.transformer.num_heads
    if tp < 1 or heads % tp:
        found.append(CheckProblem("tp-not-divisible", name, None,
                                  f"Total number of attention heads ({heads}) must be divisible by tensor "
                                  f"parallel size ({tp}).", {"num_heads": heads, "tensor_parallel_size": tp}))
    return found


def _admission(settings: list[ResolvedSetting], gpus: list[Gpu]) -> list[CheckProblem]:
    found = []
    for gpu in gpus:
        on = [rs for rs in settings if gpu.index in rs.devices]
        kv = sum(int(gpu.total_bytes * rs.gpu_memory_utilization) for rs in on)
        graphs = sum(F.GRAPH_RESERVE_BYTES for rs in on if not rs.knobs.enforce_eager)
        need = kv + graphs + F.ADMISSION_EXTERNAL_RESERVE_BYTES + F.ADMISSION_SAFETY_MARGIN_BYTES
        if on and need > gpu.total_bytes:
            names = [f"stage{rs.spec.stage_id}/replica0" for rs in on]
            found.append(CheckProblem(
                "admission-exceeded", None, gpu.index,
                "parallel_stage_init admission failed — per-device budget exceeds capacity. Lower "
                "gpu_memory_utilization, reduce co-located stages, or disable parallel_stage_init. "
                f"device {gpu.index}: need {_g(need)} GiB > {_g(gpu.total_bytes)} GiB (contributors {names})",
                {"need_gib": round(need / GiB, 2), "capacity_gib": round(gpu.total_bytes / GiB, 2)},
            ))
    return found


def simulate(
    pipeline: PipelineSpec,
    gpus: list[Gpu],
    version: OmniVersion,
    config: ConfigFile,
    *,
    upstream: bool | None = None,
    parallel_init: bool = False,
) -> CheckReport:
    """Walk the start-up of `config` on `gpus` and report every predicted problem.

    `upstream`: True for upstream vLLM's refusal, False for vLLM-Omni's capping; None
    follows the version (capping from vLLM-Omni 0.24).
    """
    if upstream is None:
        upstream = not version.caps_to_free_memory
    settings = resolve_settings(pipeline, config, version)
    problems: list[CheckProblem] = []
    if parallel_init:
        problems += _admission(settings, gpus)
    used = {g.index: 0 for g in gpus}
    outcomes = []
    for rs in settings:
        layout = _layout_problems(rs, len(gpus))
        problems += layout
        memory = None if any(p.code == "tp-not-divisible" for p in layout) else stage_memory(
            rs.spec, rs.tensor_parallel_size, rs.knobs, version
        )
        outcome, stage_problems = _start_stage(rs, memory, gpus, used, upstream, layout_ok=not layout)
        problems += stage_problems
        outcomes.append(outcome)
    gpu_outcomes = []
    for gpu in gpus:
        names = tuple(o.spec.name for o in outcomes if gpu.index in o.devices)
        gpu_outcomes.append(GpuOutcome(gpu, names, used[gpu.index]))
        if used[gpu.index] > gpu.total_bytes:
            problems.append(CheckProblem(
                "gpu-oversubscribed", None, gpu.index,
                f"GPU {gpu.index}: the started stages need {_g(used[gpu.index])} GiB > total "
                f"{_g(gpu.total_bytes)} GiB once CUDA graphs and other memory outside the fractions are "
                "allocated: CUDA out of memory at graph capture or under load",
                {"used_gib": round(used[gpu.index] / GiB, 2), "total_gib": round(gpu.total_bytes / GiB, 2)},
            ))
    return CheckReport(config, version, upstream, parallel_init, tuple(outcomes), tuple(gpu_outcomes), tuple(problems))


def _start_stage(rs, memory, gpus, used, upstream, layout_ok):
    """One stage's start-up on each of its GPUs; updates `used`; returns outcome and problems."""
    name, util = rs.spec.name, rs.gpu_memory_utilization
    problems: list[CheckProblem] = []
    budgets: dict[int, int] = {}
    if not layout_ok or memory is None:
        outcome = StageOutcome(rs.spec, rs.devices, rs.tensor_parallel_size, util, rs.knobs, memory,
                               False, 0, {}, 0, 0)
        return outcome, problems
    before_snapshot = memory.context_bytes + memory.nccl_bytes
    started = True
    requested = 0
    for d in rs.devices:  # contexts (and NCCL) exist before the snapshot
        used[d] += before_snapshot
    for d in rs.devices:
        gpu = gpus[d]
        requested = requested_bytes(gpu.total_bytes, round(util * 10**6), 10**6)
        free = gpu.total_bytes - used[d]
        budgets[d] = min(free, requested)
        if free >= requested:
            continue
        numbers = {"free_gib": round(free / GiB, 2), "total_gib": round(gpu.total_bytes / GiB, 2),
                   "utilization": util, "requested_gib": round(requested / GiB, 2)}
        text = (f"Free memory on device cuda:{d} ({_g(free)}/{_g(gpu.total_bytes)} GiB) on startup is less "
                f"than desired GPU memory utilization ({util}, {_g(requested)} GiB).")
        if upstream:
            problems.append(CheckProblem("startup-refused", name, d, text + " Decrease GPU memory utilization "
                                         "or reduce GPU memory used by other processes.", numbers))
            started = False
        else:
            problems.append(CheckProblem("free-memory-capped", name, d, text + " Capping requested memory to "
                                         f"available free memory ({_g(free)} GiB).", numbers))
    for d in rs.devices:
        free = gpus[d].total_bytes - used[d]
        if started and memory.weights_bytes > free:
            problems.append(CheckProblem(
                "load-oom", name, d,
                f"CUDA out of memory while loading the weights: {_g(memory.weights_bytes)} GiB per rank, "
                f"{_g(free)} GiB free on cuda:{d}",
                {"weights_gib": round(memory.weights_bytes / GiB, 2), "free_gib": round(free / GiB, 2)},
            ))
            started = False
    kv = min(b - memory.inside_bytes for b in budgets.values())
    tokens = kv_tokens(kv, memory.kv_bytes_per_token) if rs.spec.has_kv_cache else 0
    if started and rs.spec.has_kv_cache:
        gpu = min(budgets, key=lambda d: (budgets[d], d))
        L = rs.knobs.max_model_len
        if kv <= 0:
            problems.append(CheckProblem("no-kv-memory", name, gpu, "No available memory for the cache blocks. Try "
                                         "increasing `gpu_memory_utilization` when initializing the engine.",
                                         {"available_kv_gib": round(kv / GiB, 2)}))
            started = False
        elif tokens < L:
            need = tokens_needed(L) * memory.kv_bytes_per_token
            problems.append(CheckProblem(
                "kv-below-max-model-len", name, gpu,
                f"To serve at least one request with the models's max seq len ({L}), ({_g(need)} GiB KV cache is "
                f"needed, which is larger than the available KV cache memory ({_g(kv)} GiB). Based on the available "
                f"memory, the estimated maximum model length is {tokens}. Try increasing `gpu_memory_utilization` or "
                "decreasing `max_model_len` when initializing the engine.",
                {"needed_kv_gib": round(need / GiB, 2), "available_kv_gib": round(kv / GiB, 2), "max_model_len": L,
                 "estimated_max_model_len": tokens},
            ))
            started = False
    for d in rs.devices:
        if started:  # a KV stage holds its whole budget; a generation stage what it uses
            used[d] += (budgets[d] if rs.spec.has_kv_cache else memory.inside_bytes) + memory.graph_reserve_bytes
        else:  # the process exits and frees its context
            used[d] -= before_snapshot
    outcome = StageOutcome(
        spec=rs.spec, devices=rs.devices, tensor_parallel_size=rs.tensor_parallel_size,
        gpu_memory_utilization=util, knobs=rs.knobs, memory=memory, started=started,
        requested_bytes=requested, budget_bytes_per_gpu=budgets,
        kv_cache_bytes=max(kv, 0) if rs.spec.has_kv_cache else 0, kv_cache_tokens=tokens,
    )
    return outcome, problems

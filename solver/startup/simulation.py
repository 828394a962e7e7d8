"""The start-up model: what happens when vLLM-Omni launches a set of stages.

One model, read by `check` (an existing file) and by the planner (every plan is re-checked
here before it is returned), so the two cannot disagree. The CP-SAT model (cpsat.py)
encodes the same rules as linear constraints.

For every co-resident set of stages (residency.py; all stages unless --exclusive says
otherwise), stages start one after another, diffusion stages first, then the others in
stage order (vllm-omni 0.30.0 wheel, vllm_omni/config/omni_config.py: parallel_stage_init
defaults to False; engine/stage_runtime.py starts the diffusion groups first). For each
stage, on each of its GPUs: its CUDA context (and, from vLLM 0.11, NCCL) exists before
the free-memory snapshot; then requested = ceil(total x util) is checked against free
memory (§2): upstream vLLM refuses to start, vLLM-Omni 0.24+ caps the request to what is
free and the stage silently gets less KV. The weights must load into what is free; then
vLLM's own checks: no memory for cache blocks, or not enough for one request of
max_model_len. A started stage then holds its whole budget plus what lies outside it
(context, NCCL, CUDA graphs); with kv_cache_memory_bytes, what it uses and that KV instead. A stage without KV cache holds what it uses, whatever its
fraction: vLLM allocates nothing from that fraction (v1/engine/core.py skips the memory
profile of a stage without a KV spec), so its use is the catalog's peak, an estimate that
errs high (a fraction below it is flagged). The planner still counts such a stage's whole
fraction (cpsat.py), which it sizes to that use. A dense diffusion stage has no fraction at
all: it is held at what it holds at its largest request.
Once all are up, each GPU must keep the margin free (vLLM-Omni's 2 GiB admission reserve
plus --buffer), and with `parallel_init`, vLLM-Omni's admission rule (§4) holds first.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..inputs.gpus import Gpu, first_on_each_host
from ..memory.hybrid_kv import longest_request
from ..memory.stage_memory import (
    StageKnobs,
    StageMemory,
    kv_tokens,
    requested_bytes,
    tokens_needed,
)
from ..vllm.facts import GiB
from .admission import admission_problems
from .problems import CheckProblem, dedup
from .problems import gib_text as _g
from .residency import resident_sets


@dataclass(frozen=True)
class StageRun:
    """One stage as it is launched: where, how large a fraction, and what it needs."""

    stage_id: int
    name: str
    has_kv: bool
    devices: tuple[int, ...]
    tensor_parallel_size: int
    util_steps: int  # gpu_memory_utilization = util_steps / resolution, exactly
    resolution: int
    knobs: StageKnobs
    memory: StageMemory | None  # None when the stage cannot be modelled (bad layout)
    kv_pinned_bytes: int | None = None  # kv_cache_memory_bytes: vLLM allocates this, sizing nothing
    replicas: int = 1  # devices is the pool: replica r takes devices[r*tp:(r+1)*tp]
    bounded: bool = True  # False: a diffusion stage, which its fraction neither gates nor bounds
    vllm: tuple[int, int] = (0, 30)  # the vLLM release (its hybrid KV grouping rule)
    # a diffusion stage's sequence-parallel ranks per TP rank: each holds the TP rank's weights and,
    # counted whole (high: the ranks share a request's sequence), the stage's peak
    sequence_parallel: int = 1

    @property
    def gpu_memory_utilization(self) -> float:
        return round(self.util_steps / self.resolution, 6)

    def replica_devices(self) -> tuple[tuple[int, ...], ...]:
        ranks = self.tensor_parallel_size * self.sequence_parallel
        return tuple(tuple(self.devices[r * ranks:(r + 1) * ranks]) for r in range(self.replicas))


@dataclass(frozen=True)
class StageOutcome:
    run: StageRun
    started: bool
    requested_bytes: int  # on the stage's smallest GPU
    budget_bytes_per_gpu: dict[int, int]  # min(free, requested), the worst co-resident set
    kv_cache_bytes: int  # per rank, the smallest over the stage's GPUs
    kv_cache_tokens: int  # per replica, the smallest
    replica_kv_tokens: tuple[int, ...] = ()  # each replica's, in replica order

    @property
    def max_concurrency(self) -> float:
        """Requests of max_model_len the KV caches hold, over all replicas (each replica's
        vLLM prints its own "Maximum concurrency")."""
        if not self.run.has_kv or self.run.knobs.max_model_len <= 0:
            return 0.0
        return sum(self.replica_kv_tokens or (self.kv_cache_tokens,)) / self.run.knobs.max_model_len


@dataclass(frozen=True)
class GpuOutcome:
    """One GPU once every stage is up, in its fullest co-resident set."""

    gpu: Gpu
    stages: tuple[str, ...]  # every stage with a rank here
    requested_bytes: int
    outside_bytes: int
    margin_bytes: int

    @property
    def used_bytes(self) -> int:
        return self.requested_bytes + self.outside_bytes

    @property
    def free_bytes(self) -> int:
        """What is left beyond the stages and the margin (negative: the margin is eaten)."""
        return self.gpu.total_bytes - self.used_bytes - self.margin_bytes


@dataclass(frozen=True)
class StartupReport:
    stages: tuple[StageOutcome, ...]
    gpus: tuple[GpuOutcome, ...]
    problems: tuple[CheckProblem, ...]

    @property
    def errors(self) -> tuple[CheckProblem, ...]:
        return tuple(p for p in self.problems if p.severity == "error")

    @property
    def warnings(self) -> tuple[CheckProblem, ...]:
        return tuple(p for p in self.problems if p.severity == "warning")

    @property
    def ok(self) -> bool:
        return not self.errors


def simulate(
    runs: list[StageRun],
    gpus: list[Gpu],
    *,
    upstream: bool,
    parallel_init: bool,
    margin: int,
    exclusive_groups: tuple[tuple[int, ...], ...] = (),
    frontend: int = 0,
) -> StartupReport:
    """Walk the start-up of `runs` on `gpus` (every co-resident set) and report every
    predicted problem, each stage's KV cache and each GPU's memory map.

    `upstream`: upstream vLLM's refusal when free < requested, else vLLM-Omni's capping.
    `runs[i]` must be stage i of the pipeline (exclusive groups name indices); `frontend`:
    what the API process takes on each host's first GPU once serving (catalog frontend_gpu_bytes)."""
    sets = resident_sets(len(runs), exclusive_groups)
    problems: list[CheckProblem] = []
    if parallel_init:
        problems += admission_problems(runs, gpus, sets)
    budgets: dict[int, dict[int, int]] = {i: {} for i in range(len(runs))}
    started = {i: runs[i].memory is not None for i in range(len(runs))}
    fullest: dict[int, tuple[int, int]] = {g.index: (0, 0) for g in gpus}
    for members in sets:
        used = {g.index: 0 for g in gpus}
        requested_on = {g.index: 0 for g in gpus}
        # diffusion stages start first, one after another, then the LLM stages (vllm_omni
        # 0.30.0 engine/stage_runtime.py: the "inline" diffusion groups before the others)
        for i in sorted(members, key=lambda i: runs[i].bounded):
            run = runs[i]
            if run.memory is None:
                continue
            before = dict(used)
            ok, got = _start_stage(run, gpus, used, upstream, problems)
            started[i] = started[i] and ok
            for d, b in got.items():
                budgets[i][d] = min(budgets[i].get(d, b), b)
                if ok:  # what the stage holds inside its fraction (at least what it uses)
                    held = used[d] - before[d] - run.memory.started_outside_bytes
                    requested_on[d] += held if run.bounded else run.memory.inside_bytes
        _diffusion_peaks(runs, members, started, gpus, used, problems)
        for i in members:  # what a serving stage takes later, beyond its fraction (a cloning clip,
            # and under the "either" reading the runner buffers and peak that return under load)
            m = runs[i].memory
            for d in runs[i].devices if started[i] and m is not None else ():
                used[d] += m.outside_bytes - m.started_outside_bytes if runs[i].bounded else m.serving_outside_bytes
        fronts = first_on_each_host(gpus) if frontend else set()
        for gpu in gpus:
            g = gpu.index
            used[g] += frontend if g in fronts else 0
            if used[g] > sum(fullest[g]):
                fullest[g] = (requested_on[g], used[g] - requested_on[g])
            names = [runs[i].name for i in members if g in runs[i].devices] + (["the API process"] if g in fronts else [])
            problems += _final_state(gpu, used[g], margin, names)
    outcomes = []
    for i, run in enumerate(runs):
        kv = 0
        if run.memory is not None and budgets[i]:
            kv = min(b - run.memory.inside_bytes for b in budgets[i].values())
            if run.has_kv and run.kv_pinned_bytes:
                kv = run.kv_pinned_bytes
        has_cache = run.has_kv and run.memory is not None
        tokens = kv_tokens(kv, run.memory.kv_bytes_per_token) if has_cache else 0
        per_replica: tuple[int, ...] = ()
        if has_cache and budgets[i]:
            per_replica = tuple(
                kv_tokens(run.kv_pinned_bytes or min(budgets[i][d] - run.memory.inside_bytes for d in devs if d in budgets[i]),
                          run.memory.kv_bytes_per_token)
                for devs in run.replica_devices() if any(d in budgets[i] for d in devs))
        requested = min((requested_bytes(gpus[d].total_bytes, run.util_steps, run.resolution)
                         for d in run.devices if 0 <= d < len(gpus)), default=0)
        outcomes.append(StageOutcome(run, started[i], requested, budgets[i],
                                     max(kv, 0) if has_cache else 0, tokens, per_replica))
    gpu_outcomes = tuple(
        GpuOutcome(gpu, tuple(r.name for r in runs if gpu.index in r.devices), *fullest[gpu.index], margin)
        for gpu in gpus
    )
    return StartupReport(tuple(outcomes), gpu_outcomes, tuple(dedup(problems)))


def _final_state(gpu: Gpu, used: int, margin: int, names: list[str]) -> list[CheckProblem]:
    numbers = {"used_gib": round(used / GiB, 2), "total_gib": round(gpu.total_bytes / GiB, 2),
               "margin_gib": round(margin / GiB, 2)}
    if used > gpu.total_bytes:
        return [CheckProblem(
            "gpu-oversubscribed", None, gpu.index,
            f"{', '.join(names)} need {_g(used)} GiB > total {_g(gpu.total_bytes)} GiB once "
            "CUDA graphs and other memory outside the fractions are allocated: CUDA out of memory at graph "
            "capture or under load", numbers)]
    if used + margin > gpu.total_bytes:
        return [CheckProblem(
            "below-margin", None, gpu.index,
            f"{', '.join(names)} leave {_g(gpu.total_bytes - used)} GiB free, less than the "
            f"{_g(margin)} GiB margin (vLLM-Omni's 2 GiB admission reserve + --buffer)", numbers)]
    return []


def _start_stage(run: StageRun, gpus: list[Gpu], used: dict[int, int], upstream: bool, problems: list) -> tuple[bool, dict[int, int]]:
    """One stage's start-up on each of its GPUs; updates `used` and `problems`; returns
    whether it started and its budget per GPU."""
    if not run.bounded:
        return _start_unbounded(run, gpus, used, problems)
    memory, name, util = run.memory, run.name, run.gpu_memory_utilization
    before_snapshot = memory.context_bytes + memory.nccl_bytes
    started = True
    budgets: dict[int, int] = {}
    for d in run.devices:  # contexts (and NCCL) exist before the snapshot
        used[d] += before_snapshot
    for d in run.devices:
        gpu = gpus[d]
        requested = requested_bytes(gpu.total_bytes, run.util_steps, run.resolution)
        free = gpu.total_bytes - used[d]
        budgets[d] = max(0, min(free, requested))
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
        elif not run.has_kv:  # its fraction sizes nothing: capped, it loads and runs as before
            problems.append(CheckProblem("no-kv-fraction-capped", name, d, text + " Capping requested memory to "
                                         f"available free memory ({_g(free)} GiB); the stage sizes no KV cache "
                                         "from it, so it starts", numbers))
        else:
            problems.append(CheckProblem("free-memory-capped", name, d, text + " Capping requested memory to "
                                         f"available free memory ({_g(free)} GiB).", numbers))
    for d in run.devices:
        free = gpus[d].total_bytes - used[d]
        if started and memory.weights_bytes > free:
            problems.append(_load_oom(name, d, memory.weights_bytes, free))
            started = False
    kv = min(b - memory.inside_bytes for b in budgets.values())
    for d in run.devices if started and run.has_kv and run.kv_pinned_bytes else ():
        free = gpus[d].total_bytes - used[d]  # vLLM allocates the pin whole after the profile run
        if memory.inside_bytes + run.kv_pinned_bytes > free:
            problems.append(CheckProblem(
                "pinned-kv-oom", name, d,
                f"CUDA out of memory allocating the pinned KV cache: {_g(run.kv_pinned_bytes)} GiB on top of "
                f"{_g(memory.inside_bytes)} GiB in use, {_g(free)} GiB free on cuda:{d}",
                {"pinned_gib": round(run.kv_pinned_bytes / GiB, 2), "free_gib": round(free / GiB, 2)}))
            started = False
    if run.has_kv and run.kv_pinned_bytes:
        if started and kv < run.kv_pinned_bytes:
            d = min(budgets, key=lambda d: (budgets[d], d))
            problems.append(CheckProblem(
                "pinned-kv-beyond-fraction", name, d,
                f"{name}: kv_cache_memory_bytes ({_g(run.kv_pinned_bytes)} GiB) is more than the fraction leaves for "
                f"KV ({_g(kv)} GiB on cuda:{d}); vLLM allocates it anyway, beyond gpu_memory_utilization",
                {"pinned_gib": round(run.kv_pinned_bytes / GiB, 2), "fraction_kv_gib": round(kv / GiB, 2)}))
        kv = run.kv_pinned_bytes
    if started and run.has_kv:
        started = _kv_checks(run, kv, min(budgets, key=lambda d: (budgets[d], d)), problems)
    elif started and kv < 0:
        d = min(budgets, key=lambda d: (budgets[d], d))
        problems.append(CheckProblem(
            "fraction-below-usage", name, d,
            f"{name}: its fraction ({_g(budgets[d])} GiB on cuda:{d}) is below what it uses "
            f"({_g(memory.inside_bytes)} GiB: weights, activations, other). vLLM does not stop a stage "
            "without KV cache, but what it uses beyond its fraction is planned for by nothing",
            {"budget_gib": round(budgets[d] / GiB, 2), "needed_gib": round(memory.inside_bytes / GiB, 2)}))
    for d in run.devices:
        if started:  # the stage holds its budget (at least what it uses) and what lies outside it
            held = budgets[d] if run.has_kv else memory.inside_bytes  # no KV: its fraction allocates nothing
            if run.has_kv and run.kv_pinned_bytes:  # vLLM takes the pinned KV, not the fraction's
                held = memory.inside_bytes + run.kv_pinned_bytes  # (vllm_omni 0.30.0 worker/base.py:124-128)
            used[d] += held + memory.started_outside_bytes - before_snapshot
        else:  # the process exits and frees its context
            used[d] -= before_snapshot
    return started, budgets


def _load_oom(name: str, d: int, weights: int, free: int) -> CheckProblem:
    return CheckProblem("load-oom", name, d, f"CUDA out of memory while loading the weights: {_g(weights)} GiB per "
                        f"rank, {_g(free)} GiB free on cuda:{d}",
                        {"weights_gib": round(weights / GiB, 2), "free_gib": round(free / GiB, 2)})


def _start_unbounded(run: StageRun, gpus: list[Gpu], used: dict[int, int], problems: list) -> tuple[bool, dict[int, int]]:
    """A dense diffusion stage: no free-memory check, no budget. It loads its weights and
    later takes its peak wherever the memory is; beyond what is free, CUDA runs out of
    memory at load or at its largest request (then that request fails)."""
    memory, name = run.memory, run.name
    started = True
    budgets: dict[int, int] = {}
    pools: dict[int, int] = {}
    for d in run.devices:
        free = gpus[d].total_bytes - used[d]
        if memory.weights_bytes + memory.context_bytes > free:
            problems.append(_load_oom(name, d, memory.weights_bytes, free))
            started = False
        elif memory.pool_fraction:  # a KV pool sized from what the load leaves (vllm_omni experimental/ar_diffusion)
            left = free - memory.weights_bytes - memory.context_bytes
            pools[d] = max(int(memory.pool_fraction * left), memory.pool_floor_bytes)
            if memory.pool_floor_bytes > left:
                problems.append(CheckProblem(
                    "startup-refused", name, d, f"{name}: its KV pool needs at least {_g(memory.pool_floor_bytes)} GiB "
                    f"(one session), {_g(left)} GiB are free on cuda:{d} once the weights are in: the engine raises at "
                    "start-up", {"needed_gib": round(memory.pool_floor_bytes / GiB, 2), "free_gib": round(left / GiB, 2)}))
                started = False
        budgets[d] = memory.inside_bytes
    for d in run.devices:
        if started:  # its load (and a small warm-up) now; its largest request's peak once all are up
            used[d] += (memory.inside_bytes + memory.outside_bytes - memory.serving_outside_bytes - memory.activation_bytes
                        + pools.get(d, 0))
    return started, budgets


def _diffusion_peaks(runs: list[StageRun], members, started: dict[int, bool], gpus: list[Gpu],
                     used: dict[int, int], problems: list) -> None:
    """Each started diffusion stage takes its largest request's peak where the memory is,
    after every stage has started (its start-up warm-up is a 512x512, 2-step request:
    vllm_omni 0.30.0 diffusion/diffusion_engine.py)."""
    for i in members:
        run = runs[i]
        if run.bounded or run.memory is None or not started[i]:
            continue
        peak = run.memory.activation_bytes - run.memory.pool_floor_bytes  # a load-time pool is in already
        for d in run.devices:
            free = gpus[d].total_bytes - used[d]
            if peak > free:
                problems.append(CheckProblem(
                    "diffusion-peak-beyond-free", run.name, d,
                    f"{run.name}: its largest request needs {_g(peak)} GiB more on cuda:{d} once every stage is up, "
                    f"{_g(free)} GiB are free: that request runs out of memory (gpu_memory_utilization does not "
                    "bound a diffusion stage)", {"needed_gib": round(peak / GiB, 2), "free_gib": round(free / GiB, 2)}))
            used[d] += peak


def _kv_checks(run: StageRun, kv: int, gpu: int, problems: list) -> bool:
    """vLLM's two KV checks before start-up completes; False when the stage fails."""
    tokens = kv_tokens(kv, run.memory.kv_bytes_per_token)
    L = run.knobs.max_model_len
    if kv <= 0:
        problems.append(CheckProblem("no-kv-memory", run.name, gpu, "No available memory for the cache blocks. "
                                     "Try increasing `gpu_memory_utilization` when initializing the engine.",
                                     {"available_kv_gib": round(kv / GiB, 2)}))
        return False
    if tokens < L:
        if run.memory.kv_layout is not None:  # sliding windows, Mamba state: shorter requests cost more per token
            tokens = longest_request(kv, run.memory.kv_layout)
        need = tokens_needed(L) * run.memory.kv_bytes_per_token
        problems.append(CheckProblem(
            "kv-below-max-model-len", run.name, gpu,
            f"To serve at least one request with the models's max seq len ({L}), ({_g(need)} GiB KV cache is "
            f"needed, which is larger than the available KV cache memory ({_g(kv)} GiB). Based on the available "
            f"memory, the estimated maximum model length is {tokens}. Try increasing `gpu_memory_utilization` or "
            "decreasing `max_model_len` when initializing the engine.",
            {"needed_kv_gib": round(need / GiB, 2), "available_kv_gib": round(kv / GiB, 2), "max_model_len": L,
             "estimated_max_model_len": tokens},
        ))
        return False
    return True

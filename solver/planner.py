"""The library's entry point: `plan(request) -> Plan`.

request -> memory model per stage and TP degree -> Problem -> CP-SAT -> Plan, then an
independent re-check of every GPU's sums (`verify`) before the plan is returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from . import cpsat, explain, vllm_facts as F
from .catalog import PipelineSpec, StageSpec
from .errors import InputError, NoPlanError
from .gpus import Gpu
from .memory import (
    KvCacheDtype,
    StageKnobs,
    StageMemory,
    kv_tokens,
    requested_bytes,
    resolve_knobs,
    stage_memory,
)
from .problem import Problem, StageProblem, TpOption
from .verify import check_plan, resident_sets
from .vllm_facts import GiB, OmniVersion

# Default --buffer, GiB per GPU on top of vLLM-Omni's 2 GiB admission reserve. gpus.md:
# totals move by up to ~0.2 GiB between drivers (we already take the low end) and it
# advises >= 0.1-0.2 GiB of slack; 0.5 GiB also absorbs allocator fragmentation after
# hours of serving. Documented in the README.
DEFAULT_BUFFER_GIB = 0.5


@dataclass(frozen=True)
class Request:
    """Everything a plan depends on. Per-stage maps are keyed by stage name."""

    pipeline: PipelineSpec
    gpus: tuple[Gpu, ...]
    version: OmniVersion
    schema: str
    buffer_bytes: int = int(DEFAULT_BUFFER_GIB * GiB)
    resolution: int = 100
    tp: dict[str, int] = field(default_factory=dict)
    devices: dict[str, tuple[int, ...]] = field(default_factory=dict)
    max_model_len: dict[str, int] = field(default_factory=dict)
    max_num_seqs: dict[str, int] = field(default_factory=dict)
    max_num_batched_tokens: dict[str, int] = field(default_factory=dict)
    enforce_eager: dict[str, bool] = field(default_factory=dict)
    min_concurrency: dict[str, int] = field(default_factory=dict)
    weight: dict[str, float] = field(default_factory=dict)
    exclusive: tuple[tuple[str, ...], ...] = ()
    kv_cache_dtype: KvCacheDtype = "auto"
    time_limit_s: float = cpsat.DEFAULT_TIME_LIMIT_S


@dataclass(frozen=True)
class StagePlan:
    """One stage of a plan. Byte figures are per TP rank; KV is the smallest over ranks."""

    stage: StageSpec
    devices: tuple[int, ...]
    tensor_parallel_size: int
    util_steps: int
    resolution: int
    knobs: StageKnobs
    memory: StageMemory
    kv_cache_bytes: int
    kv_cache_tokens: int
    kv_bytes_per_gpu: dict[int, int]
    start: int | None = None  # time slot when in an exclusive group; None: always resident

    @property
    def gpu_memory_utilization(self) -> float:
        return round(self.util_steps / self.resolution, 6)

    @property
    def max_concurrency(self) -> float:
        """Requests of max_model_len the KV cache holds (vLLM's "Maximum concurrency")."""
        if not self.stage.has_kv_cache:
            return 0.0
        return self.kv_cache_tokens / self.knobs.max_model_len


@dataclass(frozen=True)
class GpuPlan:
    """One GPU's memory map under the plan (all resident stages at once, worst slot)."""

    gpu: Gpu
    stages: tuple[str, ...]
    requested_bytes: int
    outside_bytes: int
    reserve_bytes: int

    @property
    def free_bytes(self) -> int:
        return self.gpu.total_bytes - self.requested_bytes - self.outside_bytes - self.reserve_bytes


@dataclass(frozen=True)
class Plan:
    request: Request
    status: str
    gap: float
    solve_seconds: float
    stages: tuple[StagePlan, ...]
    gpus: tuple[GpuPlan, ...]

    @property
    def min_kv_requests(self) -> float:
        """The objective: the smallest KV capacity over KV stages, in max-length requests."""
        values = [s.max_concurrency for s in self.stages if s.stage.has_kv_cache]
        return min(values) if values else 0.0


def build_problem(request: Request) -> tuple[Problem, dict[str, StageKnobs]]:
    """Turn a request into the plain-number Problem the solvers read."""
    pipeline, gpus = request.pipeline, request.gpus
    knobs = resolve_knobs(
        pipeline,
        request.schema,
        max_model_len=request.max_model_len,
        max_num_seqs=request.max_num_seqs,
        max_num_batched_tokens=request.max_num_batched_tokens,
        enforce_eager=request.enforce_eager,
        kv_cache_dtype=request.kv_cache_dtype,
    )
    stages = []
    for st in pipeline.stages:
        pinned_tp = request.tp.get(st.name)
        pinned_devices = request.devices.get(st.name)
        if pinned_devices is not None:
            pinned_devices = _check_devices(st, pinned_devices, pinned_tp, len(gpus))
            pinned_tp = len(pinned_devices)
        if pinned_tp is not None:
            _check_tp(st, pinned_tp, len(gpus))
        options = tuple(
            TpOption(tp=d, memory=stage_memory(st, d, knobs[st.name], request.version))
            for d in st.tp_degrees
            if d <= len(gpus)
        )
        if not options:
            raise InputError(
                f"{st.name} needs tensor_parallel_size {st.tp_degrees[0]} but only {len(gpus)} GPU(s) were given"
            )
        stages.append(
            StageProblem(
                stage_id=st.stage_id,
                name=st.name,
                has_kv=st.has_kv_cache,
                options=options,
                max_model_len=knobs[st.name].max_model_len,
                min_requests=request.min_concurrency.get(st.name, 1),
                weight_pct=round(100 * request.weight.get(st.name, 1.0)),
                pinned_tp=pinned_tp,
                pinned_devices=pinned_devices,
            )
        )
    index = {st.name: i for i, st in enumerate(pipeline.stages)}
    groups = tuple(tuple(index[name] for name in group) for group in request.exclusive)
    reserve = F.ADMISSION_EXTERNAL_RESERVE_BYTES + F.ADMISSION_SAFETY_MARGIN_BYTES + request.buffer_bytes
    problem = Problem(
        gpus=tuple(gpus),
        stages=tuple(stages),
        resolution=request.resolution,
        reserve_bytes=reserve,
        exclusive_groups=groups,
    )
    return problem, knobs


def _check_tp(st: StageSpec, tp: int, num_gpus: int) -> None:
    heads = st.transformer.num_heads
    allowed = ", ".join(map(str, st.tp_degrees))
    if heads % tp:
        raise InputError(f"--tp {st.name}={tp}: {tp} does not divide the {heads} attention heads of {st.name} (allowed: {allowed})")
    if tp not in st.tp_degrees:
        raise InputError(f"--tp {st.name}={tp}: not allowed for {st.name} (allowed: {allowed})")
    if tp > num_gpus:
        raise InputError(f"{st.name} needs tensor_parallel_size {tp} but only {num_gpus} GPU(s) were given")


def _check_devices(st: StageSpec, devices: tuple[int, ...], tp: int | None, num_gpus: int) -> tuple[int, ...]:
    shown = ",".join(map(str, devices))
    if not devices or len(set(devices)) != len(devices):
        raise InputError(f"--devices {st.name}={shown}: list distinct GPU indices")
    if any(not 0 <= d < num_gpus for d in devices):
        raise InputError(f"--devices {st.name}={shown}: only GPUs 0..{num_gpus - 1} were given")
    if tp is not None and tp != len(devices):
        raise InputError(f"{st.name}: tensor_parallel_size {tp} but {len(devices)} device(s) {shown}")
    return tuple(sorted(devices))


def assemble(
    request: Request,
    problem: Problem,
    knobs: dict[str, StageKnobs],
    assignments: tuple[cpsat.StageAssignment, ...],
    *,
    status: str,
    gap: float = 0.0,
    solve_seconds: float = 0.0,
) -> Plan:
    """Compute every reported figure from the decisions (devices, TP, fraction), in bytes."""
    stage_plans = []
    for st, sp, a in zip(request.pipeline.stages, problem.stages, assignments):
        option = sp.options[a.option_index]
        per_gpu = {
            g: requested_bytes(problem.gpus[g].total_bytes, a.util_steps, problem.resolution)
            - option.memory.inside_bytes
            for g in a.gpus
        }
        kv = min(per_gpu.values()) if st.has_kv_cache else 0
        stage_plans.append(
            StagePlan(
                stage=st,
                devices=a.gpus,
                tensor_parallel_size=option.tp,
                util_steps=a.util_steps,
                resolution=problem.resolution,
                knobs=knobs[st.name],
                memory=option.memory,
                kv_cache_bytes=kv,
                kv_cache_tokens=kv_tokens(kv, option.memory.kv_bytes_per_token),
                kv_bytes_per_gpu=per_gpu if st.has_kv_cache else {},
                start=a.start,
            )
        )
    return Plan(
        request=request,
        status=status,
        gap=gap,
        solve_seconds=solve_seconds,
        stages=tuple(stage_plans),
        gpus=gpu_maps(problem, stage_plans),
    )


def gpu_maps(problem: Problem, stage_plans: list[StagePlan]) -> tuple[GpuPlan, ...]:
    """Per-GPU memory maps: requested and outside bytes of the stages on each GPU, in the
    time slot that uses the most (all stages when none is exclusive)."""
    out = []
    for g, gpu in enumerate(problem.gpus):
        def used(sps):
            requested = sum(requested_bytes(gpu.total_bytes, sp.util_steps, sp.resolution) for sp in sps)
            return requested, sum(sp.memory.outside_bytes for sp in sps)

        worst = max(resident_sets(stage_plans, g), key=lambda sps: sum(used(sps)))
        requested, outside = used(worst)
        out.append(
            GpuPlan(
                gpu=gpu,
                stages=tuple(sp.stage.name for sp in stage_plans if g in sp.devices),
                requested_bytes=requested,
                outside_bytes=outside,
                reserve_bytes=problem.reserve_bytes,
            )
        )
    return tuple(out)


def plan(request: Request, on_solve: Callable[[Problem], None] | None = None) -> Plan:
    """The best plan for `request`, or NoPlanError saying which stage and GPU cannot fit.

    `on_solve` is called once the inputs are validated, just before the solver starts
    (the CLI prints its progress line there).
    """
    problem, knobs = build_problem(request)
    if on_solve is not None:
        on_solve(problem)
    solution = cpsat.solve(problem, request.time_limit_s)
    if solution.status is cpsat.SolveStatus.INFEASIBLE:
        core, lines = explain.reasons(problem)
        raise NoPlanError(
            f"no plan fits {request.pipeline.name} on {len(request.gpus)} GPU(s) ({', '.join(g.name for g in request.gpus)})",
            lines,
            conflict=[r.as_dict() for r in core],
        )
    if solution.status is cpsat.SolveStatus.UNKNOWN:
        raise NoPlanError(
            f"no plan found within the time limit ({request.time_limit_s:g} s)",
            ["raise --time-limit, or fix TP degrees with --tp to shrink the search"],
        )
    result = assemble(
        request,
        problem,
        knobs,
        solution.assignments,
        status=solution.status.value,
        gap=solution.gap,
        solve_seconds=solution.solve_seconds,
    )
    problems = check_plan(problem, result)
    if problems:  # the model and the re-check disagree: a bug, never a plan to ship
        raise RuntimeError("internal error: plan fails the independent re-check: " + "; ".join(problems))
    return result


@dataclass(frozen=True)
class Placement:
    """A stage's placement as a config file states it."""

    devices: tuple[int, ...]
    tensor_parallel_size: int
    gpu_memory_utilization: float


EVALUATION_RESOLUTION = 1000  # fractions in hand-written configs have up to 3 decimals


def evaluate(request: Request, placements: dict[str, Placement]) -> tuple[Plan, list[str]]:
    """A given placement (e.g. a bundled config) under the same memory model as `plan`.

    Returns the plan with every figure computed, and the rules it breaks (empty when it
    would start and meet the same constraints a computed plan meets).
    """
    missing = [st.name for st in request.pipeline.stages if st.name not in placements]
    if missing:
        raise InputError(f"no placement given for stage(s) {', '.join(missing)}")
    fixed = replace(
        request,
        tp={name: p.tensor_parallel_size for name, p in placements.items()},
        devices={name: p.devices for name, p in placements.items()},
        resolution=EVALUATION_RESOLUTION,
    )
    problem, knobs = build_problem(fixed)
    assignments = []
    for st, sp in zip(fixed.pipeline.stages, problem.stages):
        p = placements[st.name]
        steps = round(p.gpu_memory_utilization * EVALUATION_RESOLUTION)
        if abs(steps - p.gpu_memory_utilization * EVALUATION_RESOLUTION) > 1e-6:
            raise InputError(f"{st.name}: gpu_memory_utilization {p.gpu_memory_utilization} has more than 3 decimals")
        option = sp.option_index(sp.pinned_tp)
        assignments.append(cpsat.StageAssignment(option, sp.pinned_devices, steps, 0, 0, None))
    result = assemble(fixed, problem, knobs, tuple(assignments), status="given")
    return result, check_plan(problem, result)





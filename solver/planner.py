"""The library's entry point: `plan(request) -> Plan`.

request -> memory model per stage and TP degree -> Problem -> CP-SAT -> Plan, then an
independent re-check of every GPU's sums (`verify`) before the plan is returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from . import cpsat, vllm_facts as F
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
    tokens_needed,
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
    max_model_len: dict[str, int] = field(default_factory=dict)
    max_num_seqs: dict[str, int] = field(default_factory=dict)
    max_num_batched_tokens: dict[str, int] = field(default_factory=dict)
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
        kv_cache_dtype=request.kv_cache_dtype,
    )
    stages = []
    for st in pipeline.stages:
        degrees = [request.tp[st.name]] if st.name in request.tp else st.tp_degrees
        for d in degrees:
            heads = st.transformer.num_heads
            if heads % d:
                raise InputError(
                    f"--tp {st.name}={d}: {d} does not divide the {heads} attention heads of {st.name} "
                    f"(allowed: {', '.join(map(str, st.tp_degrees))})"
                )
            if d not in st.tp_degrees:
                raise InputError(
                    f"--tp {st.name}={d}: not allowed for {st.name} (allowed: {', '.join(map(str, st.tp_degrees))})"
                )
        fitting = [d for d in degrees if d <= len(gpus)]
        if not fitting:
            raise InputError(
                f"{st.name} needs tensor_parallel_size {degrees[0]} but only {len(gpus)} GPU(s) were given"
            )
        options = tuple(TpOption(tp=d, memory=stage_memory(st, d, knobs[st.name], request.version)) for d in fitting)
        stages.append(
            StageProblem(
                stage_id=st.stage_id,
                name=st.name,
                has_kv=st.has_kv_cache,
                options=options,
                max_model_len=knobs[st.name].max_model_len,
                min_requests=request.min_concurrency.get(st.name, 1),
                weight_pct=round(100 * request.weight.get(st.name, 1.0)),
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
        raise NoPlanError(
            f"no plan fits {request.pipeline.name} on {_describe_gpus(request.gpus)}",
            explain_infeasible(problem),
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
    tp = {name: p.tensor_parallel_size for name, p in placements.items()}
    missing = [st.name for st in request.pipeline.stages if st.name not in placements]
    if missing:
        raise InputError(f"no placement given for stage(s) {', '.join(missing)}")
    fixed = replace(request, tp={**request.tp, **tp}, resolution=EVALUATION_RESOLUTION)
    problem, knobs = build_problem(fixed)
    assignments = []
    for st in fixed.pipeline.stages:
        p = placements[st.name]
        steps = round(p.gpu_memory_utilization * EVALUATION_RESOLUTION)
        if abs(steps - p.gpu_memory_utilization * EVALUATION_RESOLUTION) > 1e-6:
            raise InputError(f"{st.name}: gpu_memory_utilization {p.gpu_memory_utilization} has more than 3 decimals")
        assignments.append(cpsat.StageAssignment(0, tuple(sorted(p.devices)), steps, 0, 0, None))
    result = assemble(fixed, problem, knobs, tuple(assignments), status="given")
    return result, check_plan(problem, result)


def _describe_gpus(gpus: tuple[Gpu, ...]) -> str:
    names: dict[str, int] = {}
    for gpu in gpus:
        names[gpu.name] = names.get(gpu.name, 0) + 1
    return ",".join(f"{n}x{name}" for name, n in names.items())


def _gib(nbytes: float) -> str:
    return f"{nbytes / GiB:.2f} GiB"


def explain_infeasible(problem: Problem) -> list[str]:
    """Which stage cannot fit on which GPU, and by how much.

    First each stage alone, at its most frugal TP option, on the largest GPUs; then, when
    every stage fits alone, the total they need against what the GPUs offer.
    """
    reasons: list[str] = []
    R = problem.resolution
    best_total = 0
    for st in problem.stages:
        best_short, best_line, best_need = None, "", None
        for opt in st.options:
            need_per_rank = opt.memory.inside_bytes + st.min_kv_bytes(opt)
            ranked = sorted(problem.gpus, key=lambda g: (-g.total_bytes, g.index))[: opt.tp]
            worst = ranked[-1]
            # The fraction is a whole number of steps, so round the need up to one.
            steps = -(-need_per_rank * R // worst.total_bytes)
            requested = requested_bytes(worst.total_bytes, steps, R)
            footprint = requested + opt.memory.outside_bytes
            short = footprint - problem.usable_bytes(worst)
            total = footprint * opt.tp
            if best_need is None or total < best_need:
                best_need = total
            if best_short is None or short < best_short:
                best_short = short
                kv_part = (
                    f", KV for {st.min_requests} request(s) of {st.max_model_len} tokens {_gib(st.min_kv_bytes(opt))}"
                    if st.has_kv
                    else ""
                )
                best_line = (
                    f"{st.name} at TP={opt.tp} needs {_gib(footprint)} per GPU (weights "
                    f"{_gib(opt.memory.weights_bytes)}, activations {_gib(opt.memory.activation_bytes)}{kv_part}, "
                    f"overheads {_gib(opt.memory.overhead_bytes)}) but GPU {worst.index} ({worst.name}) offers "
                    f"{_gib(problem.usable_bytes(worst))} after reserves: short by {_gib(short)}"
                )
        best_total += best_need or 0
        if best_short is not None and best_short > 0:
            reasons.append(best_line)
    if not reasons:
        usable = sum(problem.usable_bytes(g) for g in problem.gpus)
        reasons.append(
            f"each stage fits alone, but together they need at least {_gib(best_total)} against "
            f"{_gib(usable)} usable on {len(problem.gpus)} GPU(s): short by {_gib(max(0, best_total - usable))} "
            f"or more, since a stage cannot be split across GPUs beyond its TP degree"
        )
        if problem.exclusive_groups:
            reasons.append("exclusive groups were taken into account")
    return reasons

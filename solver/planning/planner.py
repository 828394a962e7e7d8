"""The library's entry point: `plan(request) -> Plan`.

request -> memory model per stage and TP degree -> Problem -> CP-SAT -> Plan, then the
start-up model (`startup.simulate`, the one `check` uses) re-checks the plan in bytes
before it is returned.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from ..defaults import HOST_PATTERN_ABOVE_GPUS
from ..errors import InputError, NoPlanError
from ..inputs.catalog import StageSpec
from ..memory.stage_memory import (
    StageKnobs,
    resolve_knobs,
    stage_memory,
)
from ..opt import cpsat, explain
from ..opt.problem import Problem, StageProblem, TpOption
from ..startup.engine_checks import bf16_refusal, stage_knob_errors
from ..startup.launch import calibrated, exclusive_indices, launch, stage_run
from ..startup.simulation import GpuOutcome, StageOutcome, StageRun, StartupReport
from ..vllm.facts import OmniVersion
from .knobs import KnobChange, changes as knob_changes, choose as choose_knobs
from .request import Request


@dataclass(frozen=True)
class StagePlan:
    """One stage of a plan: its launch (the start-up model's StageRun: devices, TP, fraction,
    knobs, memory terms, replicas) and what the start-up model gives it. Byte figures are per
    TP rank; KV is the smallest over ranks."""

    stage: StageSpec
    run: StageRun
    kv_cache_bytes: int
    kv_cache_tokens: int
    kv_bytes_per_gpu: dict[int, int]
    headroom_cap: int | None  # requests beyond which KV is no headroom (None: no cap)
    replica_kv_tokens: tuple[int, ...] = ()

    devices = property(lambda self: self.run.devices)  # the pool: replica r takes a slice of TP of them
    tensor_parallel_size = property(lambda self: self.run.tensor_parallel_size)
    util_steps = property(lambda self: self.run.util_steps)
    resolution = property(lambda self: self.run.resolution)
    knobs = property(lambda self: self.run.knobs)
    memory = property(lambda self: self.run.memory)
    num_replicas = property(lambda self: self.run.replicas)
    gpu_memory_utilization = property(lambda self: self.run.gpu_memory_utilization)

    def replica_devices(self) -> tuple[tuple[int, ...], ...]:
        return self.run.replica_devices()

    def replica_headroom(self) -> tuple[float, ...]:
        """Each replica's counted headroom (capped at max_num_seqs without prefix caching)."""
        if not self.stage.has_kv_cache:
            return tuple(0.0 for _ in range(self.num_replicas))
        values = [t / self.knobs.max_model_len for t in (self.replica_kv_tokens or (self.kv_cache_tokens,))]
        return tuple(v if self.headroom_cap is None else min(v, float(self.headroom_cap)) for v in values)

    @property
    def max_concurrency(self) -> float:
        """Requests of max_model_len the KV caches of all replicas hold (each replica's vLLM
        prints its own "Maximum concurrency")."""
        if not self.stage.has_kv_cache:
            return 0.0
        return sum(self.replica_kv_tokens or (self.kv_cache_tokens,)) / self.knobs.max_model_len

    @property
    def headroom(self) -> float:
        """The capacity the objective counts: over all replicas, each capped at max_num_seqs
        requests when KV beyond them can hold nothing (prefix caching off)."""
        return sum(self.replica_headroom())


@dataclass(frozen=True)
class Plan:
    request: Request
    status: str  # "optimal" or "feasible"
    gap: float
    solve_seconds: float
    stages: tuple[StagePlan, ...]
    gpus: tuple[GpuOutcome, ...]
    notes: tuple[str, ...] = ()  # solver phases that did not finish
    option_notes: tuple[str, ...] = ()  # global options a stage does not take
    # the knobs the planner lowered (the bundled values left no plan: knobs.py); `request`
    # then names them, and `asked` is the request as the user gave it
    knobs_lowered: tuple[KnobChange, ...] = ()
    asked: Request | None = None
    rate: object | None = None  # --target-rate: planning/rate.py's RatePlan (None: a plan for memory alone)

    @property
    def min_kv_requests(self) -> float:
        """The objective: the smallest counted headroom over KV stages, in max-length requests."""
        values = [s.headroom for s in self.stages if s.stage.has_kv_cache]
        return min(values) if values else 0.0


def untested_tp_degrees(st: StageSpec, version: OmniVersion) -> list[int]:
    """TP degrees the stage allows but no upstream config or test of `version` runs."""
    tested = st.tested_tp_degrees(version.name)
    return [d for d in st.tp_degrees if d not in tested]


def allowed_tp_degrees(st: StageSpec, request: Request) -> list[int]:
    if request.allow_untested_tp:
        return list(st.tp_degrees)
    return [d for d in st.tp_degrees if d in st.tested_tp_degrees(request.version.name)]


GLOBAL_OPTIONS = ("max_model_len", "max_num_seqs", "max_num_batched_tokens")


def resolve_request_knobs(request: Request) -> tuple[dict[str, StageKnobs], tuple[str, ...]]:
    """Per-stage knobs of a request, and notes on global options that skip a stage.

    A per-stage value is the user's word: one that vLLM refuses is an input error with
    vLLM's message. A global value applies to each stage that accepts it; it is an input
    error only when no stage does."""
    pipeline, schema, version = request.pipeline, request.schema, request.version
    explicit = {"max_model_len": request.max_model_len, "max_num_seqs": request.max_num_seqs,
                "max_num_batched_tokens": request.max_num_batched_tokens}
    base = resolve_knobs(pipeline, schema, version, **explicit, enforce_eager=request.enforce_eager,
                         kv_cache_dtype=request.kv_cache_dtype, dtype=request.dtype,
                         quantization=request.quantization, check=False)
    notes: list[str] = []
    applied: dict[str, list[str]] = {opt: [] for opt in request.global_values}
    refusals: dict[str, list[str]] = {opt: [] for opt in request.global_values}
    out = {}
    for st in pipeline.stages:
        k = base[st.name]
        for opt in GLOBAL_OPTIONS:
            if opt not in request.global_values or st.name in explicit[opt]:
                continue
            if opt == "max_model_len" and not st.has_kv_cache:
                refusals[opt].append(f"{st.name} holds no KV cache")
                continue  # a stage without KV cache has no max_model_len of its own
            trial = replace(k, **{opt: request.global_values[opt]})
            errors = stage_knob_errors(pipeline, st, trial, schema, version)
            if errors:
                flag = "--" + opt.replace("_", "-")
                notes.append(f"{flag} {request.global_values[opt]} not applied to {st.name}: {errors[0]}")
                refusals[opt].append(f"{st.name}: {errors[0]}")
            else:
                k = trial
                applied[opt].append(st.name)
        errors = stage_knob_errors(pipeline, st, k, schema, version)
        if errors:
            raise InputError(f"{st.name}: this stage cannot take these settings: {errors[0]}")
        out[st.name] = k
    for opt, stages in applied.items():
        if not stages:
            flag = "--" + opt.replace("_", "-")
            raise InputError(f"{flag} {request.global_values[opt]} suits no stage: " + "; ".join(refusals[opt]))
    return out, tuple(notes)


def build_problem(request: Request) -> tuple[Problem, dict[str, StageKnobs]]:
    """Turn a request into the plain-number Problem the solvers read."""
    pipeline, gpus = request.pipeline, request.gpus
    refusal = bf16_refusal(pipeline, gpus, request.schema)
    if refusal is not None:
        raise InputError(refusal)
    knobs, _ = resolve_request_knobs(request)
    stages = []
    for st in pipeline.stages:
        allowed = allowed_tp_degrees(st, request)
        pinned_tp = request.tp.get(st.name)
        pinned_devices = request.devices.get(st.name)
        if pinned_devices is not None:
            pinned_devices = _check_devices(st, pinned_devices, pinned_tp, len(gpus))
            pinned_tp = len(pinned_devices)
        if pinned_tp is not None:
            _check_tp(st, pinned_tp, len(gpus), allowed, request.version)
        options = tuple(
            TpOption(tp=d, memory=calibrated(request.calibration, pipeline, st.name, d,
                                            stage_memory(st, d, knobs[st.name], request.version)))
            for d in allowed
            if d <= len(gpus)
        )
        if not options:
            raise InputError(
                f"{st.name} needs tensor_parallel_size {allowed[0]} but only {len(gpus)} GPU(s) were given"
            )
        cap = None
        if st.has_kv_cache and not pipeline.prefix_caching(st, request.schema):
            cap = knobs[st.name].max_num_seqs
        max_replicas, fixed = _replica_range(request, st, options, pinned_devices, pinned_tp)
        stages.append(
            StageProblem(
                stage_id=st.stage_id,
                name=st.name,
                has_kv=st.has_kv_cache,
                options=options,
                max_model_len=knobs[st.name].max_model_len,
                min_requests=st.min_requests(knobs[st.name].max_num_seqs, request.min_concurrency.get(st.name)),
                weight_pct=round(100 * request.weight.get(st.name, 1.0)),
                pinned_tp=pinned_tp,
                pinned_devices=pinned_devices,
                headroom_cap_requests=cap,
                max_replicas=max_replicas,
                fixed_replicas=fixed,
            )
        )
    problem = Problem(
        gpus=tuple(gpus),
        stages=tuple(stages),
        resolution=request.resolution,
        reserve_bytes=request.margin_bytes,
        exclusive_groups=exclusive_indices(pipeline, request.exclusive),
        shared_gpus=len({g.node for g in request.gpus}) == 1,
        frontend_bytes=request.pipeline.frontend_gpu_bytes,
        merge_hosts=len(gpus) > HOST_PATTERN_ABOVE_GPUS,  # identical hosts as one type (opt/hosts.py)
    )
    return problem, knobs


def _replica_range(request: Request, st: StageSpec, options, pinned_devices, pinned_tp) -> tuple[int, int | None]:
    """(max_replicas, fixed_replicas) of a stage for the request's --replicas."""
    mode = request.replicas or ("auto" if request.version.has_replicas else "1")
    if mode == "1":
        return 1, None
    if not request.version.has_replicas:
        raise InputError(
            f"--replicas {mode}: vLLM-Omni {request.version.name} has no per-stage replicas (num_replicas is read "
            "from 0.20); run separate pipelines on separate GPUs and ports instead, with a load balancer in front")
    if pinned_devices is not None:  # --devices pins one replica to those GPUs
        if mode not in ("auto", "1"):
            raise InputError(f"--replicas {mode} with --devices {st.name}=...: a pinned stage runs one replica on "
                             "its devices (their count is its TP degree); drop one of the two")
        return 1, None
    if mode == "auto":
        smallest = min(o.tp for o in options)
        return max(1, len(request.gpus) // smallest), None
    return int(mode), int(mode)


def _check_tp(st: StageSpec, tp: int, num_gpus: int, allowed: list[int], version: OmniVersion) -> None:
    heads = st.transformer.num_heads
    shown = ", ".join(map(str, allowed))
    if heads % tp:
        raise InputError(f"--tp {st.name}={tp}: {tp} does not divide the {heads} attention heads of {st.name} (allowed: {shown})")
    if tp in st.tp_degrees and tp not in allowed:
        raise InputError(
            f"--tp {st.name}={tp}: no vLLM-Omni {version.name} config or test runs {st.name} at TP={tp} "
            f"(tested: {shown}); --allow-untested-tp permits it"
        )
    if tp not in allowed:
        raise InputError(f"--tp {st.name}={tp}: not allowed for {st.name} (allowed: {shown})")
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


def stage_runs(request: Request, problem: Problem, knobs: dict[str, StageKnobs],
               assignments: tuple[cpsat.StageAssignment, ...]) -> list[StageRun]:
    """The plan's decisions as the start-up model reads them."""
    runs = []
    for st, sp, a in zip(request.pipeline.stages, problem.stages, assignments):
        option = sp.options[a.option_index]
        runs.append(stage_run(st, request.version, a.gpus, option.tp, a.util_steps, problem.resolution,
                              knobs[st.name], option.memory, replicas=a.replicas))
    if request.pin_kv:  # the pinned figure is the KV the fraction gives: the same start-up
        report = startup_report(request, runs)
        runs = [replace(r, kv_pinned_bytes=o.kv_cache_bytes) if r.has_kv else r for r, o in zip(runs, report.stages)]
    return runs


def startup_report(request: Request, runs: list[StageRun]) -> StartupReport:
    """The start-up model on a plan: vLLM-Omni's capping, the admission rule, the margin."""
    return launch(request.pipeline, runs, request.gpus, upstream=False, parallel_init=True,
                  buffer_bytes=request.buffer_bytes, exclusive=request.exclusive)


def stage_plan(st: StageSpec, sp: StageProblem, run: StageRun, outcome: StageOutcome) -> StagePlan:
    """A stage's plan from its launch and what the start-up model gave it."""
    per_gpu = {d: b - run.memory.inside_bytes for d, b in sorted(outcome.budget_bytes_per_gpu.items())}
    return StagePlan(st, run, outcome.kv_cache_bytes, outcome.kv_cache_tokens, per_gpu if st.has_kv_cache else {},
                     sp.headroom_cap_requests, outcome.replica_kv_tokens)


def assemble(request: Request, problem: Problem, knobs: dict[str, StageKnobs], solution: cpsat.Solution) -> Plan:
    """Every reported figure from the decisions (devices, TP, fraction), in bytes, through
    the start-up model; a plan it finds any problem with is a bug, never a plan to ship."""
    runs = stage_runs(request, problem, knobs, solution.assignments)
    report = startup_report(request, runs)
    if report.problems:
        raise RuntimeError("plan fails the start-up model: " + "; ".join(p.message for p in report.problems))
    stage_plans = tuple(stage_plan(st, sp, run, outcome)
                        for st, sp, run, outcome in zip(request.pipeline.stages, problem.stages, runs, report.stages))
    return Plan(
        request=request,
        status=solution.status.value,
        gap=solution.gap,
        solve_seconds=solution.solve_seconds,
        stages=stage_plans,
        gpus=report.gpus,
        notes=solution.notes,
        option_notes=resolve_request_knobs(request)[1],
    )


def no_plan_error(request: Request, problem: Problem) -> NoPlanError:
    """The proven-infeasible outcome, with the conflict in words (within the time limit)."""
    core, lines = explain.reasons(problem, request.time_limit_s)
    gpus = ", ".join(g.name for g in request.gpus)
    return NoPlanError(f"no plan fits {request.pipeline.name} on {len(request.gpus)} GPU(s) ({gpus})",
                       lines, conflict=[r.as_dict() for r in core], status="infeasible")


def plan(request: Request, on_solve: Callable[[Problem], None] | None = None) -> Plan:
    """The best plan for `request`, or NoPlanError: proven infeasible (with the conflict)
    or unknown (the time limit came before any plan).

    `on_solve` is called once the inputs are validated, just before the solver starts
    (the CLI prints its progress line there).
    """
    problem, knobs = build_problem(request)
    if on_solve is not None:
        on_solve(problem)
    solution = cpsat.solve(problem, request.time_limit_s, request.workers)
    if solution.status is cpsat.SolveStatus.INFEASIBLE:
        choice = choose_knobs(request, build_problem)  # the bundled knobs leave no plan: lower some
        if choice.request is None:
            error = no_plan_error(request, problem)
            error.reasons += choice.reasons
            raise error
        lowered = plan(choice.request)
        tp = {sp.stage.name: sp.tensor_parallel_size for sp in lowered.stages}
        return replace(lowered, knobs_lowered=knob_changes(choice, build_problem, tp), asked=request,
                       notes=lowered.notes + choice.notes, status="feasible" if choice.notes else lowered.status)
    if solution.status is cpsat.SolveStatus.UNKNOWN:
        raise time_limit_error(request)
    return assemble(request, problem, knobs, solution)


def time_limit_error(request: Request) -> NoPlanError:
    """The outcome where the time limit came before any plan: nothing proven either way."""
    return NoPlanError(
        f"no plan found within the time limit ({request.time_limit_s:g} s); nothing was proven either way",
        ["raise --time-limit (or pin TP degrees with --tp to shrink the search)"],
        status="unknown",
    )

"""Planning for a request rate (--target-rate): replicas and GPUs sized by a performance profile.

Each stage's replicas >= ceil(R x demand / capacity at the targets), where capacity is the
highest rate the profile's entry sustains at the latency targets (inputs/perf_profile.py)
and demand is 1 (the profile's workload; a request of another workload is extrapolation).
A pipeline-unit entry (the whole measured layout as one unit) needs ceil(R / capacity)
units, i.e. that many times each stage's replicas in its layout; a stage entry sizes that
stage alone. The minimum goes into the CP-SAT model (StageProblem.min_replicas) beside the
memory constraints. Without a GPU count (`--gpus H100-80GB`) the count is searched upward
from a counting bound, each count below the chosen one proven infeasible by CP-SAT.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from ..errors import InputError, NoPlanError
from ..inputs.gpus import lookup_gpu, parse_gpus
from ..inputs.perf_profile import PIPELINE_UNIT, Entry, Profile
from ..opt import cpsat
from .planner import Plan, assemble, build_problem, no_plan_error, time_limit_error
from .request import Request

MAX_SEARCH = 256  # GPUs the upward search tries beyond its counting bound


@dataclass(frozen=True)
class RateTarget:
    rate: float  # requests/s
    profile: Profile
    profile_name: str  # the file, or the shipped example's name
    ttfp_p50_ms: float | None = None
    rtf: float | None = None


@dataclass(frozen=True)
class StageRate:
    stage: str
    entry: Entry
    per_replica: float  # requests/s one replica sustains (a pipeline unit's rate / its replicas)
    min_replicas: int
    replicas: int = 0  # planned
    concurrency: int | None = None  # the profile point that set the capacity

    @property
    def capacity(self) -> float:
        return self.per_replica * self.replicas

    def utilisation(self, rate: float) -> float:
        return rate / self.capacity if self.capacity else math.inf


@dataclass(frozen=True)
class RatePlan:
    """What the plan says about the rate: the header's lines and the JSON's `rate` key."""

    target: RateTarget
    stages: tuple[StageRate, ...]
    serves: bool
    search: str  # how the GPU count was chosen, in words
    extrapolated: tuple[str, ...]
    assumptions: tuple[str, ...]

    def as_dict(self) -> dict:
        t = self.target
        return {
            "target_rate": t.rate, "ttfp_p50_ms": t.ttfp_p50_ms, "rtf": t.rtf, "profile": t.profile_name,
            "serves": self.serves, "gpu_search": self.search,
            "extrapolated": bool(self.extrapolated), "extrapolated_reasons": list(self.extrapolated),
            "assumptions": list(self.assumptions),
            "stages": [{"stage": s.stage, "unit": s.entry.unit, "gpu": s.entry.gpu, "labels": list(s.entry.labels),
                        "replicas": s.replicas, "min_replicas": s.min_replicas,
                        "requests_per_s_per_replica": round(s.per_replica, 4),
                        "capacity_requests_per_s": round(s.capacity, 4),
                        "utilisation": round(s.utilisation(t.rate), 4), "profile_concurrency": s.concurrency}
                       for s in self.stages],
        }


def gpu_type_only(text: str) -> str | None:
    """The GPU type of `--gpus H100-80GB` (a type without a count), else None."""
    if not text or re.search(r"[,;=]|^\s*[0-9]+\s*[xX*]", text) or text.strip() == "local":
        return None
    return lookup_gpu(text.strip()).name


def _entries(request: Request, target: RateTarget) -> list[Entry]:
    name = request.pipeline.name
    entries = target.profile.for_pipeline(name)
    if not entries:
        raise InputError(f"profile {target.profile_name}: no entry for pipeline {name} "
                         f"(it has {', '.join(sorted({e.pipeline for e in target.profile.entries}))})")
    gpu = request.gpus[0].name
    stages = {st.name for st in request.pipeline.stages}
    per_stage = [e for e in entries if e.unit != PIPELINE_UNIT]
    chosen = per_stage or [e for e in entries if e.unit == PIPELINE_UNIT]
    best: dict[str, Entry] = {}
    for e in chosen:  # one entry per unit: the one on the plan's GPU where there is one
        if e.unit != PIPELINE_UNIT and e.unit not in stages:
            raise InputError(f"profile {target.profile_name}: {e.unit!r} is no stage of {name}")
        if e.unit not in best or (best[e.unit].gpu != gpu and e.gpu == gpu):
            best[e.unit] = e
    return list(best.values())


def stage_minimums(request: Request, target: RateTarget) -> list[StageRate]:
    """Each profiled stage's fewest replicas for the target rate."""
    out = []
    for e in _entries(request, target):
        found = e.capacity(target.ttfp_p50_ms, target.rtf)
        if found is None:
            raise InputError(f"profile {target.profile_name}: no measured point of {e.pipeline} ({e.unit}) meets "
                             f"the targets ({_targets_text(target)})")
        rate, point = found
        if e.unit == PIPELINE_UNIT:
            units = math.ceil(target.rate / rate - 1e-9)
            for name, placed in e.layout.stages.items():
                out.append(StageRate(name, e, rate / placed.replicas, units * placed.replicas,
                                     concurrency=point.concurrency))
        else:
            out.append(StageRate(e.unit, e, rate, math.ceil(target.rate / rate - 1e-9), concurrency=point.concurrency))
    return out


def _targets_text(target: RateTarget) -> str:
    parts = [f"TTFP p50 <= {target.ttfp_p50_ms:g} ms" if target.ttfp_p50_ms is not None else "",
             f"RTF <= {target.rtf:g}" if target.rtf is not None else "RTF <= 1 where measured"]
    return ", ".join(p for p in parts if p)


def _with_rate(request: Request, rates: list[StageRate]):
    """The request's Problem with each profiled stage's minimum replicas and the profile's
    TP; one stage per GPU where every profiled layout gave each stage GPUs of its own."""
    tp = dict(request.tp)
    for r in rates:
        placed = r.entry.layout.stages.get(r.stage)
        tp.setdefault(r.stage, placed.tp if placed else r.entry.tp)
    req = replace(request, tp=tp)
    problem, knobs = build_problem(req)
    mins = {r.stage: r.min_replicas for r in rates}
    stages = tuple(replace(sp, min_replicas=mins.get(sp.name, 1)) for sp in problem.stages)
    shared = problem.shared_gpus and any(r.entry.layout.shares_gpus for r in rates)
    return req, replace(problem, stages=stages, shared_gpus=shared), knobs


def _counting_bound(request: Request, rates: list[StageRate]) -> int:
    tp = {r.stage: (r.entry.layout.stages[r.stage].tp if r.stage in r.entry.layout.stages else r.entry.tp)
          for r in rates}
    need = [r.min_replicas * tp[r.stage] for r in rates]
    shared = any(r.entry.layout.shares_gpus for r in rates)
    return max(1, max(need) if shared else sum(need) + (len(request.pipeline.stages) - len(rates)))


def plan_for_rate(request: Request, target: RateTarget, gpu_type: str | None = None, on_solve=None) -> Plan:
    """The plan for `request` serving `target`; with `gpu_type`, on the fewest GPUs of it."""
    if target.rate <= 0:
        raise InputError(f"--target-rate {target.rate:g}: must be above 0 requests/s")
    if not request.version.has_replicas:
        raise InputError(f"--target-rate: vLLM-Omni {request.version.name} has no per-stage replicas (0.20+)")
    rates = stage_minimums(request, target)
    search = f"the {len(request.gpus)} GPU(s) given"
    if gpu_type is not None:
        request, search = _search(request, rates, gpu_type, on_solve)
    req, problem, knobs = _with_rate(request, rates)
    if on_solve is not None:
        on_solve(problem)
    solution = cpsat.solve(problem, req.time_limit_s, req.workers)
    serves = True
    if solution.status is cpsat.SolveStatus.INFEASIBLE and gpu_type is None:
        serves = False  # these GPUs cannot: plan them for memory alone and say by how much they fall short
        req, problem, knobs = _with_rate(request, [replace(r, min_replicas=1) for r in rates])
        solution = cpsat.solve(problem, req.time_limit_s, req.workers)
    if solution.status is cpsat.SolveStatus.INFEASIBLE:
        raise no_plan_error(req, problem)
    if solution.status is cpsat.SolveStatus.UNKNOWN:
        raise time_limit_error(req)
    plan = assemble(req, problem, knobs, solution)
    planned = {sp.stage.name: sp.num_replicas for sp in plan.stages}
    rates = [replace(r, replicas=planned[r.stage]) for r in rates]
    serves = serves and all(r.utilisation(target.rate) <= 1 + 1e-9 for r in rates)
    info = RatePlan(target, tuple(rates), serves, search, _extrapolated(req, plan, rates), _assumptions(rates))
    return replace(plan, rate=info)


def _search(request: Request, rates: list[StageRate], gpu_type: str, on_solve) -> tuple[Request, str]:
    """The fewest GPUs of `gpu_type` whose problem CP-SAT finds feasible, counting up."""
    low = max(1, _counting_bound(request, rates) - 1)  # one below the bound: CP-SAT proves it short too
    for n in range(low, low + MAX_SEARCH + 1):
        req = replace(request, gpus=tuple(parse_gpus(f"{n}x{gpu_type}")))
        _, problem, _ = _with_rate(req, rates)
        status = cpsat.feasibility(problem, req.time_limit_s, req.workers)
        if status is cpsat.SolveStatus.OPTIMAL:
            proof = f"{n - 1} proven infeasible by CP-SAT" if n > low else "none fewer is possible"
            return req, f"the fewest {gpu_type} GPUs that serve the rate: {n} ({proof})"
        if status is cpsat.SolveStatus.UNKNOWN:
            raise NoPlanError(f"--target-rate: {n} GPU(s) neither proven feasible nor infeasible within the time "
                              "limit", ["raise --time-limit, or give a GPU count"], status="unknown")
    raise NoPlanError(f"--target-rate: no count of {gpu_type} up to {low + MAX_SEARCH} serves the rate", [],
                      status="infeasible")


def _extrapolated(request: Request, plan: Plan, rates: list[StageRate]) -> tuple[str, ...]:
    """Why the figures are outside what the profile measured, one reason each."""
    out = []
    gpus = sorted({g.name for g in request.gpus})
    for e in {id(r.entry): r.entry for r in rates}.values():
        what = f"{e.pipeline} ({e.unit})"
        if gpus != [e.gpu]:
            out.append(f"{what} measured on {e.gpu}, planned on {', '.join(gpus)}")
        version = e.source.omni_version
        if version == "unknown":
            out.append(f"{what}: the profile names no vLLM-Omni version; planned for {request.version.name}")
        elif ".".join(version.split(".")[:2]) != request.version.name:
            out.append(f"{what} measured on vLLM-Omni {version}, planned for {request.version.name}")
        if e.max_num_seqs is not None:
            for sp in plan.stages:
                if sp.stage.name in e.layout.stages and sp.knobs.max_num_seqs != e.max_num_seqs:
                    out.append(f"{what} measured at max_num_seqs {e.max_num_seqs}, {sp.stage.name} planned at "
                               f"{sp.knobs.max_num_seqs}")
    return tuple(dict.fromkeys(out))


def _assumptions(rates: list[StageRate]) -> tuple[str, ...]:
    out = []
    for e in {id(r.entry): r.entry for r in rates}.values():
        labels = ", ".join(e.labels)
        out.append(f"{e.pipeline} ({e.unit}): {labels}; for its workload only ({e.workload.dataset}"
                   f"{', ' + e.workload.task if e.workload.task else ''}): another workload is extrapolation")
        if e.workload.audio_seconds_assumed:
            out.append(f"{e.pipeline}: {e.workload.audio_seconds_per_request:g} s of audio per request is assumed, "
                       "not measured (requests/s = audio seconds/s / that)")
        if "derived" in e.labels:
            out.append(f"{e.pipeline}: the profile's requests/s are derived, not measured ({e.source.note or ''})"
                       .replace(" ()", ""))
        if e.unit == PIPELINE_UNIT:
            out.append(f"{e.pipeline}: measured end to end as one unit of {e.layout.gpus} GPU(s); each stage gets "
                       "that unit's replicas per unit of rate")
    return tuple(out)

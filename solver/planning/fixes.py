"""Fixes for a request that has no plan, each proven by re-solving with it applied.

Candidates, cheapest change first: fp8 KV cache; allowing TP degrees upstream never runs
(--allow-untested-tp); a larger TP degree for a stage whose TP is pinned; letting a stage
with pinned devices move; fewer guaranteed requests; an engine knob the user named
(max_num_batched_tokens, CUDA graphs, max_num_seqs) lowered to the largest level that fits;
the largest max_model_len that fits;
the fewest extra GPUs of the kind already there (alone, then with pinned stages free to
move, then with untested TP degrees), up to the inventory limit. Only fixes for which
CP-SAT finds a plan within the search's share of --time-limit are returned, each with the
command line that applies it. (fp8 weights would come first among the heavy changes, but no catalog model
ships an fp8 checkpoint yet.) Each candidate is solved with the knobs the planner may lower
itself at their floors (knobs.floor_request): it has a plan exactly when the planner finds one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Iterator

from ..defaults import MAX_GPUS
from ..errors import AutoconfError
from ..inputs.gpus import Gpu
from ..opt import cpsat
from .knobs import KNOB_ORDER, floor_request, lower_levels, named, with_values
from .planner import Request, allowed_tp_degrees, build_problem
from .request import command_line

CONTEXT_STEP = 1024  # max_model_len is searched in multiples of this


class _Budget:
    """The fix search's share of --time-limit: every solve takes what is left."""

    def __init__(self, seconds: float):
        self.deadline = time.perf_counter() + seconds
        self.ran_out = False
        self.proven: dict[str, bool] = {}  # command line -> verdict, so no request is solved twice

    def left(self) -> float:
        return self.deadline - time.perf_counter()


@dataclass(frozen=True)
class Fix:
    kind: str
    summary: str
    request: Request
    cost: tuple[int, int]  # (how heavy the change is, how much of it), smaller first

    @property
    def command(self) -> str:
        return f"omni-autoconf {command_line(self.request)}"

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "summary": self.summary, "command": self.command}


def feasible(request: Request, budget: _Budget) -> bool:
    """Whether some plan exists, proven by a CP-SAT solve within the budget (a solve that
    runs out of time proves nothing and counts as no)."""
    key = command_line(request)
    if key in budget.proven:
        return budget.proven[key]
    try:
        problem, _ = build_problem(floor_request(request, build_problem))
    except AutoconfError:
        return False
    if budget.left() <= 0:
        budget.ran_out = True
        return False
    status = cpsat.feasibility(problem, budget.left(), request.workers)
    if status is cpsat.SolveStatus.UNKNOWN:
        budget.ran_out = True
        return False
    budget.proven[key] = status is cpsat.SolveStatus.OPTIMAL
    return budget.proven[key]


def _largest(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The largest v in [lo, hi] with ok(v), for ok monotone (true below a threshold)."""
    if hi < lo or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def _candidates(request: Request, budget: _Budget) -> Iterator[Fix]:
    pipeline = request.pipeline
    if request.kv_cache_dtype == "auto":
        fixed = replace(request, kv_cache_dtype="fp8")
        yield Fix("fp8-kv-cache", "store the KV cache in fp8 (half the bytes per token)", fixed, (1, 0))
    if not request.allow_untested_tp:
        fixed = replace(request, allow_untested_tp=True)
        yield Fix("untested-tp", "allow TP degrees no upstream config or test runs (at your own risk)", fixed, (2, 9))
    for name, tp in sorted(request.tp.items()):
        larger = [d for d in allowed_tp_degrees(pipeline.stage(name), request) if d > tp and d <= len(request.gpus)]
        if larger and name not in request.devices:
            fixed = replace(request, tp={**request.tp, name: larger[0]})
            yield Fix("larger-tp", f"run {name} at tensor_parallel_size {larger[0]} instead of {tp}", fixed, (2, larger[0]))
    if request.replicas not in (None, "auto", "1"):
        fixed = replace(request, replicas="auto")
        yield Fix("fewer-replicas", f"let the solver choose each stage's replicas instead of {request.replicas} of "
                  "every stage (--replicas auto)", fixed, (3, 0))
    for name in sorted(request.devices):
        devices = {k: v for k, v in request.devices.items() if k != name}
        tp = {k: v for k, v in request.tp.items() if k != name}
        fixed = replace(request, devices=devices, tp=tp)
        yield Fix("move-stage", f"let {name} move off devices {','.join(map(str, request.devices[name]))}", fixed, (3, 0))
    for name, n in sorted(request.min_concurrency.items()):
        if n > 1:
            best = _largest(1, n - 1, lambda k: feasible(replace(request, min_concurrency={**request.min_concurrency, name: k}), budget))
            if best is not None:
                fixed = replace(request, min_concurrency={**request.min_concurrency, name: best})
                yield Fix("fewer-requests", f"guarantee {best} request(s) of max_model_len for {name} instead of {n}", fixed, (4, n - best))
    yield from _lower_named_knobs(request, budget)
    yield from _shorter_context(request, budget)
    yield from _more_gpus(request, budget)


def _lower_named_knobs(request: Request, budget: _Budget) -> Iterator[Fix]:
    """Each engine knob the user fixed, at the largest lower level that gives a plan (the
    planner lowers the others itself; max_model_len is _shorter_context's)."""
    try:
        _, resolved = build_problem(request)
    except AutoconfError:
        return
    for st in request.pipeline.stages:
        for rank, knob in enumerate(KNOB_ORDER[:3]):
            if not named(request, st.name, knob):
                continue
            current = getattr(resolved[st.name], knob)
            for value in lower_levels(request, st, knob, resolved[st.name]):
                fixed = with_values(request, {st.name: {knob: value}})
                if feasible(fixed, budget):
                    shown = "turn CUDA graphs off (enforce_eager true)" if knob == "enforce_eager" else (
                        f"lower {knob} from {current} to {value}")
                    yield Fix("lower-knob", f"{shown} for {st.name}", fixed, (4, rank))
                    break


def _shorter_context(request: Request, budget: _Budget) -> Iterator[Fix]:
    kv_stages = [st for st in request.pipeline.stages if st.has_kv_cache]
    if not kv_stages:  # no context to shorten (a diffusion or codec-only pipeline)
        return
    current = max(request.max_model_len.get(st.name, st.default_max_model_len(request.schema)) for st in kv_stages)

    def with_len(steps: int) -> Request:
        length = steps * CONTEXT_STEP
        lens = {st.name: min(length, request.max_model_len.get(st.name, st.default_max_model_len(request.schema))) for st in kv_stages}
        values = {k: v for k, v in request.global_values.items() if k != "max_model_len"}
        return replace(request, max_model_len=lens, global_values=values)

    best = _largest(1, (current - 1) // CONTEXT_STEP, lambda k: feasible(with_len(k), budget))
    if best is not None:
        length = best * CONTEXT_STEP
        yield Fix("shorter-context", f"cap max_model_len at {length} (from {current})", with_len(best), (5, current - length))


def _more_gpus(request: Request, budget: _Budget) -> Iterator[Fix]:
    """The fewest extra GPUs of the largest kind already there, up to the inventory limit
    (more GPUs never hurt, so the search halves the range each time)."""
    kind = max(request.gpus, key=lambda g: (g.total_bytes, -g.index))
    room = MAX_GPUS - len(request.gpus)
    host = request.gpus[-1].node  # on the last host: no GPU index before them moves
    several = len({g.node for g in request.gpus}) > 1
    where = f" on host {host}" if several else ""

    def with_extra(k: int) -> Request:
        extra = tuple(Gpu(len(request.gpus) + i, kind.name, kind.total_bytes, host) for i in range(k))
        return replace(request, gpus=request.gpus + extra)

    def fewest(make: Callable[[int], Request]) -> int | None:
        if room < 1 or not feasible(make(room), budget):
            return None
        lo, hi = 1, room
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if feasible(make(mid), budget) else (mid + 1, hi)
        return lo

    k = fewest(with_extra)
    if k is not None:
        yield Fix("more-gpus", f"add {k} more {kind.name} GPU(s){where}", with_extra(k), (6, k))
        return
    if request.devices or request.tp:  # pinned stages may be what keeps extra GPUs unused
        k = fewest(lambda n: replace(with_extra(n), devices={}, tp={}))
        if k is not None:
            summary = f"add {k} more {kind.name} GPU(s){where} and let the pinned stages move"
            yield Fix("more-gpus-unpinned", summary, replace(with_extra(k), devices={}, tp={}), (7, k))
            return
    if not request.allow_untested_tp:  # a TP degree no upstream config runs may be what it takes
        k = fewest(lambda n: replace(with_extra(n), devices={}, tp={}, allow_untested_tp=True))
        if k is not None:
            summary = (f"add {k} more {kind.name} GPU(s){where} and allow TP degrees no upstream config or test runs "
                       "(at your own risk)")
            yield Fix("more-gpus-untested-tp", summary,
                      replace(with_extra(k), devices={}, tp={}, allow_untested_tp=True), (8, k))


def propose_fixes(request: Request) -> tuple[list["Fix"], str]:
    """Every proven fix, cheapest change first, and a note when the time limit cut the
    search short (fixes not proven in time are not listed)."""
    budget = _Budget(request.time_limit_s)
    found = sorted((f for f in _candidates(request, budget) if feasible(f.request, budget)), key=lambda f: f.cost)
    note = ""
    if budget.ran_out:
        note = (f"The fix search reached its time limit ({request.time_limit_s:g} s); fixes it could not prove "
                "are not listed. Raise --time-limit to search further.")
    return found, note


FIX_KINDS = ("fp8 KV cache, untested TP degrees, larger TP, replicas chosen per stage, moving a pinned stage, "
             "fewer requests, lower engine knobs you named, shorter max_model_len, extra GPUs")

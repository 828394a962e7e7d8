"""Fixes for a request that has no plan, each proven by re-solving with it applied.

Candidates, cheapest change first: fp8 KV cache; a larger TP degree for a stage whose TP
is pinned; letting a stage with pinned devices move; fewer guaranteed requests; the
largest max_model_len that fits; the fewest extra GPUs of the kind already there. Only
fixes for which CP-SAT finds a plan are returned, each with the command line that
applies it. (fp8 weights would come first among the heavy changes, but no catalog model
ships an fp8 checkpoint yet.)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterator

from . import cpsat
from .errors import AutoconfError
from .gpus import Gpu
from .planner import Request, build_problem
from .render import command_line

MAX_GPUS_PER_NODE = 8  # extra GPUs are proposed up to one node's worth
CONTEXT_STEP = 1024  # max_model_len is searched in multiples of this
FIX_TIME_LIMIT_S = 10.0


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


def feasible(request: Request) -> bool:
    """Whether some plan exists (a plain CP-SAT feasibility solve)."""
    try:
        problem, _ = build_problem(request)
    except AutoconfError:
        return False
    return cpsat.has_solution(problem, FIX_TIME_LIMIT_S)


def _largest(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The largest v in [lo, hi] with ok(v), for ok monotone (true below a threshold)."""
    if hi < lo or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def _candidates(request: Request) -> Iterator[Fix]:
    pipeline = request.pipeline
    if request.kv_cache_dtype == "auto":
        fixed = replace(request, kv_cache_dtype="fp8")
        yield Fix("fp8-kv-cache", "store the KV cache in fp8 (half the bytes per token)", fixed, (1, 0))
    for name, tp in sorted(request.tp.items()):
        larger = [d for d in pipeline.stage(name).tp_degrees if d > tp and d <= len(request.gpus)]
        if larger and name not in request.devices:
            fixed = replace(request, tp={**request.tp, name: larger[0]})
            yield Fix("larger-tp", f"run {name} at tensor_parallel_size {larger[0]} instead of {tp}", fixed, (2, larger[0]))
    for name in sorted(request.devices):
        devices = {k: v for k, v in request.devices.items() if k != name}
        tp = {k: v for k, v in request.tp.items() if k != name}
        fixed = replace(request, devices=devices, tp=tp)
        yield Fix("move-stage", f"let {name} move off devices {','.join(map(str, request.devices[name]))}", fixed, (3, 0))
    for name, n in sorted(request.min_concurrency.items()):
        if n > 1:
            best = _largest(1, n - 1, lambda k: feasible(replace(request, min_concurrency={**request.min_concurrency, name: k})))
            if best is not None:
                fixed = replace(request, min_concurrency={**request.min_concurrency, name: best})
                yield Fix("fewer-requests", f"guarantee {best} request(s) of max_model_len for {name} instead of {n}", fixed, (4, n - best))
    yield from _shorter_context(request)
    yield from _more_gpus(request)


def _shorter_context(request: Request) -> Iterator[Fix]:
    kv_stages = [st for st in request.pipeline.stages if st.has_kv_cache]
    current = max(request.max_model_len.get(st.name, st.transformer.max_position) for st in kv_stages)

    def with_len(steps: int) -> Request:
        length = steps * CONTEXT_STEP
        lens = {st.name: min(length, request.max_model_len.get(st.name, st.transformer.max_position)) for st in kv_stages}
        return replace(request, max_model_len=lens)

    best = _largest(1, (current - 1) // CONTEXT_STEP, lambda k: feasible(with_len(k)))
    if best is not None:
        length = best * CONTEXT_STEP
        yield Fix("shorter-context", f"cap max_model_len at {length} (from {current})", with_len(best), (5, current - length))


def _more_gpus(request: Request) -> Iterator[Fix]:
    kind = max(request.gpus, key=lambda g: (g.total_bytes, -g.index))
    room = MAX_GPUS_PER_NODE - len(request.gpus)

    def with_extra(k: int) -> Request:
        extra = tuple(Gpu(len(request.gpus) + i, kind.name, kind.total_bytes) for i in range(k))
        return replace(request, gpus=request.gpus + extra)

    for k in range(1, room + 1):
        if feasible(with_extra(k)):
            yield Fix("more-gpus", f"add {k} more {kind.name} GPU(s)", with_extra(k), (6, k))
            return
    if request.devices or request.tp:  # pinned stages may be what keeps extra GPUs unused
        for k in range(1, room + 1):
            free = replace(with_extra(k), devices={}, tp={})
            if feasible(free):
                summary = f"add {k} more {kind.name} GPU(s) and let the pinned stages move"
                yield Fix("more-gpus-unpinned", summary, free, (7, k))
                return


def propose_fixes(request: Request) -> list[Fix]:
    """Every proven fix, cheapest change first."""
    return sorted((f for f in _candidates(request) if feasible(f.request)), key=lambda f: f.cost)


FIX_KINDS = "fp8 KV cache, larger TP, moving a pinned stage, fewer requests, shorter max_model_len, extra GPUs"

"""The engine knobs the planner may lower when the bundled values leave no plan.

`max_num_batched_tokens`, CUDA-graph capture (`enforce_eager`), `max_num_seqs` and
`max_model_len` set most of a stage's non-KV memory (the profile run, the encoder budget,
runner buffers, the graph reserve) and the KV one request needs. The bundled config's
values (the catalog defaults) are the preferred operating point; the user's values are
fixed. When the preferred point has no plan, a lexicographic search over per-stage knob
levels finds the point closest to it that has one, every candidate proven feasible or
infeasible by a CP-SAT solve of the problem built with those knobs:

1. the user's floors hold: a knob the user names (per stage or for all stages) never
   moves; max_num_seqs stays at or above --min-concurrency; nothing goes below a floor;
2. the knobs stay as close to the preferred values as memory allows, lowering first what
   costs least throughput (KNOB_ORDER, cheapest first; the evidence in docs/cpsat.md):
   the most costly knob is kept as high as any plan allows with every cheaper knob at its
   floor, then the next, ...; a knob is never lowered where its preferred value fits;
3. then today's objective: the planner's normal solve with the chosen knobs.

Levels (LEVELS): the preferred value and the powers of two between a floor and it, each
kept only where vLLM accepts it (`stage_knob_errors`: max_num_batched_tokens >=
max_model_len without chunked prefill and >= max_num_seqs, a stage's batch rule such as
an encoder budget's minimum, CFG row pairs) and where it moves the stage's memory (graph
capture moves nothing in a version or stage with no graph reserve). Diffusion stages keep
their knobs (a fixed resolution sizes them). Only the stages in CP-SAT's infeasibility
core are lowered (`explain.infeasible_core`), more only when their floors are not enough.

This module sits below the planner: the problem builder is passed in (`Build`).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace
from typing import Callable

from ..errors import AutoconfError
from ..inputs.catalog import StageSpec
from ..memory.stage_memory import StageKnobs, stage_memory
from ..opt import cpsat, explain
from ..opt.problem import Problem
from ..startup.engine_checks import stage_knob_errors
from ..vllm.facts import gib_text
from .request import Request, command_line

# Cheapest in throughput first (docs/cpsat.md, "Engine knobs"): max_num_batched_tokens only
# chunks prefills (vLLM docs/configuration/optimization.md: smaller values give better ITL,
# larger better TTFT); graph capture costs every decode step its launch overhead
# (conserving_memory.md: "a better balance between inference speed and memory usage");
# max_num_seqs caps the decode batch itself; max_model_len refuses longer requests.
KNOB_ORDER = ("max_num_batched_tokens", "enforce_eager", "max_num_seqs", "max_model_len")
BATCH_FLOOR = 2048  # optimization.md's "smaller values (e.g., 2048) achieve better inter-token latency"
CONTEXT_FLOOR = 4096  # vllm-omni 0.30 minicpmo_4_5_8x4090.yaml: "4096 is the empirically-verified safe ceiling"
LEVELS = {"max_num_batched_tokens": BATCH_FLOOR, "max_num_seqs": 1, "max_model_len": CONTEXT_FLOOR}

Build = Callable[[Request], "tuple[Problem, dict[str, StageKnobs]]"]
Values = dict[str, dict[str, object]]  # stage -> knob -> value


@dataclass(frozen=True)
class KnobChange:
    """One knob the planner lowered: its bundled value, the chosen one, and the memory per
    rank that lowering it frees at the plan's TP (after the cheaper knobs of the stage)."""

    stage: str
    knob: str
    before: int | bool
    after: int | bool
    freed_bytes: int

    def as_dict(self) -> dict[str, object]:
        return {"stage": self.stage, "knob": self.knob, "from": self.before, "to": self.after,
                "freed_bytes": self.freed_bytes}

    def text(self) -> str:
        show = (lambda v: str(v).lower()) if self.knob == "enforce_eager" else str
        return (f"{self.stage} {self.knob} {show(self.before)} -> {show(self.after)} "
                f"(frees {gib_text(self.freed_bytes)} GiB per rank)")


def named(request: Request, stage: str, knob: str) -> bool:
    """Whether the user fixed this knob of this stage (per stage, or for every stage)."""
    return stage in getattr(request, knob) or knob in request.global_values


def with_values(request: Request, values: Values) -> Request:
    """`request` with these per-stage knob values, as if the user had named them."""
    maps = {knob: dict(getattr(request, knob)) for knob in KNOB_ORDER}
    for stage, knobs in values.items():
        for knob, value in knobs.items():
            maps[knob][stage] = value
    return replace(request, **maps)


def _need(st: StageSpec, tp: int, k: StageKnobs, request: Request) -> tuple[int, int]:
    m = stage_memory(st, tp, k, request.version)
    return m.inside_bytes + m.outside_bytes, st.min_requests(k.max_num_seqs, request.min_concurrency.get(st.name))


def levels(request: Request, st: StageSpec, knob: str, preferred: StageKnobs) -> list:
    """The values `knob` of `st` may take, preferred first, then lower ones that move memory
    (none where the user named the knob)."""
    if named(request, st.name, knob):
        return []
    below = lower_levels(request, st, knob, preferred)
    return [getattr(preferred, knob), *below] if below else []


def lower_levels(request: Request, st: StageSpec, knob: str, preferred: StageKnobs) -> list:
    """The levels of `knob` below its value in `preferred` that move the stage's memory,
    highest first (also for a knob the user named: the fix search offers them)."""
    if st.role == "diffusion" or (knob == "max_model_len" and not st.has_kv_cache):
        return []
    top = getattr(preferred, knob)
    if knob == "enforce_eager":
        below = [] if top else [True]
    else:
        floor = LEVELS[knob]
        if knob == "max_num_seqs":
            floor = max(floor, st.min_requests(1, request.min_concurrency.get(st.name)))
        below = [v for v in (2 ** i for i in range(top.bit_length() - 1, -1, -1)) if floor <= v < top]
    if knob == "max_model_len":  # a request's KV moves with it
        return below
    tps = [d for d in st.tp_degrees if d <= len(request.gpus)] or [min(st.tp_degrees)]
    base = [_need(st, tp, preferred, request) for tp in tps]
    return [v for v in below
            if any(_need(st, tp, replace(preferred, **{knob: v}), request) != b for tp, b in zip(tps, base))]


class Search:
    """The knob levels of one request and the CP-SAT proofs over them, within a deadline."""

    def __init__(self, request: Request, build: Build, seconds: float):
        self.request, self.build = request, build
        self.deadline = time.perf_counter() + seconds
        self.ran_out = False
        self.proven: dict[str, bool] = {}
        self.preferred = build(request)[1]
        self.stages = {st.name: st for st in request.pipeline.stages}
        self.levels = {name: {knob: levels(request, st, knob, self.preferred[name]) for knob in KNOB_ORDER}
                       for name, st in self.stages.items()}
        self.movable = [name for name, by in self.levels.items() if any(by.values())]

    def completion(self, stage: str, decided: dict[str, object]) -> dict[str, object] | None:
        """`decided` with every other movable knob of `stage` as low as vLLM accepts it
        (None when no completion is accepted)."""
        free = [knob for knob in KNOB_ORDER if knob not in decided and self.levels[stage][knob]]
        options = [list(reversed(self.levels[stage][knob])) for knob in free]  # lowest first
        for pick in sorted(itertools.product(*(range(len(o)) for o in options)), key=lambda p: (sum(p), p)):
            values = {**decided, **{knob: o[i] for knob, o, i in zip(free, options, pick)}}
            k = replace(self.preferred[stage], **values)
            if not stage_knob_errors(self.request.pipeline, self.stages[stage], k, self.request.schema,
                                     self.request.version):
                return values
        return None

    def lowered(self, values: Values) -> Values:
        """Only the values that differ from the preferred ones (the request's knob options)."""
        out = {s: {k: v for k, v in kv.items() if getattr(self.preferred[s], k) != v} for s, kv in values.items()}
        return {s: kv for s, kv in out.items() if kv}

    def floor(self, stages: list[str]) -> Values | None:
        out = {s: self.completion(s, {}) for s in stages}
        return None if any(v is None for v in out.values()) else out

    def feasible(self, values: Values) -> bool | None:
        """Whether a plan exists with these knobs: True/False proven by CP-SAT, None when the
        deadline came first."""
        trial = with_values(self.request, self.lowered(values))
        key = command_line(trial)
        if key in self.proven:
            return self.proven[key]
        try:
            problem, _ = self.build(trial)
        except AutoconfError:
            return False
        left = self.deadline - time.perf_counter()
        status = cpsat.feasibility(problem, left, self.request.workers) if left > 0 else cpsat.SolveStatus.UNKNOWN
        if status is cpsat.SolveStatus.UNKNOWN:
            self.ran_out = True
            return None
        self.proven[key] = status is cpsat.SolveStatus.OPTIMAL
        return self.proven[key]

    def core_stages(self, values: Values) -> set[str]:
        """The stages in CP-SAT's conflict of the problem with these knobs."""
        problem, _ = self.build(with_values(self.request, self.lowered(values)))
        names, _ = explain.infeasible_core(problem, max(0.0, self.deadline - time.perf_counter()))
        if names is None:
            return set(self.movable)
        return {n[n.index("[") + 1:-1] for n in names if not n.startswith("capacity[")}

    def stages_to_lower(self) -> tuple[list[str], Values | None, bool | None]:
        """The stages to lower (core first, grown by the cores of their floors), their floor
        values, and whether that floor has a plan."""
        chosen: list[str] = []
        core = self.core_stages({})
        while True:
            grown = [s for s in self.movable if s in chosen or s in core]
            floor = self.floor(grown)
            if not grown or floor is None:
                return grown, floor, False
            verdict = self.feasible(floor)
            if verdict is not False or grown == chosen:
                return grown, floor, verdict
            chosen = grown
            core = self.core_stages(floor)

    def lexicographic(self, stages: list[str]) -> Values:
        """Per knob, most costly first, per stage in order: the highest level that still has a
        plan with every undecided knob at its floor (the floor of all has one)."""
        decided: Values = {s: {} for s in stages}
        for knob in reversed(KNOB_ORDER):
            for s in stages:
                for value in self.levels[s][knob]:
                    mine = self.completion(s, {**decided[s], knob: value})
                    if mine is None:
                        continue
                    values = {t: mine if t == s else self.completion(t, decided[t]) or decided[t] for t in stages}
                    if self.feasible(values):
                        decided[s][knob] = value
                        break
                else:  # only when the deadline cut the proofs short: the floor's value
                    floor = self.completion(s, decided[s]) if self.levels[s][knob] else None
                    if floor is not None:
                        decided[s][knob] = floor[knob]
        return {s: self.completion(s, kv) or kv for s, kv in decided.items()}


@dataclass(frozen=True)
class Choice:
    """The search's outcome: the request with the chosen knobs (None: no knob choice has a
    plan), the lowered values, and what to say about it."""

    request: Request | None
    values: Values
    preferred: dict[str, StageKnobs]
    notes: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()


def choose(request: Request, build: Build) -> Choice:
    """The knobs closest to the preferred ones that give a plan (the preferred point has none)."""
    search = Search(request, build, request.time_limit_s)
    stages, floor, verdict = search.stages_to_lower()
    late = (f"the knob search reached its time limit ({request.time_limit_s:g} s); a knob may be lower than "
            "needed: raise --time-limit")
    if not verdict:
        if verdict is None:
            reason = (f"the knob search reached its time limit ({request.time_limit_s:g} s) before it proved whether "
                      "lower engine knobs fit: raise --time-limit")
        elif floor and search.lowered(floor):
            reason = ("with the engine knobs at their floors (" + "; ".join(
                f"{s}: " + ", ".join(f"{k} {_show(v)}" for k, v in kv.items())
                for s, kv in search.lowered(floor).items()) + ") no plan fits either (proven by CP-SAT)")
        else:
            reason = "no engine knob of the stages involved can be lowered (named by you, or at its floor already)"
        return Choice(None, {}, search.preferred, reasons=(reason,))
    values = search.lowered(search.lexicographic(stages))
    return Choice(with_values(request, values), values, search.preferred, notes=(late,) if search.ran_out else ())


def floor_request(request: Request, build: Build) -> Request:
    """`request` with every knob the planner may lower at its floor: it has a plan exactly
    when the planner finds one (memory only falls with each knob), so the fix search proves
    a fix with one solve of it."""
    search = Search(request, build, 0.0)
    floor = search.floor(search.movable)
    return request if floor is None else with_values(request, search.lowered(floor))


def changes(choice: Choice, build: Build, tp: dict[str, int]) -> tuple[KnobChange, ...]:
    """Each lowered knob, cheapest first per stage, with the memory per rank it frees at the
    plan's TP degree (weights, activations, buffers, graph reserve and the guaranteed KV)."""
    out = []
    for stage, lowered in choice.values.items():
        def need(values: dict[str, object]) -> int | None:
            try:
                problem, _ = build(with_values(choice.request, {stage: {**lowered, **values}}))
            except AutoconfError:
                return None
            sp = next(p for p in problem.stages if p.name == stage)
            opt = sp.options[sp.option_index(tp[stage])]
            return opt.memory.inside_bytes + opt.memory.outside_bytes + sp.min_kv_bytes(opt)

        pref = choice.preferred[stage]
        order = [k for k in KNOB_ORDER if k in lowered]
        last = need({k: getattr(pref, k) for k in order})
        for i, knob in enumerate(order):  # a step vLLM refuses alone (a knob tied to the next) frees 0 ...
            now = need({k: getattr(pref, k) for k in order[i + 1:]})
            out.append(KnobChange(stage, knob, getattr(pref, knob), lowered[knob], 0 if now is None else last - now))
            last = last if now is None else now  # ... and the next step counts both
    return tuple(out)


def _show(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)

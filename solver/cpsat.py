r"""The CP-SAT model: place stages on GPUs and size their fractions.

Notation (the code uses the same names):
    s in S      stages;  g in G  GPUs with total C_g bytes;  R = resolution (steps per 1.0)
    o in O_s    TP options of stage s, with per-rank memory: in_o (inside the fraction),
                out_o (outside: context, NCCL, graph reserve), b_o KV bytes per token
    M in CO     co-resident sets: the maximal sets of stages that may be resident together
                (all stages, unless --exclusive groups say otherwise; see residency.py)
    L_s         max_model_len;  n_s  minimum requests;  w_s  weight (x100)
    q_s         max_num_seqs where KV beyond q_s requests is no headroom (no prefix caching)

Variables:
    x[s,o] in {0,1}    stage s runs at TP option o               sum_o x[s,o] = 1
    p[s,g] in {0,1}    stage s has a rank on GPU g               sum_g p[s,g] = sum_o tp_o x[s,o]
    u[s]   in 1..R     gpu_memory_utilization = u[s] / R
    kv[s]  >= 0        KV MiB per rank (the smallest over the stage's GPUs)
    m[s]   >= 0        KV capacity in thousandths of a max-length request
    h[s]   >= 0        headroom: m[s], capped at 1000 q_s where q_s applies

Constraints, one function each:
    _add_choice          exactly one TP option; as many GPUs as that degree
    _add_pins            a TP degree or GPU set fixed by the user (--tp, --devices)
    _add_symmetry        GPUs that no rule tells apart (same kind, same pins) are used in a
                         canonical order: column p[., g] >=lex p[., g'] for g < g' in a run
    _add_gpu_capacity    for every GPU g and co-resident set M:
                         sum_{s in M} d[s,g] <= R (C_g - reserve),
                         d[s,g] >= C_g u[s] + 2R + R out_o  if p[s,g] and x[s,o]
                         (R x requested + outside; the start-up checks of startup.py follow)
    _add_kv              R kv[s] <= C_g u[s] - R in_o   for every g with p[s,g] and x[s,o]
                         generation stages: C_g u[s] >= R in_o
    _add_min_kv          kv[s] >= blocks(L_s) b_o and kv[s] >= blocks(n_s L_s) b_o  if x[s,o]
    _add_capacity_units  m[s] b_o L_s <= 1000 kv[s] MiB if x[s,o] (divided by their gcd);
                         h[s] <= m[s], h[s] <= 1000 q_s

Units: the model counts memory in whole MiB so that its coefficients stay small (CP-SAT's
presolve mishandled byte-sized coefficients here: it declared a feasible model
infeasible). Every rounding goes the safe way: capacities are floored, needs are rounded
up, and the 2R term in the demand covers vLLM's ceil() and the floored capacity. The
plan's reported figures are then recomputed in bytes and re-checked by `startup`.

Objective, lexicographic (each phase fixes the optimum of the one before):
    1. maximise z with w_s z <= 100 h[s] for KV stages (the smallest weighted headroom)
    2. maximise sum_s h[s]
    3. minimise sum_s u[s]: what no stage can use goes back to the GPU as free memory
    4. canonical tie-break, per stage in order: the lowest sum of device indices, then
       the largest u[s]
No coefficient grows with the number of GPUs beyond its index (at most 63).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from enum import Enum
from math import gcd

from . import defaults as D
from .problem import MILLI, Problem
from .vllm_facts import MiB


def _down(nbytes: int) -> int:
    return nbytes // MiB


def _up(nbytes: int) -> int:
    return -(-nbytes // MiB)


class SolveStatus(str, Enum):
    OPTIMAL = "optimal"  # every objective phase proven optimal
    FEASIBLE = "feasible"  # a plan, but some phase ran out of time (see gap and notes)
    INFEASIBLE = "infeasible"  # proven: no plan satisfies the constraints
    UNKNOWN = "unknown"  # the time limit came before any plan was found


@dataclass(frozen=True)
class StageAssignment:
    """The solver's answer for one stage."""

    option_index: int
    gpus: tuple[int, ...]
    util_steps: int


@dataclass(frozen=True)
class Solution:
    status: SolveStatus
    gap: float  # relative gap of the main objective (0 when proven optimal)
    solve_seconds: float
    objective: int  # z, in thousandths of a weighted max-length request
    assignments: tuple[StageAssignment, ...]
    headroom_milli: tuple[int, ...] = ()  # h[s] as the model counts it
    notes: tuple[str, ...] = ()  # phases that did not finish


def run_solver(model, time_limit_s: float, workers: int):
    """Solve `model` once; returns (status, solver). Interruptible: a Ctrl-C stops the
    search (CP-SAT's own SIGINT handler is not installed) and re-raises KeyboardInterrupt
    once the solver thread has returned, so no half-finished result is ever used."""
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.001, time_limit_s)
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = D.RANDOM_SEED
    solver.parameters.catch_sigint_signal = False
    result: dict[str, object] = {}

    def work() -> None:
        try:
            result["status"] = solver.Solve(model)
        except BaseException as exc:  # re-raised in the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=work, name="cp-sat", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.05)
    except KeyboardInterrupt:
        solver.StopSearch()
        thread.join()
        raise
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result["status"], solver


class Model:
    """Variables and constraints around one CpModel (built once, re-solved per phase).

    With `explain=True` every requirement group is enforced by an assumption literal
    (named as in `self.assume`) and the objective's variables are left out: the model is
    then only used to ask which requirements cannot hold together (explain.py).
    """

    def __init__(self, problem: Problem, explain: bool = False):
        from ortools.sat.python import cp_model

        self.cp = cp_model
        self.pb = problem
        self.explain = explain
        self.assume: dict[str, object] = {}
        self.m = cp_model.CpModel()
        S, G = range(len(problem.stages)), range(len(problem.gpus))
        R = problem.resolution
        self.max_c = max(_down(gpu.total_bytes) for gpu in problem.gpus)
        self.x = {
            (s, o): self.m.NewBoolVar(f"x[{st.name}][tp={opt.tp}]")
            for s, st in enumerate(problem.stages)
            for o, opt in enumerate(st.options)
        }
        self.p = {
            (s, g): self.m.NewBoolVar(f"place[{problem.stages[s].name}][gpu{g}]") for s in S for g in G
        }
        self.u = {s: self.m.NewIntVar(1, R, f"util[{problem.stages[s].name}]") for s in S}
        # When explaining, kv may go negative (a fraction short of the weights) so that
        # only the `fits` assumption, not the variable's domain, rules that out.
        low = -max(_up(o.memory.inside_bytes) for st in problem.stages for o in st.options) if explain else 0
        self.kv = {s: self.m.NewIntVar(low, self.max_c, f"kv[{problem.stages[s].name}]") for s in S}
        self._add_choice()
        self._add_pins()
        self._add_symmetry()
        self._add_gpu_capacity()
        self._add_kv()
        self._add_min_kv()
        if not explain:
            self.mr = {
                s: self.m.NewIntVar(0, _max_milli(problem, s, self.max_c * MiB), f"requests_milli[{problem.stages[s].name}]")
                for s in S
            }
            self.h = {s: self.m.NewIntVar(0, _max_milli(problem, s, self.max_c * MiB), f"headroom[{problem.stages[s].name}]")
                      for s in S}
            self._add_capacity_units()

    def _require(self, group: str, constraint) -> None:
        """Make `constraint` part of requirement `group` (an assumption when explaining)."""
        if self.explain:
            if group not in self.assume:
                self.assume[group] = self.m.NewBoolVar(group)
            constraint.OnlyEnforceIf(self.assume[group])

    # --- constraint families ---------------------------------------------------

    def _add_choice(self) -> None:
        for s, st in enumerate(self.pb.stages):
            self.m.AddExactlyOne(self.x[s, o] for o in range(len(st.options)))
            self.m.Add(
                sum(self.p[s, g] for g in range(len(self.pb.gpus)))
                == sum(opt.tp * self.x[s, o] for o, opt in enumerate(st.options))
            )

    def _add_pins(self) -> None:
        for s, st in enumerate(self.pb.stages):
            if st.pinned_tp is not None:
                self._require(f"pinned-tp[{st.name}]", self.m.Add(self.x[s, st.option_index(st.pinned_tp)] == 1))
            if st.pinned_devices is not None:
                for g in range(len(self.pb.gpus)):
                    on = int(g in st.pinned_devices)
                    self._require(f"pinned-devices[{st.name}]", self.m.Add(self.p[s, g] == on))

    def _add_symmetry(self) -> None:
        """Lexicographic order of the placement columns within each run of interchangeable
        GPUs. Every plan has a relabelled twin that satisfies it, so no optimum is lost."""
        S = range(len(self.pb.stages))
        for run in self.pb.interchangeable_runs():
            for a, b in zip(run, run[1:]):
                equal_so_far = None  # None: the empty prefix, always equal
                for s in S:
                    pa, pb = self.p[s, a], self.p[s, b]
                    guard = [] if equal_so_far is None else [equal_so_far.Not()]
                    self.m.AddBoolOr([*guard, pa, pb.Not()])  # equal prefix => pa >= pb
                    if s == len(S) - 1:
                        break
                    nxt = self.m.NewBoolVar(f"lex[gpu{a}>=gpu{b}][{s}]")
                    self.m.AddBoolOr([*guard, pa.Not(), pb.Not(), nxt])  # both on: still equal
                    self.m.AddBoolOr([*guard, pa, pb, nxt])  # both off: still equal
                    equal_so_far = nxt

    def _add_gpu_capacity(self) -> None:
        pb, R = self.pb, self.pb.resolution
        for g, gpu in enumerate(pb.gpus):
            demand = {}
            for s, st in enumerate(pb.stages):
                most = R * (_down(gpu.total_bytes) + 2 + max(_up(opt.memory.outside_bytes) for opt in st.options))
                d = self.m.NewIntVar(0, most, f"demand[{st.name}][gpu{g}]")
                for o, opt in enumerate(st.options):
                    need = _down(gpu.total_bytes) * self.u[s] + 2 * R + R * _up(opt.memory.outside_bytes)
                    self.m.Add(d >= need).OnlyEnforceIf([self.p[s, g], self.x[s, o]])
                demand[s] = d
            capacity = R * _down(pb.usable_bytes(gpu))
            for members in pb.coresident:
                fits = self.m.Add(sum(demand[s] for s in members) <= capacity)
                self._require(f"capacity[gpu{g}]", fits)

    def _add_kv(self) -> None:
        R = self.pb.resolution
        for s, st in enumerate(self.pb.stages):
            for g, gpu in enumerate(self.pb.gpus):
                for o, opt in enumerate(st.options):
                    lits = [self.p[s, g], self.x[s, o]]
                    budget = _down(gpu.total_bytes) * self.u[s] - R * _up(opt.memory.inside_bytes)
                    if st.has_kv:
                        self.m.Add(R * self.kv[s] <= budget).OnlyEnforceIf(lits)
                    else:
                        fits = self.m.Add(budget >= 0)
                        fits.OnlyEnforceIf(lits)
                        self._require(f"fits[{st.name}]", fits)
            if st.has_kv:
                self._require(f"fits[{st.name}]", self.m.Add(self.kv[s] >= 0))
            else:
                self.m.Add(self.kv[s] == 0)

    def _add_min_kv(self) -> None:
        for s, st in enumerate(self.pb.stages):
            if not st.has_kv:
                continue
            for o, opt in enumerate(st.options):
                one = self.m.Add(self.kv[s] >= _up(st.min_kv_bytes_for(opt, 1)))
                one.OnlyEnforceIf(self.x[s, o])
                self._require(f"max-model-len[{st.name}]", one)
                if st.min_requests > 1:
                    more = self.m.Add(self.kv[s] >= _up(st.min_kv_bytes(opt)))
                    more.OnlyEnforceIf(self.x[s, o])
                    self._require(f"min-concurrency[{st.name}]", more)

    def _add_capacity_units(self) -> None:
        for s, st in enumerate(self.pb.stages):
            if not st.has_kv:
                self.m.Add(self.mr[s] == 0)
                self.m.Add(self.h[s] == 0)
                continue
            for o, opt in enumerate(st.options):
                per_request = opt.memory.kv_bytes_per_token * st.max_model_len
                d = gcd(per_request, MILLI * MiB)
                self.m.Add(self.mr[s] * (per_request // d) <= (MILLI * MiB // d) * self.kv[s]).OnlyEnforceIf(
                    self.x[s, o]
                )
            self.m.Add(self.h[s] <= self.mr[s])
            if st.headroom_cap_requests is not None:
                self.m.Add(self.h[s] <= MILLI * st.headroom_cap_requests)

    # --- solving -----------------------------------------------------------------

    def phases(self) -> list[tuple[str, object, bool]]:
        """(name, expression, maximise) in the order they are optimised."""
        pb = self.pb
        kv_stages = [s for s, st in enumerate(pb.stages) if st.has_kv]
        z_max = max([0, *(100 * _max_milli(pb, s, self.max_c * MiB) for s in kv_stages)])
        z = self.m.NewIntVar(0, z_max, "z")
        for s in kv_stages:
            self.m.Add(pb.stages[s].weight_pct * z <= 100 * self.h[s])
        if not kv_stages:
            self.m.Add(z == 0)
        out: list[tuple[str, object, bool]] = [
            ("smallest weighted headroom", z, True),
            ("total headroom", sum(self.h[s] for s in kv_stages), True),
            ("fractions given back", sum(self.u.values()), False),
        ]
        for s, st in enumerate(pb.stages):
            out.append((f"devices of {st.name}", sum(g * self.p[s, g] for g in range(len(pb.gpus))), False))
            out.append((f"fraction of {st.name}", self.u[s], True))
        return out

    def solve_lexicographic(self, time_limit_s: float, workers: int) -> Solution:
        t0 = time.perf_counter()
        deadline = t0 + time_limit_s
        status, gap, objective, notes = SolveStatus.OPTIMAL, 0.0, 0, []
        best = None
        for i, (name, expr, maximize) in enumerate(self.phases()):
            left = deadline - time.perf_counter()
            if left <= 0:
                notes.append(f"phase '{name}' and later not run: time limit reached")
                status = SolveStatus.FEASIBLE
                break
            (self.m.Maximize if maximize else self.m.Minimize)(expr)
            result, solver = run_solver(self.m, left, workers)
            if result == self.cp.INFEASIBLE:
                if i == 0:
                    return Solution(SolveStatus.INFEASIBLE, 0.0, time.perf_counter() - t0, 0, ())
                raise RuntimeError(f"phase '{name}' infeasible after a feasible phase")  # a modelling bug
            if result not in (self.cp.OPTIMAL, self.cp.FEASIBLE):
                if i == 0:
                    return Solution(SolveStatus.UNKNOWN, 0.0, time.perf_counter() - t0, 0, ())
                # Out of time without a solution: keep the previous phase's plan.
                notes.append(f"phase '{name}' found no solution before the time limit")
                status = SolveStatus.FEASIBLE
                break
            value = int(round(solver.ObjectiveValue()))
            best = self._read(solver)
            if i == 0:
                objective = value
                if result != self.cp.OPTIMAL:
                    bound = solver.BestObjectiveBound()
                    gap = abs(bound - value) / max(1.0, abs(value))
            if result != self.cp.OPTIMAL:
                status = SolveStatus.FEASIBLE
                notes.append(f"phase '{name}' not proven optimal before the time limit")
            # Fix this phase's value before the next phase, and start from this solution.
            self.m.Add(expr >= value) if maximize else self.m.Add(expr <= value)
            self._hint(solver)
            if result != self.cp.OPTIMAL:
                break  # later phases would fix a value that is not the optimum anyway
        assignments, headroom = best
        return Solution(status, gap, time.perf_counter() - t0, objective, assignments, headroom, tuple(notes))

    def _hint(self, solver) -> None:
        self.m.ClearHints()
        for var in [*self.x.values(), *self.p.values(), *self.u.values()]:
            self.m.AddHint(var, solver.Value(var))

    def _read(self, solver) -> tuple[tuple[StageAssignment, ...], tuple[int, ...]]:
        out = []
        for s, st in enumerate(self.pb.stages):
            option = next(o for o in range(len(st.options)) if solver.BooleanValue(self.x[s, o]))
            gpus = tuple(g for g in range(len(self.pb.gpus)) if solver.BooleanValue(self.p[s, g]))
            out.append(StageAssignment(option_index=option, gpus=gpus, util_steps=solver.Value(self.u[s])))
        return tuple(out), tuple(solver.Value(self.h[s]) for s in range(len(self.pb.stages)))


def _max_milli(problem: Problem, s: int, max_bytes: int) -> int:
    """Upper bound of m[s]: the whole largest GPU as KV cache at the cheapest TP option."""
    st = problem.stages[s]
    if not st.has_kv:
        return 0
    cheapest = min(opt.memory.kv_bytes_per_token for opt in st.options)
    return MILLI * max_bytes // (cheapest * st.max_model_len)


def feasibility(problem: Problem, time_limit_s: float, workers: int | None = None) -> SolveStatus:
    """Whether any plan satisfies `problem` (one solve, no objective): OPTIMAL when one
    exists, INFEASIBLE when proven impossible, UNKNOWN when time ran out first."""
    model = Model(problem)
    result, _ = run_solver(model.m, time_limit_s, workers or D.default_workers())
    if result in (model.cp.OPTIMAL, model.cp.FEASIBLE):
        return SolveStatus.OPTIMAL
    return SolveStatus.INFEASIBLE if result == model.cp.INFEASIBLE else SolveStatus.UNKNOWN


def solve(problem: Problem, time_limit_s: float = D.DEFAULT_TIME_LIMIT_S, workers: int | None = None) -> Solution:
    """Build the CP-SAT model of `problem` and solve it lexicographically. Pure: no I/O."""
    return Model(problem).solve_lexicographic(time_limit_s, workers or D.default_workers())

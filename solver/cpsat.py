r"""The CP-SAT model: place stages on GPUs and size their fractions.

Notation (the code uses the same names):
    s in S      stages;  g in G  GPUs with total C_g bytes;  R = resolution (steps per 1.0)
    o in O_s    TP options of stage s, with per-rank memory: in_o (inside the fraction),
                out_o (outside: context, NCCL, graph reserve), b_o KV bytes per token
    L_s         max_model_len;  n_s  minimum requests;  w_s  weight (x100)

Variables:
    x[s,o] in {0,1}    stage s runs at TP option o               sum_o x[s,o] = 1
    p[s,g] in {0,1}    stage s has a rank on GPU g               sum_g p[s,g] = sum_o tp_o x[s,o]
    u[s]   in 1..R     gpu_memory_utilization = u[s] / R
    kv[s]  >= 0        KV MiB per rank (the smallest over the stage's GPUs)
    m[s]   >= 0        KV capacity in thousandths of a max-length request
    start[s]           the time slot a stage is resident from (exclusive groups only)

Constraints, one function each:
    _add_choice          exactly one TP option; as many GPUs as that degree
    _add_pins            a TP degree or GPU set fixed by the user (--tp, --devices)
    _add_gpu_capacity    per GPU g, a cumulative over the stages' intervals:
                         demand = C_g u[s] + 2R + R out_o   (R x requested + outside)
                         capacity = R (C_g - reserve)
                         Stages are resident over the whole horizon unless an exclusive
                         group puts them in separate slots, so without --exclusive this is
                         the plain per-GPU sum. The start-up free-memory check of every
                         stage (started one after another) follows from it.
    _add_kv              R kv[s] <= C_g u[s] - R in_o   for every g with p[s,g] and x[s,o]
                         generation stages: C_g u[s] >= R in_o
    _add_min_kv          kv[s] >= blocks(L_s) b_o and kv[s] >= blocks(n_s L_s) b_o  if x[s,o]
    _add_capacity_units  m[s] b_o L_s <= 1000 kv[s] MiB if x[s,o] (divided by their gcd)

Units: the model counts memory in whole MiB so that its coefficients stay small (CP-SAT's
presolve mishandled byte-sized coefficients here: it declared a feasible model
infeasible). Every rounding goes the safe way: capacities are floored, needs are rounded
up, and the 2R term in the demand covers vLLM's ceil() and the floored capacity. The
plan's reported figures are then recomputed in bytes and re-checked in `verify`.
Objective, lexicographic (each step fixes the optimum of the one before):
    1. maximise z with w_s z <= 100 m[s] for KV stages (the smallest weighted headroom)
    2. maximise sum_s m[s]
    3. minimise sum of u[s] over stages without KV (give them what they need, no more)
    4. canonical tie-break: per stage in order, the lowest GPU indices, then the highest u[s],
       then the earliest time slot for stages in exclusive groups
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum

from math import gcd

from .problem import MILLI, Problem
from .vllm_facts import MiB


def _down(nbytes: int) -> int:
    return nbytes // MiB


def _up(nbytes: int) -> int:
    return -(-nbytes // MiB)

# Solver parameters, fixed so that the same input yields the same plan.
DEFAULT_TIME_LIMIT_S = 30.0
NUM_WORKERS = 8
RANDOM_SEED = 0


class SolveStatus(str, Enum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    INFEASIBLE = "infeasible"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class StageAssignment:
    """The solver's answer for one stage."""

    option_index: int
    gpus: tuple[int, ...]
    util_steps: int
    kv_mib: int
    milli_requests: int
    start: int | None  # time slot of a stage in an exclusive group; None: always resident


@dataclass(frozen=True)
class Solution:
    status: SolveStatus
    gap: float  # relative gap of the main objective (0 when proven optimal)
    solve_seconds: float
    objective: int  # z, in thousandths of a weighted max-length request
    assignments: tuple[StageAssignment, ...]


class _Model:
    """Variables and constraints around one CpModel (built once, re-solved per phase).

    With `explain=True` every requirement group is enforced by an assumption literal
    (named as in `self.assume`), GPU capacities get a slack that their literal forces to
    zero, and the objective's variables are left out: the model is then only used to ask
    which requirements cannot hold together.
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
        max_c = max(_down(gpu.total_bytes) for gpu in problem.gpus)
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
        self.kv = {s: self.m.NewIntVar(low, max_c, f"kv[{problem.stages[s].name}]") for s in S}
        self.starts: dict[int, object] = {}
        self._add_choice()
        self._add_pins()
        self._add_gpu_capacity()
        self._add_kv()
        self._add_min_kv()
        if not explain:
            self.mr = {
                s: self.m.NewIntVar(0, _max_milli(problem, s, max_c * MiB), f"requests_milli[{problem.stages[s].name}]")
                for s in S
            }
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

    def _add_gpu_capacity(self) -> None:
        pb, R = self.pb, self.pb.resolution
        horizon = pb.phases
        grouped = {s for group in pb.exclusive_groups for s in group}
        starts, sizes = self.starts, {}
        for s, st in enumerate(pb.stages):
            if s in grouped:
                starts[s] = self.m.NewIntVar(0, horizon - 1, f"start[{st.name}]")
                sizes[s] = 1
            else:
                starts[s], sizes[s] = 0, horizon
        for group in pb.exclusive_groups:
            self.m.AddAllDifferent(starts[s] for s in group)
        for g, gpu in enumerate(pb.gpus):
            intervals, demands, most_total = [], [], 0
            for s, st in enumerate(pb.stages):
                outside = sum(R * _up(opt.memory.outside_bytes) * self.x[s, o] for o, opt in enumerate(st.options))
                most = R * (_down(gpu.total_bytes) + 2 + max(_up(opt.memory.outside_bytes) for opt in st.options))
                most_total += most
                demand = self.m.NewIntVar(0, most, f"demand[{st.name}][gpu{g}]")
                self.m.Add(demand == _down(gpu.total_bytes) * self.u[s] + 2 * R + outside)
                intervals.append(
                    self.m.NewOptionalFixedSizeIntervalVar(
                        starts[s], sizes[s], self.p[s, g], f"resident[{st.name}][gpu{g}]"
                    )
                )
                demands.append(demand)
            capacity = R * _down(pb.usable_bytes(gpu))
            if self.explain:
                # Relaxable capacity: a large constant capacity, and a blocker interval over
                # the whole horizon that takes all but the real capacity. The blocker is
                # present only under the assumption capacity[gpuN]. (A variable capacity
                # crashed CP-SAT 9.15 here.)
                big = max(capacity, most_total)
                lit = self.assume[f"capacity[gpu{g}]"] = self.m.NewBoolVar(f"capacity[gpu{g}]")
                intervals.append(self.m.NewOptionalFixedSizeIntervalVar(0, horizon, lit, f"blocker[gpu{g}]"))
                demands.append(big - capacity)
                capacity = big
            self.m.AddCumulative(intervals, demands, capacity)

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
                continue
            for o, opt in enumerate(st.options):
                per_request = opt.memory.kv_bytes_per_token * st.max_model_len
                d = gcd(per_request, MILLI * MiB)
                self.m.Add(self.mr[s] * (per_request // d) <= (MILLI * MiB // d) * self.kv[s]).OnlyEnforceIf(
                    self.x[s, o]
                )

    def infeasible_core(self, time_limit_s: float) -> list[str] | None:
        """A minimal set of requirement groups that cannot hold together, or None when all
        of them can (or the solver ran out of time before it could tell)."""
        names = list(self.assume)

        def infeasible(subset: list[str]) -> tuple[bool, list[str]]:
            self.m.ClearAssumptions()
            self.m.AddAssumptions([self.assume[n] for n in subset])
            solver = self.cp.CpSolver()
            solver.parameters.num_workers = 1  # the core is only reported single-threaded
            solver.parameters.random_seed = RANDOM_SEED
            solver.parameters.max_time_in_seconds = time_limit_s
            if solver.Solve(self.m) != self.cp.INFEASIBLE:
                return False, []
            index = {self.assume[n].Index(): n for n in subset}
            core = [index[i] for i in solver.SufficientAssumptionsForInfeasibility() if i in index]
            return True, core or subset

        found, core = infeasible(names)
        if not found:
            return None
        # Deletion pass: drop every group the conflict does not need.
        core = [n for n in names if n in core]
        for name in list(core):
            trial = [n for n in core if n != name]
            if trial and infeasible(trial)[0]:
                core = trial
        return core

    # --- solving -----------------------------------------------------------------

    def solve_lexicographic(self, time_limit_s: float) -> Solution:
        pb = self.pb
        t0 = time.perf_counter()
        deadline = t0 + time_limit_s
        kv_stages = [s for s, st in enumerate(pb.stages) if st.has_kv]
        gen_stages = [s for s, st in enumerate(pb.stages) if not st.has_kv]

        z_max = max([0, *(100 * _max_milli(pb, s, max(g.total_bytes for g in pb.gpus)) for s in kv_stages)])

        z = self.m.NewIntVar(0, z_max, "z")
        for s in kv_stages:
            self.m.Add(pb.stages[s].weight_pct * z <= 100 * self.mr[s])
        if not kv_stages:
            self.m.Add(z == 0)

        phases: list[tuple[str, object, bool]] = [
            ("min weighted headroom", z, True),
            ("total headroom", sum(self.mr[s] for s in kv_stages), True),
            ("generation fractions", sum(self.u[s] for s in gen_stages), False),
        ]
        for s in range(len(pb.stages)):
            code = sum((1 << g) * self.p[s, g] for g in range(len(pb.gpus)))
            phases.append((f"devices of {pb.stages[s].name}", code, False))
        for s in range(len(pb.stages)):
            phases.append((f"fraction of {pb.stages[s].name}", self.u[s], True))
        for s in sorted(self.starts):  # exclusive stages: the earliest slot, in stage order
            if not isinstance(self.starts[s], int):
                phases.append((f"slot of {pb.stages[s].name}", self.starts[s], False))

        status, gap, objective = SolveStatus.OPTIMAL, 0.0, 0
        solver = None
        for i, (_, expr, maximize) in enumerate(phases):
            solver = self.cp.CpSolver()
            solver.parameters.max_time_in_seconds = max(0.05, deadline - time.perf_counter())
            solver.parameters.num_workers = NUM_WORKERS
            solver.parameters.random_seed = RANDOM_SEED
            (self.m.Maximize if maximize else self.m.Minimize)(expr)
            result = solver.Solve(self.m)
            if result == self.cp.INFEASIBLE:
                return Solution(SolveStatus.INFEASIBLE, 0.0, time.perf_counter() - t0, 0, ())
            if result not in (self.cp.OPTIMAL, self.cp.FEASIBLE):
                if i == 0:
                    return Solution(SolveStatus.UNKNOWN, 0.0, time.perf_counter() - t0, 0, ())
                break  # out of time in a tie-break phase: keep the last fixed solution
            value = int(round(solver.ObjectiveValue()))
            if result == self.cp.FEASIBLE:
                status = SolveStatus.FEASIBLE
            if i == 0:
                objective = value
                bound = solver.BestObjectiveBound()
                gap = 0.0 if result == self.cp.OPTIMAL else abs(bound - value) / max(1.0, abs(value))
            # Fix this phase's optimum (or the value found) before the next phase.
            if maximize:
                self.m.Add(expr >= value)
            else:
                self.m.Add(expr <= value)
            self._hint(solver)
        return Solution(
            status=status,
            gap=gap,
            solve_seconds=time.perf_counter() - t0,
            objective=objective,
            assignments=self._read(solver),
        )

    def _hint(self, solver) -> None:
        self.m.ClearHints()
        for var in [*self.x.values(), *self.p.values(), *self.u.values()]:
            self.m.AddHint(var, solver.Value(var))

    def _read(self, solver) -> tuple[StageAssignment, ...]:
        grouped = {s for group in self.pb.exclusive_groups for s in group}
        out = []
        for s, st in enumerate(self.pb.stages):
            option = next(o for o in range(len(st.options)) if solver.BooleanValue(self.x[s, o]))
            gpus = tuple(g for g in range(len(self.pb.gpus)) if solver.BooleanValue(self.p[s, g]))
            out.append(
                StageAssignment(
                    option_index=option,
                    gpus=gpus,
                    util_steps=solver.Value(self.u[s]),
                    kv_mib=solver.Value(self.kv[s]),
                    milli_requests=solver.Value(self.mr[s]),
                    start=solver.Value(self.starts[s]) if s in grouped else None,
                )
            )
        return tuple(out)


def _max_milli(problem: Problem, s: int, max_bytes: int) -> int:
    """Upper bound of m[s]: the whole largest GPU as KV cache at the cheapest TP option."""
    st = problem.stages[s]
    if not st.has_kv:
        return 0
    cheapest = min(opt.memory.kv_bytes_per_token for opt in st.options)
    return MILLI * max_bytes // (cheapest * st.max_model_len)


def infeasible_core(problem: Problem, time_limit_s: float = 10.0) -> list[str] | None:
    """Names of a minimal set of requirement groups of `problem` that conflict (see
    `_Model`): capacity[gpuN], fits[stage], max-model-len[stage], min-concurrency[stage],
    pinned-tp[stage], pinned-devices[stage]. None when the problem is feasible."""
    return _Model(problem, explain=True).infeasible_core(time_limit_s)


def has_solution(problem: Problem, time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> bool:
    """Whether any plan satisfies `problem` (no objective: one quick solve)."""
    model = _Model(problem)
    solver = model.cp.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = NUM_WORKERS
    solver.parameters.random_seed = RANDOM_SEED
    return solver.Solve(model.m) in (model.cp.OPTIMAL, model.cp.FEASIBLE)


def solve(problem: Problem, time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> Solution:
    """Build the CP-SAT model of `problem` and solve it lexicographically. Pure: no I/O."""
    return _Model(problem).solve_lexicographic(time_limit_s)

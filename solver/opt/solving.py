"""Solving a CP-SAT model: the interruptible solver call, and the lexicographic loop that
optimises a model's phases one after another (each fixing the optimum of the one before).
The model itself, its variables and its phases, is cpsat.py."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from enum import Enum

from .. import defaults as D

# The full linear relaxation (the enforced constraints' rows too) bounds the max-min
# objective; without it one worker searched 8 GPUs for minutes. The portfolio starts with
# the subsolver that keeps it (CP-SAT's own first workers drop it). benchmarks/
# solve_times.py measures both against CP-SAT's defaults (TUNED = False).
TUNED = True
LINEARIZATION_LEVEL = 2
SUBSOLVERS = ("max_lp", "reduced_costs", "pseudo_costs", "lb_tree_search", "quick_restart", "default_lp", "core",
              "no_lp")  # in the order workers take them

class SolveStatus(str, Enum):
    OPTIMAL = "optimal"  # every objective phase proven optimal
    FEASIBLE = "feasible"  # a plan, but some phase ran out of time (see gap and notes)
    INFEASIBLE = "infeasible"  # proven: no plan satisfies the constraints
    UNKNOWN = "unknown"  # the time limit came before any plan was found


@dataclass(frozen=True)
class StageAssignment:
    """The solver's answer for one stage: its GPUs are the pool of all its replicas, each
    replica taking a consecutive slice of tensor_parallel_size of them."""

    option_index: int
    gpus: tuple[int, ...]
    util_steps: int
    replicas: int = 1


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
    if TUNED:
        solver.parameters.linearization_level = LINEARIZATION_LEVEL
        solver.parameters.subsolvers.extend(SUBSOLVERS)
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


def lexicographic(model, time_limit_s: float, workers: int) -> Solution:
    """Optimise `model.phases()` in order within one time limit. `model` has `m` (the
    CpModel), `cp` (the cp_model module), `phases()`, `read(solver)` and `hint(solver)`."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    status, gap, objective, notes = SolveStatus.OPTIMAL, 0.0, 0, []
    best = None
    for i, (name, expr, maximize) in enumerate(model.phases()):
        left = deadline - time.perf_counter()
        if left <= 0:
            notes.append(f"phase '{name}' and later not run: time limit reached")
            status = SolveStatus.FEASIBLE
            break
        (model.m.Maximize if maximize else model.m.Minimize)(expr)
        result, solver = run_solver(model.m, left, workers)
        if result == model.cp.INFEASIBLE:
            if i == 0:
                return Solution(SolveStatus.INFEASIBLE, 0.0, time.perf_counter() - t0, 0, ())
            raise RuntimeError(f"phase '{name}' infeasible after a feasible phase")  # a modelling bug
        if result not in (model.cp.OPTIMAL, model.cp.FEASIBLE):
            if i == 0:
                return Solution(SolveStatus.UNKNOWN, 0.0, time.perf_counter() - t0, 0, ())
            # Out of time without a solution: keep the previous phase's plan.
            notes.append(f"phase '{name}' found no solution before the time limit")
            status = SolveStatus.FEASIBLE
            break
        value = solver.Value(expr)  # exact: a tie-break sum can pass a float's 53 bits
        best = model.read(solver)
        if i == 0:
            objective = value
            if result != model.cp.OPTIMAL:
                bound = solver.BestObjectiveBound()
                gap = abs(bound - value) / max(1.0, abs(value))
        if result != model.cp.OPTIMAL:
            status = SolveStatus.FEASIBLE
            notes.append(f"phase '{name}' not proven optimal before the time limit")
        # Fix this phase's value before the next phase, and start from this solution.
        model.m.Add(expr >= value) if maximize else model.m.Add(expr <= value)
        model.hint(solver)
        if result != model.cp.OPTIMAL:
            break  # later phases would fix a value that is not the optimum anyway
    assignments, headroom = best
    return Solution(status, gap, time.perf_counter() - t0, objective, assignments, headroom, tuple(notes))

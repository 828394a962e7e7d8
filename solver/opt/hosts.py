"""Identical hosts, solved as a host pattern and its multiplicity, then laid out host by host.

With `Problem.merge_hosts` (planner: more than defaults.HOST_PATTERN_ABOVE_GPUS GPUs over
several hosts) the hosts that have the same GPUs in the same order and no pinned stage form
one host type: the CP-SAT model's classes span the type's hosts, and a stage holds whole TP
groups over the type, not per host. That model is a relaxation of the per-host one (every
per-host plan counts into one of it, with the same objective values), so its lexicographic
optimum, once laid out on the hosts with every TP group on one host, is the per-host model's
optimum too: the proof carries over. The layout (lay_out) is first-fit decreasing, host by host
in index order, the largest TP groups first; it is deterministic, so the plan is the same for
any worker count. When it cannot place the counts (a class split no host can hold), the
per-host model is solved instead, within the time left, and the plan says so.
"""

from __future__ import annotations

import time
from dataclasses import replace

from .problem import Problem
from .solving import Solution, StageAssignment

FALLBACK_NOTE = "identical hosts could not be laid out as one host pattern: solved host by host"


def lay_out(problem: Problem, assignments: tuple[StageAssignment, ...]) -> tuple[StageAssignment, ...] | None:
    """The assignments with each merged host type's GPUs re-placed so that every stage holds
    whole TP groups on each host, keeping each stage's count of GPUs in every class (so each
    figure the model counted); None when first-fit cannot."""
    classes = problem.gpu_classes()
    class_of = {g: c for c, members in enumerate(classes) for g in members}
    tp = [st.options[a.option_index].tp for st, a in zip(problem.stages, assignments)]
    # stage s's GPUs per class: kept as they are on hosts that are their own type
    need: dict[tuple[int, int], int] = {}
    kept: dict[int, list[int]] = {s: [] for s in range(len(assignments))}
    for s, a in enumerate(assignments):
        for g in a.gpus:
            if problem.host_type(problem.gpus[g]) == problem.gpus[g].node:
                kept[s].append(g)
            else:
                need[class_of[g], s] = need.get((class_of[g], s), 0) + 1
    order = sorted(range(len(assignments)), key=lambda s: (-tp[s], s))
    for node in problem.nodes():  # hosts in index order; a merged type's hosts take its counts in turn
        on = [g for g in problem.gpus if g.node == node]
        if problem.host_type(on[0]) == node:
            continue
        free: dict[int, list[int]] = {}
        for g in on:
            free.setdefault(class_of[g.index], []).append(g.index)
        for s in order:
            while True:
                picked, want = [], tp[s]
                for c in sorted(free):  # one TP group: from this host's classes, in order
                    take = min(len(free[c]), need.get((c, s), 0), want)
                    picked += [(g, c) for g in free[c][:take]]
                    want -= take
                if want or not picked:
                    break
                for g, c in picked:
                    free[c].remove(g)
                    need[c, s] -= 1
                    kept[s].append(g)
    if any(need.values()):
        return None
    return tuple(replace(a, gpus=tuple(sorted(kept[s]))) for s, a in enumerate(assignments))


def solve_merged(problem: Problem, time_limit_s: float, workers: int, solve_one) -> Solution:
    """Solve `problem` (merge_hosts) with `solve_one(problem, seconds, workers)`, lay the
    answer out on the hosts, else solve the per-host problem in the time left."""
    t0 = time.perf_counter()
    solution = solve_one(problem, time_limit_s, workers)
    if not solution.assignments:  # infeasible (the relaxation is: so is every per-host plan) or unknown
        return solution
    laid = lay_out(problem, solution.assignments)
    if laid is not None:
        return replace(solution, assignments=laid)
    left = time_limit_s - (time.perf_counter() - t0)
    full = solve_one(replace(problem, merge_hosts=False), left, workers)
    return replace(full, solve_seconds=time.perf_counter() - t0, notes=(*full.notes, FALLBACK_NOTE))

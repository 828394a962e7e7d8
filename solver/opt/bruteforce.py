"""Exhaustive search over small problems: the test oracle for the CP-SAT model.

It enumerates every TP option, replica count, GPU set and fraction step of every stage
and keeps the best (smallest weighted headroom, total headroom, least sum of fractions), with the
accounting `cpsat` documents (whole MiB, needs rounded up, capacities down, 2 MiB per
stage for vLLM's ceil) and the co-resident sets of residency.py. It shares no code with
the CP-SAT model; the start-up model re-checks the accounting in bytes. Exponential:
meant for 2-4 GPUs, 2-3 stages, coarse resolutions.

Replicas: k copies of a stage on k x tp GPUs, sharing the fraction; each counts the KV
of the pool's smallest GPU as headroom on its own (capped). Hosts: a stage holds whole TP
groups on each host; with shared_gpus off, no GPU holds two stages.
"""

from __future__ import annotations

from itertools import combinations, product

from ..vllm.facts import MiB
from .problem import MILLI, Problem, StageProblem, TpOption


def _up(nbytes: int) -> int:
    return -(-nbytes // MiB)


def _choices(problem: Problem, st: StageProblem):
    """Every (option, gpus, util, kv MiB, replicas) of one stage feasible on its own."""
    R = problem.resolution
    for option, opt in enumerate(st.options):
        if st.pinned_tp is not None and opt.tp != st.pinned_tp:
            continue
        for k in st.replica_counts():
            if k < st.min_replicas:  # a target rate's minimum (StageProblem.min_replicas)
                continue
            for gpus in combinations(range(len(problem.gpus)), k * opt.tp):
                if st.pinned_devices is not None and tuple(gpus) != tuple(st.pinned_devices):
                    continue
                hosts = [problem.gpus[g].node for g in gpus]
                if any(hosts.count(h) % opt.tp for h in set(hosts)):  # whole TP groups on each host
                    continue
                for u in range(1, R + 1):
                    kv = _kv_mib(problem, st, opt, gpus, u)
                    if kv is not None:
                        yield option, gpus, u, kv, k


def _kv_mib(problem: Problem, st: StageProblem, opt: TpOption, gpus, u: int) -> int | None:
    R = problem.resolution
    budgets = [(problem.gpus[g].total_bytes // MiB) * u - R * _up(opt.memory.inside_bytes) for g in gpus]
    if min(budgets) < 0:
        return None
    kv = min(budgets) // R if st.has_kv else 0
    if st.has_kv and kv < _up(st.min_kv_bytes_for(opt, max(1, st.min_requests))):
        return None
    return kv


def _fits(problem: Problem, picks) -> bool:
    R = problem.resolution
    if not problem.shared_gpus:
        held = [g for _, gpus, *_ in picks for g in gpus]
        if len(held) != len(set(held)):
            return False
    for g, gpu in enumerate(problem.gpus):
        capacity = R * (problem.usable_bytes(gpu) // MiB)
        for members in problem.coresident:
            used = 0
            for s in members:
                option, gpus, u, _, _ = picks[s]
                if g in gpus:
                    st = problem.stages[s]
                    used += (gpu.total_bytes // MiB) * u + 2 * R + R * _up(st.options[option].memory.outside_bytes)
            if used > capacity:
                return False
    return True


def best_objective(problem: Problem) -> tuple[int, int, int] | None:
    """(z, total headroom, sum of fractions) of the optimum, in the CP-SAT model's units
    (the sum of fractions is minimised, after the number of replicas); None when infeasible."""
    per_stage = [list(_choices(problem, st)) for st in problem.stages]
    best = None
    for picks in product(*per_stage):
        if not _fits(problem, picks):
            continue
        headroom = []
        for st, (option, _, _, kv, k) in zip(problem.stages, picks):
            if st.has_kv:
                per_request = st.options[option].memory.kv_bytes_per_token * st.max_model_len
                headroom.append((st, st.headroom_milli(MILLI * kv * MiB // per_request, k)))
        z = min((100 * h // st.weight_pct for st, h in headroom), default=0)
        replicas = sum(k for *_, k in picks)
        value = (z, sum(h for _, h in headroom), -replicas, -sum(u for _, _, u, _, _ in picks))
        if best is None or value > best:
            best = value
    return None if best is None else (best[0], best[1], -best[3])

"""Exhaustive search over small problems: the test oracle for the CP-SAT model.

It enumerates every TP option, GPU set, time slot and fraction step of every stage and
keeps the best (smallest weighted headroom, total headroom) pair, with the accounting
`cpsat` documents (whole MiB, needs rounded up, capacities down, 2 MiB per stage for
vLLM's ceil). The search is independent of CP-SAT; `verify` independently re-checks the
accounting in bytes. Exponential: meant for 2-3 GPUs, 2-3 stages, coarse resolutions.
"""

from __future__ import annotations

from itertools import combinations, product

from .problem import MILLI, Problem, StageProblem, TpOption
from .vllm_facts import MiB


def _up(nbytes: int) -> int:
    return -(-nbytes // MiB)


def _choices(problem: Problem, s: int, st: StageProblem):
    """Every (option, gpus, slot, util) of one stage that is feasible on its own."""
    R = problem.resolution
    grouped = [grp for grp in problem.exclusive_groups if s in grp]
    slots = range(problem.phases) if grouped else [None]
    for option, opt in zip(range(len(st.options)), st.options):
        for gpus in combinations(range(len(problem.gpus)), opt.tp):
            for slot in slots:
                for u in range(1, R + 1):
                    kv = _kv_mib(problem, st, opt, gpus, u)
                    if kv is None:
                        continue
                    yield option, gpus, slot, u, kv


def _kv_mib(problem: Problem, st: StageProblem, opt: TpOption, gpus, u: int) -> int | None:
    R = problem.resolution
    budgets = [(problem.gpus[g].total_bytes // MiB) * u - R * _up(opt.memory.inside_bytes) for g in gpus]
    if min(budgets) < 0:
        return None
    kv = min(budgets) // R if st.has_kv else 0
    if kv < _up(st.min_kv_bytes(opt)):
        return None
    return kv


def _fits(problem: Problem, picks) -> bool:
    R = problem.resolution
    for g, gpu in enumerate(problem.gpus):
        capacity = R * ((gpu.total_bytes - problem.reserve_bytes) // MiB)
        for t in range(problem.phases):
            used = 0
            for st, (option, gpus, slot, u, _) in zip(problem.stages, picks):
                if g in gpus and (slot is None or slot == t):
                    used += (gpu.total_bytes // MiB) * u + 2 * R + R * _up(st.options[option].memory.outside_bytes)
            if used > capacity:
                return False
    return True


def _distinct_slots(problem: Problem, picks) -> bool:
    return all(len({picks[s][2] for s in grp}) == len(grp) for grp in problem.exclusive_groups)


def best_objective(problem: Problem) -> tuple[int, int] | None:
    """(z, total) of the optimum, in the CP-SAT model's units; None when infeasible."""
    per_stage = [list(_choices(problem, s, st)) for s, st in enumerate(problem.stages)]
    best = None
    for picks in product(*per_stage):
        if not _distinct_slots(problem, picks) or not _fits(problem, picks):
            continue
        milli = []
        for st, (option, _, _, _, kv) in zip(problem.stages, picks):
            if st.has_kv:
                per_request = st.options[option].memory.kv_bytes_per_token * st.max_model_len
                milli.append((st, MILLI * kv * MiB // per_request))
        z = min((100 * m // st.weight_pct for st, m in milli), default=0)
        value = (z, sum(m for _, m in milli))
        if best is None or value > best:
            best = value
    return best

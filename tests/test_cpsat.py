"""The CP-SAT model against exhaustive search on small instances with known structure."""

from __future__ import annotations

import pytest

from omni_autoconf.opt import cpsat as cpsat
from omni_autoconf.opt.bruteforce import best_objective
from omni_autoconf.inputs.gpus import Gpu
from omni_autoconf.memory.stage_memory import StageMemory
from omni_autoconf.opt.problem import Problem, StageProblem, TpOption
from omni_autoconf.vllm.facts import GiB


def mem(weights_gib: float, kv_per_token: int, outside_gib: float = 0.5, act_gib: float = 0.5) -> StageMemory:
    return StageMemory(
        weights_bytes=int(weights_gib * GiB),
        activation_bytes=int(act_gib * GiB),
        non_torch_bytes=0,
        persistent_bytes=0,
        runner_bytes=0,
        context_bytes=int(outside_gib * GiB),
        nccl_bytes=0,
        graph_reserve_bytes=0,
        kv_bytes_per_token=kv_per_token,
    )


def kv_stage(i, name, weights_gib, kv_per_token, tps=(1,), mml=8192, weight_pct=100, min_requests=1, cap=None,
             max_replicas=1):
    options = tuple(TpOption(tp, mem(weights_gib / tp, kv_per_token // tp)) for tp in tps)
    return StageProblem(i, name, True, options, mml, min_requests=min_requests, weight_pct=weight_pct,
                        headroom_cap_requests=cap, max_replicas=max_replicas)


def gen_stage(i, name, weights_gib):
    return StageProblem(i, name, False, (TpOption(1, mem(weights_gib, 0)),), 8192)


def gpus(*sizes_gib):
    return tuple(Gpu(i, f"G{size}", int(size * GiB)) for i, size in enumerate(sizes_gib))


CASES = {
    "two stages, two equal GPUs": Problem(
        gpus(24, 24), (kv_stage(0, "a", 10, 65536), kv_stage(1, "b", 4, 16384)), 20, 1 * GiB
    ),
    "TP choice, uneven GPUs": Problem(
        gpus(40, 24), (kv_stage(0, "a", 30, 131072, tps=(1, 2)), kv_stage(1, "b", 3, 32768)), 20, 1 * GiB
    ),
    "three stages with a generation stage, weights": Problem(
        gpus(24, 16),
        (kv_stage(0, "a", 8, 65536, weight_pct=200), kv_stage(1, "b", 2, 16384), gen_stage(2, "c", 1)),
        10,
        int(0.5 * GiB),
    ),
    "three GPUs, TP over any pair": Problem(
        gpus(16, 16, 24), (kv_stage(0, "a", 12, 65536, tps=(1, 2)), kv_stage(1, "b", 6, 32768)), 10, 1 * GiB
    ),
    "exclusive pair on one GPU": Problem(
        gpus(24), (kv_stage(0, "a", 10, 65536), kv_stage(1, "b", 10, 65536)), 20, 1 * GiB, ((0, 1),)
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_cpsat_finds_the_brute_force_optimum(name):
    problem = CASES[name]
    expected = best_objective(problem)
    solution = cpsat.solve(problem, time_limit_s=20)
    assert expected is not None
    assert solution.status is cpsat.SolveStatus.OPTIMAL
    assert _objectives(problem, solution) == expected


def _objectives(problem, solution) -> tuple[int, int, int]:
    """(z, total headroom, sum of fractions) of a CP-SAT solution, as bruteforce counts them."""
    headroom = [h for h, st in zip(solution.headroom_milli, problem.stages) if st.has_kv]
    return solution.objective, sum(headroom), sum(a.util_steps for a in solution.assignments)


def test_infeasible_instance_is_reported_by_both():
    problem = Problem(gpus(16), (kv_stage(0, "a", 15, 65536),), 20, 1 * GiB)
    assert best_objective(problem) is None
    assert cpsat.solve(problem, 5).status is cpsat.SolveStatus.INFEASIBLE


def test_exclusive_stages_are_not_summed_but_co_resident_ones_are():
    shared = Problem(gpus(24), (kv_stage(0, "a", 10, 65536), kv_stage(1, "b", 10, 65536)), 20, 1 * GiB)
    apart = Problem(shared.gpus, shared.stages, 20, 1 * GiB, ((0, 1),))
    assert cpsat.solve(shared, 5).status is cpsat.SolveStatus.INFEASIBLE  # 2 x 10 GiB + KV > 23 GiB
    solution = cpsat.solve(apart, 5)
    assert solution.status is cpsat.SolveStatus.OPTIMAL
    assert sum(a.util_steps for a in solution.assignments) > apart.resolution  # their fractions overlap in time


def test_min_requests_is_enforced():
    base = Problem(gpus(24), (kv_stage(0, "a", 10, 65536, min_requests=1),), 100, 1 * GiB)
    solution = cpsat.solve(base, 5)
    most = solution.headroom_milli[0] // 1000
    too_many = Problem(base.gpus, (kv_stage(0, "a", 10, 65536, min_requests=most + 1),), 100, 1 * GiB)
    assert cpsat.solve(too_many, 5).status is cpsat.SolveStatus.INFEASIBLE


@pytest.mark.slow
def test_same_problem_same_answer():
    problem = CASES["three GPUs, TP over any pair"]
    first, second = cpsat.solve(problem, 10), cpsat.solve(problem, 10)
    assert first.assignments == second.assignments


def test_kv_respects_mib_accounting():
    problem = CASES["two stages, two equal GPUs"]
    solution = cpsat.solve(problem, 5)
    for a, h, st in zip(solution.assignments, solution.headroom_milli, problem.stages):
        opt = st.options[a.option_index]
        for g in a.gpus:
            budget = problem.gpus[g].total_bytes * a.util_steps // problem.resolution - opt.memory.inside_bytes
            assert h * opt.memory.kv_bytes_per_token * st.max_model_len <= 1000 * budget


def _random_problem(seed: int) -> Problem:
    import random

    rnd = random.Random(seed)
    sizes = [rnd.choice([16, 24, 40, 80]) for _ in range(rnd.choice([2, 3]))]
    stages = [
        kv_stage(0, "a", rnd.uniform(2, 30), rnd.choice([16384, 32768, 65536, 131072]), tps=(1, 2),
                 mml=rnd.choice([4096, 8192, 32768]), weight_pct=rnd.choice([100, 150, 300])),
        kv_stage(1, "b", rnd.uniform(1, 10), rnd.choice([8192, 20480]), mml=rnd.choice([4096, 16384])),
    ]
    if rnd.random() < 0.5:
        stages.append(gen_stage(2, "c", rnd.uniform(0.2, 2)))
    if rnd.random() < 0.4:  # no prefix caching: KV beyond max_num_seqs requests is no headroom
        stages[1] = kv_stage(1, "b", rnd.uniform(1, 10), rnd.choice([8192, 20480]), mml=rnd.choice([4096, 16384]),
                             cap=rnd.choice([1, 2, 4]))
    groups = ((0, 1),) if rnd.random() < 0.3 else ()
    return Problem(gpus(*sizes), tuple(stages), 10, int(rnd.uniform(0.5, 3) * GiB), groups)


def _assert_brute_force_agrees(problem: Problem):
    """CP-SAT's optimum is the enumerator's (or both prove there is none); the solution."""
    expected = best_objective(problem)
    solution = cpsat.solve(problem, time_limit_s=20)
    if expected is None:
        assert solution.status is cpsat.SolveStatus.INFEASIBLE
        return solution
    assert solution.status is cpsat.SolveStatus.OPTIMAL
    assert _objectives(problem, solution) == expected
    return solution


@pytest.mark.parametrize("seed", range(12))
def test_cpsat_matches_brute_force_on_random_small_instances(seed):
    _assert_brute_force_agrees(_random_problem(seed))


@pytest.mark.parametrize("seed", range(4))
def test_an_api_process_front_end_on_gpu_0_binds_there_and_agrees_with_brute_force(seed):
    """GPU 0 loses the front-end's bytes; GPUs of its kind no longer swap with it."""
    from dataclasses import replace

    base = _random_problem(seed)
    sizes = [g.total_bytes // GiB for g in base.gpus]
    problem = replace(Problem(gpus(sizes[0], *sizes), base.stages, base.resolution, base.reserve_bytes,
                              base.exclusive_groups), frontend_bytes=6 * GiB)
    assert problem.usable_bytes(problem.gpus[0]) == problem.usable_bytes(problem.gpus[1]) - 6 * GiB
    assert [0] in problem.gpu_classes()
    _assert_brute_force_agrees(problem)


def _random_replica_problem(seed: int) -> Problem:
    """Up to 4 GPUs of one or two sizes, stages that may run up to 3 replicas."""
    import random

    rnd = random.Random(1000 + seed)
    sizes = [rnd.choice([24, 40]) for _ in range(rnd.choice([3, 4]))]
    if rnd.random() < 0.5:
        sizes = [sizes[0]] * len(sizes)
    stages = [
        kv_stage(0, "a", rnd.uniform(4, 20), rnd.choice([32768, 65536, 131072]), tps=(1, 2),
                 mml=rnd.choice([8192, 32768]), weight_pct=rnd.choice([100, 200]), max_replicas=rnd.choice([1, 2, 3])),
        kv_stage(1, "b", rnd.uniform(1, 6), rnd.choice([8192, 20480]), mml=rnd.choice([4096, 16384]),
                 cap=rnd.choice([None, 1, 2]), max_replicas=rnd.choice([2, 3])),
    ]
    if rnd.random() < 0.4:
        stages.append(gen_stage(2, "c", rnd.uniform(0.2, 2)))
    return Problem(gpus(*sizes), tuple(stages), 8, int(rnd.uniform(0.5, 2) * GiB))


@pytest.mark.parametrize("seed", range(10))
def test_cpsat_matches_brute_force_with_replicas(seed):
    problem = _random_replica_problem(seed)
    solution = _assert_brute_force_agrees(problem)
    for st, a in zip(problem.stages, solution.assignments):  # the pool holds replicas x TP GPUs
        assert len(a.gpus) == a.replicas * st.options[a.option_index].tp


def test_replicas_raise_the_binding_stage():
    """Two identical GPUs: one stage at one replica leaves a GPU idle; two replicas use it."""
    one = Problem(gpus(24, 24), (kv_stage(0, "a", 10, 65536),), 20, 1 * GiB)
    two = Problem(one.gpus, (kv_stage(0, "a", 10, 65536, max_replicas=2),), 20, 1 * GiB)
    single, double = cpsat.solve(one, 5), cpsat.solve(two, 5)
    assert double.assignments[0].replicas == 2 and double.assignments[0].gpus == (0, 1)
    assert double.objective == 2 * single.objective


def _random_host_problem(seed: int) -> Problem:
    """Two or three hosts of 1-2 GPUs, one stage per GPU (as the planner asks over hosts)."""
    import random

    rnd = random.Random(2000 + seed)
    sizes, hosts = [], []
    for h in range(rnd.choice([2, 3])):
        for _ in range(rnd.choice([1, 2])):
            sizes.append(rnd.choice([24, 40]))
            hosts.append(f"h{h}")
    gpus_ = tuple(Gpu(i, f"G{size}", int(size * GiB), hosts[i]) for i, size in enumerate(sizes))
    stages = (kv_stage(0, "a", rnd.uniform(4, 20), rnd.choice([32768, 65536]), tps=(1, 2), mml=8192,
                       max_replicas=rnd.choice([1, 2, 3])),
              kv_stage(1, "b", rnd.uniform(1, 6), 8192, mml=4096, cap=rnd.choice([None, 2]), max_replicas=2))
    return Problem(gpus_, stages, 8, int(1 * GiB), shared_gpus=False)


@pytest.mark.parametrize("seed", range(8))
def test_cpsat_matches_brute_force_over_hosts(seed):
    problem = _random_host_problem(seed)
    solution = _assert_brute_force_agrees(problem)
    for st, a in zip(problem.stages, solution.assignments):
        nodes = [problem.gpus[g].node for g in a.gpus]
        assert all(nodes.count(h) % st.options[a.option_index].tp == 0 for h in set(nodes))


def test_identical_hosts_are_ordered_in_the_model():
    """The symmetry rule itself: the second of two identical hosts may not hold a stage
    while the first holds none (without the rule the model would allow it)."""
    gpus_ = tuple(Gpu(i, "G40", 40 * GiB, f"h{i // 2}") for i in range(4))
    problem = Problem(gpus_, (kv_stage(0, "a", 8, 65536),), 10, 1 * GiB, shared_gpus=False)
    model = cpsat.Model(problem)
    first, second = [[c for c, members in enumerate(model.classes) if problem.gpus[members[0]].node == h]
                     for h in ("h0", "h1")]
    model.m.Add(sum(v for (c, _), v in model.n.items() if c in first) == 0)
    model.m.Add(sum(v for (c, _), v in model.n.items() if c in second) >= 1)
    status, _ = cpsat.run_solver(model.m, 5, 1)
    assert status == model.cp.INFEASIBLE


def _random_mixed_kind_problem(seed: int) -> Problem:
    """Up to 4 GPUs of three kinds, replicas and TP choices, memory tight enough that the
    max-min phase's memory cuts (bounds.add_memory_bound) and the pool's smallest class bind."""
    import random

    rnd = random.Random(4000 + seed)
    sizes = [rnd.choice([16, 24, 40]) for _ in range(rnd.choice([3, 4]))]
    stages = [
        kv_stage(0, "a", rnd.uniform(6, 24), rnd.choice([32768, 65536]), tps=(1, 2), mml=rnd.choice([8192, 16384]),
                 weight_pct=rnd.choice([100, 200]), max_replicas=rnd.choice([2, 3])),
        kv_stage(1, "b", rnd.uniform(1, 8), rnd.choice([8192, 20480]), mml=rnd.choice([4096, 16384]),
                 cap=rnd.choice([None, 1, 3]), max_replicas=rnd.choice([1, 2, 3])),
    ]
    if rnd.random() < 0.5:
        stages.append(gen_stage(2, "c", rnd.uniform(0.5, 4)))
    return Problem(gpus(*sizes), tuple(stages), 8, int(rnd.uniform(0.5, 2) * GiB))


@pytest.mark.parametrize("seed", range(10))
def test_memory_cuts_keep_the_brute_force_optimum_on_mixed_kinds(seed):
    _assert_brute_force_agrees(_random_mixed_kind_problem(seed))


@pytest.mark.parametrize("seed", range(6))
def test_memory_cuts_are_redundant(seed, monkeypatch):
    """The cuts only tighten the relaxation: the same plan, to the byte, without them."""
    for problem in (_random_mixed_kind_problem(seed), _random_replica_problem(seed), _random_problem(seed)):
        with_cuts = cpsat.solve(problem, time_limit_s=20)
        monkeypatch.setattr(cpsat, "add_memory_bound", lambda model: None)
        without = cpsat.solve(problem, time_limit_s=20)
        monkeypatch.undo()
        assert (with_cuts.status, with_cuts.objective, with_cuts.assignments, with_cuts.headroom_milli) == (
            without.status, without.objective, without.assignments, without.headroom_milli)

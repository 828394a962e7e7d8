"""Fleet scale (issue 22): identical hosts solved as a host type with a multiplicity give the
same optimum as the per-host model and the brute-force oracle on small instances, with every
TP group on one host; the catalog index a run reads agrees with the whole catalog; a run loads
only the entry it names."""

from __future__ import annotations

import random
import subprocess
import sys
from dataclasses import replace

import pytest

from omni_autoconf import defaults as D
from omni_autoconf.inputs.gpus import Gpu, parse_inventory
from omni_autoconf.opt import cpsat
from omni_autoconf.opt.bruteforce import best_objective
from omni_autoconf.opt.hosts import FALLBACK_NOTE, lay_out
from omni_autoconf.opt.problem import Problem
from omni_autoconf.vllm.facts import GiB

from test_cpsat import _objectives, gen_stage, kv_stage


def _fleet(seed: int, frontend: bool = False) -> Problem:
    """2-3 identical hosts of 1-3 GPUs (maybe two kinds per host), sometimes one odd host."""
    rnd = random.Random(3000 + seed)
    shape = [rnd.choice([24, 40]) for _ in range(rnd.choice([1, 2, 3]))]
    hosts = [shape] * rnd.choice([2, 3])
    if rnd.random() < 0.3:
        hosts.append([rnd.choice([24, 40])])
    gpus = []
    for h, sizes in enumerate(hosts):
        for size in sizes:
            gpus.append(Gpu(len(gpus), f"G{size}", int(size * GiB), f"h{h}"))
    stages = [kv_stage(0, "a", rnd.uniform(4, 20), rnd.choice([32768, 65536]), tps=(1, 2), mml=8192,
                       max_replicas=rnd.choice([1, 2, 3])),
              kv_stage(1, "b", rnd.uniform(1, 6), 8192, mml=4096, cap=rnd.choice([None, 2]), max_replicas=2)]
    if rnd.random() < 0.3:
        stages.append(gen_stage(2, "c", rnd.uniform(0.2, 2)))
    return Problem(tuple(gpus), tuple(stages), 8, int(1 * GiB), shared_gpus=False,
                   frontend_bytes=int(3 * GiB) if frontend else 0, merge_hosts=True)


def _whole_groups(problem: Problem, solution) -> None:
    for st, a in zip(problem.stages, solution.assignments):
        nodes = [problem.gpus[g].node for g in a.gpus]
        assert len(a.gpus) == a.replicas * st.options[a.option_index].tp
        assert all(nodes.count(h) % st.options[a.option_index].tp == 0 for h in set(nodes))


@pytest.mark.parametrize("seed", range(10))
def test_merged_hosts_give_the_oracle_optimum(seed):
    _agrees(seed)


def _agrees(seed: int) -> bool:
    """The merged model's optimum is the per-host model's and the oracle's; whether it was laid out."""
    problem = _fleet(seed, frontend=seed % 3 == 0)
    assert len(problem.host_types()) < len(problem.nodes())
    expected = best_objective(problem)
    merged = cpsat.solve(problem, time_limit_s=20, workers=2)
    per_host = cpsat.solve(replace(problem, merge_hosts=False), time_limit_s=20, workers=2)
    if expected is None:
        assert merged.status is per_host.status is cpsat.SolveStatus.INFEASIBLE
        return False
    assert merged.status is cpsat.SolveStatus.OPTIMAL  # laid out, or solved host by host (FALLBACK_NOTE)
    assert _objectives(problem, merged) == _objectives(problem, per_host) == expected
    _whole_groups(problem, merged)
    return FALLBACK_NOTE not in merged.notes


def test_most_small_fleets_are_laid_out_without_the_fallback():
    laid = [_agrees(seed) for seed in range(10)]
    assert sum(bool(x) for x in laid) >= 4, laid


def test_lay_out_refuses_what_no_host_holds():
    """Two hosts of 2 GPUs; a TP-2 stage counted as one GPU on each host cannot be laid out."""
    gpus = tuple(Gpu(i, "G40", 40 * GiB, f"h{i // 2}") for i in range(4))
    problem = Problem(gpus, (kv_stage(0, "a", 8, 65536, tps=(2,)),), 10, 1 * GiB, shared_gpus=False,
                      merge_hosts=True)
    split = (cpsat.StageAssignment(0, (0, 2), 5),)  # one GPU per host: the class count is 2, as one group's
    assert lay_out(problem, split) == (cpsat.StageAssignment(0, (0, 1), 5),)
    whole = (cpsat.StageAssignment(0, (0, 1, 2), 5),)  # 3 GPUs: no host holds a group of 2 and a group of 1
    assert lay_out(problem, whole) is None


def test_a_fleet_of_512_gpus_is_accepted_and_merged():
    gpus = parse_inventory("8xH100-80GB", 64)
    assert len(gpus) == 512 <= D.MAX_GPUS
    problem = Problem(tuple(gpus), (kv_stage(0, "a", 8, 65536),), 100, 1 * GiB, shared_gpus=False, merge_hosts=True)
    assert len(problem.host_types()) == 1 and len(problem.gpu_classes()) == 1


def test_catalog_index_agrees_with_the_catalog():
    from omni_autoconf.inputs.catalog import catalog_heads, catalog_names, model_catalog

    full = model_catalog()
    assert list(catalog_names()) == list(full)
    for name, head in catalog_heads().items():
        spec = full[name]
        assert (head.hf_id, head.model_arch, list(head.match), head.reads_checkpoint) == \
            (spec.hf_id, spec.model_arch, list(spec.match), bool(spec.checkpoint_prefixes)), name


def test_a_plan_loads_only_its_entry():
    code = ("import sys\nfrom omni_autoconf.inputs import catalog\n"
            "from omni_autoconf.inputs.model_source import resolve\n"
            "resolve('qwen3-omni-moe-thinking')\n"
            "print(catalog._entry.cache_info().currsize, catalog.model_catalog.cache_info().currsize, "
            "catalog.catalog_heads.cache_info().currsize)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1", "0", "0"]

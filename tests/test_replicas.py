"""Replicas (vLLM-Omni 0.20+ num_replicas): what they buy, and that the files we emit
split into the replicas we planned by the vLLM-Omni wheel's own functions, parsed from
the wheel of each version (skipped offline)."""

from __future__ import annotations

import ast
import logging

import pytest
import yaml

from omni_autoconf.cli.main import main
from omni_autoconf.planning.check import split_replicas
from omni_autoconf.inputs.configfile import read_config
from omni_autoconf.planning.check import check_config
from omni_autoconf.planning.planner import plan
from omni_autoconf.emit.render import RENDERERS, render_deploy
from omni_autoconf.emit.summary import render_json
from omni_autoconf.vllm.facts import omni_version

from conftest import make_request
from wheels import load_stage_config, source

from click.testing import CliRunner

REPLICA_VERSIONS = ["0.20", "0.22", "0.24", "0.26", "0.28", "0.30"]


def _wheel_functions(version: str, path: str, names: set[str], **globals_) -> dict:
    """Functions and classes `names` of a wheel module, executed on their own (the
    module's imports are not needed by them; `globals_` supplies what they use)."""
    text = source(version, path)
    assert text is not None, f"{path} missing in {version}"
    tree = ast.parse(text)
    body = [node for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names]
    assert {n.name for n in body} == names, f"{version} {path}: found {[n.name for n in body]}"
    space = {"Any": object, "RoleKey": str, **globals_}
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), space)
    return space


def _splitter(version: str):
    return _wheel_functions(version, "vllm_omni/engine/stage_init_utils.py",
                            {"split_devices_for_replicas"})["split_devices_for_replicas"]


def _layout_check(version: str):
    """composable_parallel.check_device_layout (0.26+; called for every LLM stage from 0.28)."""
    space = _wheel_functions(version, "vllm_omni/config/composable_parallel/apply.py",
                             {"StrategyApplyError", "_fail", "_parse_device_count", "check_device_layout"},
                             logger=logging.getLogger("apply"))
    return space["check_device_layout"]


def _smallest_headroom(result) -> float:
    return min(sp.headroom for sp in result.stages if sp.stage.has_kv_cache)


# --- what replicas buy ------------------------------------------------------------------


def test_replicas_grow_the_binding_headroom_on_16_gpus():
    one = plan(make_request("qwen3-omni-moe", "16xH100-80GB", replicas="1"))
    auto = plan(make_request("qwen3-omni-moe", "16xH100-80GB", replicas="auto"))
    assert auto.status == "optimal"
    assert _smallest_headroom(auto) >= 2.5 * _smallest_headroom(one)
    used = {d for sp in auto.stages for d in sp.devices}
    assert len(used) == 16


def test_the_default_adds_no_replica_that_adds_no_headroom():
    default = plan(make_request("qwen3-omni-moe", "2xH100-80GB"))
    single = plan(make_request("qwen3-omni-moe", "2xH100-80GB", replicas="1"))
    assert all(sp.num_replicas == 1 for sp in default.stages)
    assert [(sp.devices, sp.tensor_parallel_size, sp.util_steps) for sp in default.stages] == [
        (sp.devices, sp.tensor_parallel_size, sp.util_steps) for sp in single.stages]


def test_the_default_takes_replicas_where_one_pipeline_leaves_a_gpu_idle():
    single = plan(make_request("qwen3-omni-moe", "8xH100-80GB", replicas="1"))
    assert len({d for sp in single.stages for d in sp.devices}) < 8
    default = plan(make_request("qwen3-omni-moe", "8xH100-80GB"))
    assert len({d for sp in default.stages for d in sp.devices}) == 8
    assert _smallest_headroom(default) > _smallest_headroom(single)


def test_fixed_replicas_give_every_stage_that_many():
    result = plan(make_request("qwen2.5-omni-7b", "6xH100-80GB", replicas="2"))
    assert [sp.num_replicas for sp in result.stages] == [2] * len(result.stages)
    for sp in result.stages:
        assert len(sp.devices) == 2 * sp.tensor_parallel_size
        assert len(sp.replica_kv_tokens) == (2 if sp.stage.has_kv_cache else 0)


def test_a_mixed_pool_gives_each_replica_the_kv_of_its_own_gpus():
    """Replicas share one fraction: mixing GPU sizes in a pool keeps GPUs from idling,
    and the start-up model gives the replica on the larger GPU more KV than the other."""
    result = plan(make_request("qwen2.5-omni-7b", "4xH100-80GB,4xL40S", replicas="auto"))
    assert len({d for sp in result.stages for d in sp.devices}) == 8
    mixed = [sp for sp in result.stages if sp.stage.has_kv_cache and sp.num_replicas > 1
             and len({result.gpus[d].gpu.total_bytes for d in sp.devices}) > 1]
    assert mixed
    for sp in mixed:
        sizes = [result.gpus[group[0]].gpu.total_bytes for group in sp.replica_devices()]
        tokens = list(sp.replica_kv_tokens)
        big, small = sizes.index(max(sizes)), sizes.index(min(sizes))
        assert tokens[big] > tokens[small]


def test_replicas_on_a_version_without_them_are_refused():
    runner = CliRunner()
    done = runner.invoke(main, ["--gpus", "4xH100-80GB", "--model", "qwen3-omni-moe", "--omni-version", "0.16",
                                "--replicas", "2"])
    assert done.exit_code == 2
    assert "num_replicas is read from 0.20" in done.output and "load balancer" in done.output


def test_json_lists_each_replica():
    result = plan(make_request("qwen3-omni-moe", "8xH100-80GB"))
    import json

    doc = json.loads(render_json(result))
    for stage, sp in zip(doc["stages"], result.stages):
        assert stage["num_replicas"] == sp.num_replicas == len(stage["replicas"])
        assert [r["devices"] for r in stage["replicas"]] == [list(d) for d in sp.replica_devices()]
        if sp.stage.has_kv_cache:
            assert sum(r["headroom"] for r in stage["replicas"]) == pytest.approx(stage["headroom"], abs=1e-3)


def test_check_accepts_a_replica_plan_and_finds_the_same_kv(tmp_path):
    result = plan(make_request("qwen3-omni-moe", "8xH100-80GB"))
    request = result.request
    path = tmp_path / "plan.yaml"
    path.write_text(render_deploy(result))
    report = check_config(request.pipeline, list(request.gpus), request.version, read_config(str(path)),
                          parallel_init=True, buffer_bytes=request.buffer_bytes)
    assert report.problems == ()
    assert [o.kv_cache_tokens for o in report.stages] == [sp.kv_cache_tokens for sp in result.stages]


# --- the files, against the wheel ---------------------------------------------------------


@pytest.mark.parametrize("version", REPLICA_VERSIONS)
def test_deploy_replica_file_splits_as_planned_in_that_version(tmp_path, version):
    result = plan(make_request("qwen3-omni-moe", "8xH100-80GB", version, schema="deploy"))
    assert any(sp.num_replicas > 1 for sp in result.stages)
    path = tmp_path / "deploy.yaml"
    path.write_text(render_deploy(result))
    loaded = load_stage_config(version).load_deploy_config(str(path))
    split = _splitter(version)
    check = _layout_check(version) if source(version, "vllm_omni/config/composable_parallel/apply.py") else None
    for stage, sp in zip(loaded.stages, result.stages):
        assert stage.num_replicas == sp.num_replicas
        got = split(stage.devices, stage.num_replicas, sp.tensor_parallel_size, stage.stage_id)
        assert got == [",".join(map(str, d)) for d in sp.replica_devices()]
        if check is not None:
            check(stage.devices, tensor_parallel_size=sp.tensor_parallel_size, data_parallel_size=1,
                  pipeline_parallel_size=1, num_replicas=stage.num_replicas, role=f"stage-{stage.stage_id}")


@pytest.mark.parametrize("version", ["0.20", "0.22", "0.24"])  # qwen3's legacy wiring ends at 0.24
def test_legacy_replica_file_splits_as_planned_in_that_version(version):
    result = plan(make_request("qwen3-omni-moe", "8xH100-80GB", version, schema="stage-args"))
    doc = yaml.safe_load(RENDERERS["stage-args"](result))
    split = _splitter(version)
    for entry, sp in zip(doc["stage_args"], result.stages):
        runtime = entry["runtime"]
        assert runtime.get("num_replicas", 1) == sp.num_replicas
        got = split(runtime["devices"], runtime.get("num_replicas", 1), sp.tensor_parallel_size, entry["stage_id"])
        assert got == [",".join(map(str, d)) for d in sp.replica_devices()]


CASES = [((0, 1, 2, 3), 2, 2), ((0, 1), 2, 2), ((1, 0), 2, 2), ((0, 2), 2, 2), ((0, 1, 2), 2, 2),
         ((4, 5, 6, 7), 4, 1), ((0,), 4, 1), ((3,), 4, 1), ((0, 1, 2, 3, 4, 5), 3, 2), ((0, 1, 2, 3), 3, 2)]


@pytest.mark.parametrize("version", REPLICA_VERSIONS)
def test_check_splits_a_users_devices_as_that_version_does(version):
    """`check` reads pools and templates by the version's own rules, and refuses what it refuses."""
    split = _splitter(version)
    for devices, replicas, tp in CASES:
        text = ",".join(map(str, devices))
        try:
            expected = split(text, replicas, tp, 1)
        except ValueError as exc:
            expected = exc
        ours, error = split_replicas(devices, replicas, tp, 1, omni_version(version))
        if isinstance(expected, ValueError):
            assert error == str(expected), (devices, replicas, tp)
        else:
            assert error is None, (devices, replicas, tp, error)
            assert [",".join(map(str, ours[r * tp:(r + 1) * tp])) for r in range(replicas)] == expected


@pytest.mark.slow
def test_the_replica_plan_does_not_depend_on_workers():
    texts = {render_deploy(plan(make_request("qwen3-omni-moe", "8xH100-80GB", workers=w))) for w in (1, 2, 8)}
    assert len(texts) == 1


def _without_solve_seconds(text: str) -> str:
    import json

    doc = json.loads(text)
    doc.pop("solve_seconds")
    return json.dumps(doc)


@pytest.mark.parametrize("gpus", ["8xH100-80GB", "4xH100-80GB,4xL40S"])
@pytest.mark.slow
def test_replica_plans_are_byte_identical_over_20_runs(gpus):
    yamls, jsons = set(), set()
    for run in range(20):
        result = plan(make_request("qwen3-omni-moe", gpus, workers=(1, 2, 8)[run % 3]))
        yamls.add(render_deploy(result))
        jsons.add(_without_solve_seconds(render_json(result)))
    assert len(yamls) == 1 and len(jsons) == 1


@pytest.mark.slow
def test_replica_plans_do_not_depend_on_the_hash_seed():
    import os
    import subprocess
    import sys

    outputs = set()
    for hash_seed in ("0", "7", "4242"):
        done = subprocess.run([sys.executable, "-m", "omni_autoconf", "--gpus", "16xH100-80GB", "--model",
                               "qwen3-omni-moe", "-q"], capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": hash_seed}, timeout=120)
        assert done.returncode == 0, done.stderr
        outputs.add(done.stdout)
    assert len(outputs) == 1


def test_too_many_fixed_replicas_are_named_as_the_conflict_and_fixed():
    import json

    runner = CliRunner()
    done = runner.invoke(main, ["--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "--replicas", "5",
                                "--format", "json"])
    assert done.exit_code == 1
    doc = json.loads(done.stdout)
    assert any(r["group"] == "replicas" for r in doc["conflict"]), doc["conflict"]
    assert doc["fixes"][0]["kind"] == "fewer-replicas" and "--replicas auto" in doc["fixes"][0]["command"]


@pytest.mark.parametrize("version", ["0.26", "0.30"])
def test_check_refuses_replicas_without_devices(tmp_path, version):
    """0.20-0.26 fail to start them (IndexError); 0.28+ would stack every replica on GPUs 0..tp-1."""
    result = plan(make_request("qwen3-omni-moe", "8xH100-80GB", version, schema="deploy"))
    doc = yaml.safe_load(render_deploy(result))
    replicated = next(s for s in doc["stages"] if s.get("num_replicas", 1) > 1)
    del replicated["devices"]
    path = tmp_path / "no-devices.yaml"
    path.write_text(yaml.safe_dump(doc))
    report = check_config(result.request.pipeline, list(result.request.gpus), omni_version(version),
                          read_config(str(path)), parallel_init=True)
    problems = [p for p in report.problems if p.code == "device-layout-invalid"]
    assert problems and "without devices" in problems[0].message

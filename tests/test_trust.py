"""Answers a pipeline can take as they are: solver statuses (a time limit is never reported
as infeasible), exit codes, version-correct files (stage_args fields and refusals per
version), settings vLLM would refuse kept out of the file, TP degrees only where evidence
exists, planned values never overwritten, KV beyond max_num_seqs given back, output files'
modes, fixes that work, a re-check that agrees with the plan, and the same plan whatever
the worker count or hash seed (marked slow)."""

from __future__ import annotations

import json
import os
import re
import stat

import pytest
import yaml
from click.testing import CliRunner

from omni_autoconf.opt import cpsat as cpsat
from omni_autoconf.inputs.catalog import CatalogError, load_pipeline_text
from omni_autoconf.cli.main import main
from omni_autoconf.errors import InputError, NoPlanError
from omni_autoconf.planning.evaluation import recheck
from omni_autoconf.planning.planner import plan
from omni_autoconf.emit.render import render_deploy, render_stage_args, with_planned

from conftest import make_request

QWEN3 = ["--model", "qwen3-omni-moe"]


def run(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line(result) -> bool:
    return len([line for line in result.stderr.splitlines() if line.strip()]) == 1


# --- 1. statuses --------------------------------------------------------------------


def test_a_time_limit_is_never_reported_as_infeasible():
    result = run("--gpus", "32xH100-80GB", *QWEN3, "--time-limit", "0.1", "--format", "json", "-q")
    data = json.loads(result.stdout)
    assert data["status"] in ("optimal", "feasible", "unknown")
    assert "fixes" not in data and "conflict" not in data
    if data["status"] == "feasible":
        assert result.exit_code == 0 and data["gap"] >= 0
    if data["status"] == "unknown":
        assert result.exit_code == 1 and "--time-limit" in result.stderr


def test_a_later_phase_out_of_time_keeps_the_plan_as_feasible():
    result = run("--gpus", "16xH100-80GB", *QWEN3, "--time-limit", "0.2", "--format", "json", "-q")
    assert result.exit_code in (0, 1), result.stderr
    assert "internal error" not in result.stderr
    data = json.loads(result.stdout)
    assert data["status"] in ("optimal", "feasible", "unknown")


def test_unknown_says_raise_the_time_limit_and_offers_no_fixes(monkeypatch):
    unknown = cpsat.Solution(cpsat.SolveStatus.UNKNOWN, 0.0, 0.1, 0, ())
    monkeypatch.setattr(cpsat, "solve", lambda *a, **k: unknown)
    result = run("--gpus", "2xH100-80GB", *QWEN3, "--format", "json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["status"] == "unknown" and "fixes" not in data
    assert "raise --time-limit" in result.stderr and "Fixes" not in result.stderr
    assert "searching for fixes" not in result.stderr


def test_infeasible_comes_with_explanation_and_fixes():
    result = run("--gpus", "2xA100-40GB", *QWEN3, "--format", "json", "-q")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["status"] == "infeasible" and data["conflict"] and data["fixes"]


@pytest.mark.parametrize("count", [63, 64])
def test_every_inventory_gpus_accepts_plans(count):
    result = run("--gpus", f"{count}xH100-80GB", *QWEN3, "--format", "json", "-q")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["status"] in ("optimal", "feasible")
    used = {d for s in data["stages"] for d in s["devices"]}
    assert used == set(range(len(used)))  # identical GPUs are used in canonical order


def test_identical_gpus_are_used_in_canonical_order():
    result = plan(make_request("qwen3-omni-moe", "8xH100-80GB"))
    used = sorted({d for sp in result.stages for d in sp.devices})
    assert used == list(range(len(used)))
    first = result.stages[0]
    assert first.devices == tuple(range(first.tensor_parallel_size * first.num_replicas))


def test_an_internal_error_is_one_line_with_exit_2(monkeypatch):
    import omni_autoconf.planning.planner as planner

    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(planner, "plan", broken)
    result = run("--gpus", "2xH100-80GB", *QWEN3)
    assert result.exit_code == 2 and one_line(result)
    assert "internal error" in result.stderr and "Traceback" not in result.stderr


# --- 2. files the named version reads and starts ---------------------------------------


def test_stage_args_for_a_version_that_refuses_them_is_exit_2():
    result = run("--gpus", "2xH100-80GB", *QWEN3, "--schema", "stage-args")
    assert result.exit_code == 2 and one_line(result)
    assert "0.12 to 0.26" in result.stderr
    assert run("--gpus", "2xH100-80GB", *QWEN3, "--omni-version", "0.18", "--schema", "deploy").exit_code == 2


@pytest.mark.parametrize("model, version", [("qwen3-omni-moe", "0.26"), ("qwen2.5-omni-7b", "0.24")])
def test_legacy_wiring_removed_in_a_version_is_refused(model, version):
    result = run("--gpus", "2xH100-80GB", "--model", model, "--omni-version", version, "--schema", "stage-args")
    assert result.exit_code == 2 and "thinker2talker" in result.stderr and "--schema deploy" in result.stderr


def test_legacy_fields_follow_the_version():
    old = yaml.safe_load(render_stage_args(plan(make_request("qwen3-omni-moe", "2xH100-80GB", "0.12"))))
    new = yaml.safe_load(render_stage_args(plan(make_request("qwen3-omni-moe", "2xH100-80GB", "0.16"))))
    assert "worker_cls" in old["stage_args"][0]["engine_args"] and "worker_type" not in old["stage_args"][0]["engine_args"]
    assert [s["engine_args"]["worker_type"] for s in new["stage_args"]] == ["ar", "ar", "generation"]
    assert new["stage_args"][2]["engine_args"]["async_scheduling"] is False
    assert "async_scheduling" not in old["stage_args"][2]["engine_args"]


def test_a_global_option_skips_the_stage_vllm_would_refuse_it_for():
    result = run("--gpus", "2xH100-80GB", *QWEN3, "--max-num-batched-tokens", "8192")
    assert result.exit_code == 0, result.stderr
    doc = yaml.safe_load(result.stdout)
    assert [s["max_num_batched_tokens"] for s in doc["stages"]] == [8192, 8192, 65536]
    assert "--max-num-batched-tokens 8192 not applied to code2wav" in result.stdout
    assert "is smaller than max_model_len (65536)" in result.stdout


def test_a_per_stage_value_vllm_refuses_is_exit_2_with_its_message():
    result = run("--gpus", "2xH100-80GB", *QWEN3, "--max-num-batched-tokens", "code2wav=8192")
    assert result.exit_code == 2 and one_line(result)
    assert "max_num_batched_tokens (8192) is smaller than max_model_len (65536)" in result.stderr
    result = run("--gpus", "2xH100-80GB", *QWEN3, "--max-num-batched-tokens", "thinker=32", "--max-num-seqs", "thinker=64")
    assert result.exit_code == 2 and "must be >= max_num_seqs (64)" in result.stderr


def test_a_global_option_no_stage_takes_is_exit_2():
    result = run("--gpus", "2xH100-80GB", *QWEN3, "--max-num-batched-tokens", "32")  # < 64 seqs; < 65536 for code2wav
    assert result.exit_code == 2 and one_line(result) and "suits no stage" in result.stderr


def test_check_reports_engine_config_invalid(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"stages": [
        {"stage_id": 0, "devices": "0", "gpu_memory_utilization": 0.9},
        {"stage_id": 1, "devices": "1", "gpu_memory_utilization": 0.6},
        {"stage_id": 2, "devices": "1", "gpu_memory_utilization": 0.1, "max_num_batched_tokens": 8192,
         "engine_extras": {"enable_chunked_prefill": False}},
    ]}))
    result = run("check", path, "--gpus", "2xH100-80GB", *QWEN3, "--format", "json")
    assert result.exit_code == 1
    problems = json.loads(result.stdout)["problems"]
    assert any(p["code"] == "engine-config-invalid" and p["stage"] == "code2wav"
               and "max_num_batched_tokens (8192) is smaller than max_model_len (65536)" in p["message"]
               for p in problems)


def test_default_plan_runs_only_tested_tp_degrees():
    result = plan(make_request("qwen3-omni-moe", "2xH100-80GB"))
    tp = {sp.stage.name: sp.tensor_parallel_size for sp in result.stages}
    assert tp["talker"] == 1 and tp["code2wav"] == 1
    assert "UNTESTED" not in render_deploy(result)
    with pytest.raises(InputError, match="allow-untested-tp"):
        plan(make_request("qwen3-omni-moe", "2xH100-80GB", tp={"talker": 2}))
    untested = plan(make_request("qwen3-omni-moe", "2xH100-80GB", tp={"talker": 2}, allow_untested_tp=True))
    assert untested.stages[1].tensor_parallel_size == 2
    assert "# UNTESTED: talker at tensor_parallel_size 2" in render_deploy(untested)
    assert "--allow-untested-tp" in render_deploy(untested)


def test_every_tp_degree_planned_by_default_cites_evidence():
    from omni_autoconf.inputs.catalog import model_catalog
    from omni_autoconf.vllm.facts import OMNI_VERSIONS

    for pipeline in model_catalog().values():
        for st in pipeline.stages:
            for version in OMNI_VERSIONS:
                for tp in st.tested_tp_degrees(version):
                    assert st.tp_evidence(tp, version), (pipeline.name, st.name, tp, version)


def test_a_planned_value_is_never_overwritten():
    assert with_planned({"stage_id": 0}, {"gpu_memory_utilization": 0.5}, {"gpu_memory_utilization": 0.9, "x": 1}) == {
        "stage_id": 0, "gpu_memory_utilization": 0.5, "x": 1}
    from importlib import resources

    text = resources.files("omni_autoconf.models").joinpath("qwen3-omni-moe.yaml").read_text()
    clash = text.replace("      async_scheduling: false\n", "      async_scheduling: false\n      max_num_seqs: 3\n", 1)
    with pytest.raises(CatalogError, match="max_num_seqs is planned"):
        load_pipeline_text(clash, "clash.yaml")


# --- 4. headroom requests can use ---------------------------------------------------------


def test_kv_beyond_max_num_seqs_is_given_back():
    result = plan(make_request("qwen2.5-omni-7b", "1xH100-80GB,1xA100-80GB", max_model_len={"thinker": 32768, "talker": 32768}))
    for sp in result.stages:
        if sp.stage.has_kv_cache:
            step = sp.memory.kv_bytes_per_token and (result.gpus[sp.devices[0]].gpu.total_bytes / 100)
            step_requests = step / (sp.memory.kv_bytes_per_token * sp.knobs.max_model_len)
            per_replica = [t / sp.knobs.max_model_len for t in sp.replica_kv_tokens]
            assert sp.headroom == pytest.approx(sum(min(c, sp.knobs.max_num_seqs) for c in per_replica))
            assert min(per_replica) <= sp.knobs.max_num_seqs + step_requests + 1e-9  # a larger GPU's replica holds more


def test_max_num_seqs_where_the_model_allows():
    result = plan(make_request("qwen2.5-omni-7b", "2xH100-80GB", max_num_seqs={"thinker": 4}))
    assert result.stages[0].knobs.max_num_seqs == 4
    with pytest.raises(InputError, match="batches at most 1"):
        plan(make_request("qwen2.5-omni-7b", "2xH100-80GB", max_num_seqs={"code2wav": 2}))


def test_json_has_headroom_per_kv_stage():
    data = json.loads(run("--gpus", "2xH100-80GB", *QWEN3, "--format", "json", "-q").stdout)
    heads = {s["name"]: s["headroom"] for s in data["stages"]}
    assert heads["code2wav"] is None and heads["thinker"] > 1


# --- 5. edges ------------------------------------------------------------------------------


def test_output_file_gets_the_umask_mode_and_dash_is_stdout(tmp_path):
    out = tmp_path / "deploy.yaml"
    old = os.umask(0o022)
    try:
        assert run("--gpus", "2xH100-80GB", *QWEN3, "-o", out, "-q").exit_code == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    result = run("--gpus", "2xH100-80GB", *QWEN3, "-o", "-", "-q")
    assert result.exit_code == 0 and result.stdout.startswith("# Generated by omni-autoconf")
    assert not (tmp_path / "-").exists() and not os.path.exists("-")


def test_output_writes_through_a_symlink_and_refuses_devices(tmp_path):
    target = tmp_path / "real.yaml"
    target.write_text("old\n")
    link = tmp_path / "link.yaml"
    link.symlink_to(target)
    assert run("--gpus", "2xH100-80GB", *QWEN3, "-o", link, "-q").exit_code == 0
    assert link.is_symlink() and target.read_text().startswith("# Generated")
    result = run("--gpus", "2xH100-80GB", *QWEN3, "-o", "/dev/null", "-q")
    assert result.exit_code == 2 and one_line(result) and "not a regular file" in result.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_more_gpus_fix_searches_to_the_inventory_limit():
    # The thinker's knobs named at the bundled values, so that lowering them is not the way out
    thinker = ("--max-num-batched-tokens", "thinker=32768", "--max-num-seqs", "thinker=64",
               "--enforce-eager", "thinker=false")
    result = run("--gpus", "1xL4", *QWEN3, *thinker, "--format", "json", "-q")
    assert result.exit_code == 1
    fixes = json.loads(result.stdout)["fixes"]
    # The thinker fits L4s only at TP=8, which no upstream config runs: the fix says so.
    more = [f for f in fixes if f["kind"] == "more-gpus-untested-tp"]
    assert more and "--allow-untested-tp" in more[0]["command"]
    count = int(re.search(r"--gpus (\d+)xL4", more[0]["command"]).group(1))
    assert count > 8  # beyond the old one-node limit of the search
    import shlex

    assert run(*shlex.split(more[0]["command"])[1:], "-q").exit_code == 0


def test_recheck_agrees_with_every_plan_figure():
    result = plan(make_request("qwen3-omni-moe", "2xH100-80GB"))
    report = recheck(result)
    assert report.problems == ()
    assert [o.kv_cache_tokens for o in report.stages] == [sp.kv_cache_tokens for sp in result.stages]


def test_no_plan_error_statuses():
    with pytest.raises(NoPlanError) as err:
        plan(make_request("qwen3-omni-moe", "1xL4"))
    assert err.value.status == "infeasible" and err.value.exit_code == 1


def test_explanation_and_fix_search_obey_the_time_limit():
    import time

    start = time.perf_counter()
    result = run("--gpus", "2xA100-40GB", *QWEN3, "--time-limit", "0.3", "-q")
    elapsed = time.perf_counter() - start
    assert result.exit_code == 1
    assert elapsed < 0.3 * 3 + 4.0  # solve, explanation and fix search: one limit each, plus start-up


@pytest.mark.parametrize("gpus", ["2xH100-80GB", "1xH100-80GB,1xA100-80GB", "4xL40S"])
@pytest.mark.slow
def test_the_plan_does_not_depend_on_the_worker_count(gpus):
    texts = {render_deploy(plan(make_request("qwen3-omni-moe", gpus, workers=w))) for w in (1, 2, 8)}
    assert len(texts) == 1


@pytest.mark.slow
def test_the_plan_does_not_depend_on_the_hash_seed(tmp_path):
    import subprocess
    import sys

    outputs = set()
    for hash_seed in ("0", "1", "12345"):
        done = subprocess.run([sys.executable, "-m", "omni_autoconf", "--gpus", "2xH100-80GB,1xL40S", *QWEN3, "-q"],
                              capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": hash_seed},
                              timeout=120)
        assert done.returncode == 0, done.stderr
        outputs.add(done.stdout)
    assert len(outputs) == 1

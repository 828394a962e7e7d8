"""The Python API (`from omni_autoconf import Request, plan, check`): a Request is validated at
construction with the command line's rules and messages, and plan/check give the command
line's answers as typed results."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from omni_autoconf import PlanResult, Request, check, plan
from omni_autoconf.cli.main import main
from omni_autoconf.errors import InputError


DOCS_API = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


def test_the_flagship_plans_optimal_from_a_fresh_interpreter():
    code = ("from omni_autoconf import Request, plan; r = plan(Request(gpus='2xH100-80GB', "
            "model='qwen3-omni-moe')); print(r.status)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "optimal\n"


@pytest.mark.parametrize("field, kwargs, words", [
    ("gpus", {"gpus": "0xH100-80GB"}, "0xH100-80GB"),
    ("gpus", {"gpus": "2xH900"}, "H900"),
    ("model", {"model": "qwen9-omni"}, "qwen9-omni"),
    ("omni_version", {"omni_version": "0.9"}, "0.9"),
    ("tp", {"tp": {"thinker": 3}}, "--tp"),
    ("max_num_seqs", {"max_num_seqs": 0}, "--max-num-seqs"),
    ("devices", {"devices": {"thinker": [0, 7]}}, "devices"),
    ("exclusive", {"exclusive": [["thinker"]]}, "--exclusive"),
    ("buffer", {"buffer": -1.0}, "--buffer"),
    ("time_limit", {"time_limit": 0}, "--time-limit"),
])
def test_an_invalid_field_is_refused_at_construction_naming_it(field, kwargs, words):
    base = {"gpus": "2xH100-80GB", "model": "qwen3-omni-moe"}
    with pytest.raises(ValidationError) as info:
        Request(**{**base, **kwargs})
    errors = info.value.errors()
    assert errors[0]["loc"] == (field,), errors
    assert words in errors[0]["msg"]
    assert field in str(info.value)


def test_an_unknown_field_or_a_wrong_type_is_refused():
    with pytest.raises(ValidationError, match="gpu_memory_utilization"):
        Request(gpus="2xH100-80GB", model="qwen3-omni-moe", gpu_memory_utilization=0.5)
    with pytest.raises(ValidationError, match="allow_untested_tp"):
        Request(gpus="2xH100-80GB", model="qwen3-omni-moe", allow_untested_tp="yes")


def test_the_api_refuses_what_the_command_line_refuses_with_the_same_words():
    with pytest.raises(ValidationError) as info:
        Request(gpus="2xH100-80GB", model="qwen3-omni-moe", tp="thinker=3")
    result = cli("--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "--tp", "thinker=3")
    assert result.exit_code == 2
    assert info.value.errors()[0]["msg"] in result.stderr


@pytest.mark.parametrize("kwargs, args", [
    ({}, []),
    ({"max_num_seqs": {"thinker": 8}, "weight": {"talker": 2.5}}, ["--max-num-seqs", "thinker=8", "--weight", "talker=2.5"]),
    ({"max_num_batched_tokens": 8192, "schema": "stage-args", "omni_version": "0.24"},
     ["--max-num-batched-tokens", "8192", "--schema", "stage-args", "--omni-version", "0.24"]),
    ({"devices": {"code2wav": [1]}, "replicas": 1, "buffer": 1.5},
     ["--devices", "code2wav=1", "--replicas", "1", "--buffer", "1.5"]),
])
def test_plan_files_are_the_bytes_the_command_line_writes(kwargs, args):
    result = plan(Request(gpus="2xH100-80GB", model="qwen3-omni-moe", **kwargs))
    assert isinstance(result, PlanResult) and result.status == "optimal"
    out = cli("--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "-q", *args)
    assert out.exit_code == 0, out.stderr
    assert list(result.files.values()) == [out.stdout]
    name = "stage_args.yaml" if "stage-args" in args else "deploy.yaml"
    assert list(result.files) == [name]


def test_the_result_is_typed_and_its_dict_is_the_json_report():
    result = plan(Request(gpus="2xH100-80GB", model="qwen3-omni-moe"), fmt="json")
    assert [s.stage.name for s in result.stages] == ["thinker", "talker", "code2wav"]
    assert [g.gpu.index for g in result.gpus] == [0, 1]
    assert result.gap == 0
    report = json.loads(result.files["plan.json"])
    got = result.to_dict()
    report.pop("solve_seconds"), got.pop("solve_seconds")
    assert got == report
    thinker = result.stages[0]
    assert thinker.devices == (0, 1) and thinker.tensor_parallel_size == 2
    assert 0 < thinker.gpu_memory_utilization < 1


def test_a_request_with_no_plan_says_why():
    result = plan(Request(gpus="1xRTX4090", model="qwen3-omni-moe"), fixes=False)
    assert result.status == "infeasible"
    assert result.files == {} and result.stages == ()
    assert result.reasons
    assert result.to_dict()["status"] == "infeasible"


def test_several_hosts_give_the_folder_of_files():
    result = plan(Request(gpus="4xH100-80GB", nodes=2, model="qwen3-omni-moe"))
    assert result.status in ("optimal", "feasible")
    assert "launch.sh" in result.files and len(result.files) >= 2


def test_check_gives_the_report_the_command_line_prints(tmp_path):
    result = plan(Request(gpus="2xH100-80GB", model="qwen3-omni-moe"))
    path = tmp_path / "deploy.yaml"
    path.write_text(result.files["deploy.yaml"])
    report = check(path, gpus="2xH100-80GB", model="qwen3-omni-moe")
    assert report.ok and not report.errors
    assert [s.run.name for s in report.stages] == ["thinker", "talker", "code2wav"]
    out = cli("check", str(path), "--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "--format", "json")
    assert out.exit_code == 0
    assert [p["code"] for p in json.loads(out.stdout)["problems"]] == [p.code for p in report.problems]
    with pytest.raises(InputError, match="nothing.yaml"):
        check(tmp_path / "nothing.yaml", gpus="2xH100-80GB", model="qwen3-omni-moe")


def test_the_example_in_the_api_docs_runs_and_prints_what_it_says():
    blocks = re.findall(r"```python\n(.*?)```", DOCS_API.read_text(), re.S)
    assert len(blocks) == 1
    out = subprocess.run([sys.executable, "-c", blocks[0]], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "optimal" and lines[1] == "['deploy.yaml']"
    assert "gpus" in out.stdout and "0xH100-80GB" in out.stdout

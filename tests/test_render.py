"""Output files: keys vLLM-Omni accepts, the legacy loader's access pattern, stability."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from omni_autoconf.planner import plan
from omni_autoconf.render import plan_dict, render_deploy, render_json, render_stage_args

from conftest import make_request

WHEEL_VERSION = "0.30.0"
CACHE = Path(__file__).resolve().parent.parent / ".cache"


@pytest.fixture(scope="module")
def qwen3_030():
    return plan(make_request("qwen3-omni-moe", "2xH100-80GB"))


def _stage_config_source() -> str:
    """vllm_omni/config/stage_config.py from the vllm-omni wheel on PyPI (cached)."""
    CACHE.mkdir(exist_ok=True)
    wheels = sorted(CACHE.glob(f"vllm_omni-{WHEEL_VERSION}-*.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", f"vllm-omni=={WHEEL_VERSION}", "--no-deps",
               "--only-binary=:all:", "-d", str(CACHE), "-q"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"cannot download the vllm-omni wheel (offline?): {exc}")
        wheels = sorted(CACHE.glob(f"vllm_omni-{WHEEL_VERSION}-*.whl"))
        if done.returncode != 0 or not wheels:
            pytest.skip(f"cannot download the vllm-omni wheel (offline?): {done.stderr.strip()[-300:]}")
    with zipfile.ZipFile(wheels[0]) as zf:
        return zf.read("vllm_omni/config/stage_config.py").decode()


def _dataclass_fields(tree: ast.Module, name: str) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    raise AssertionError(f"class {name} not found in stage_config.py")


def _reserved_keys(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_STAGE_RESERVED_KEYS" for t in node.targets):
            return {elt.value for elt in node.value.args[0].elts}  # frozenset({...})
    raise AssertionError("_STAGE_RESERVED_KEYS not found")


@pytest.mark.parametrize("model", ["qwen3-omni-moe", "qwen2.5-omni-7b"])
def test_deploy_keys_are_accepted_by_vllm_omni(model):
    tree = ast.parse(_stage_config_source())
    stage_keys = _dataclass_fields(tree, "StageDeployConfig") | _reserved_keys(tree)
    top_keys = _dataclass_fields(tree, "DeployConfig")
    doc = yaml.safe_load(render_deploy(plan(make_request(model, "2xH100-80GB"))))
    assert set(doc) <= top_keys, set(doc) - top_keys
    for stage in doc["stages"]:
        assert set(stage) <= stage_keys, set(stage) - stage_keys
        assert isinstance(stage["devices"], str)


def test_deploy_yaml_carries_the_plan(qwen3_030):
    doc = yaml.safe_load(render_deploy(qwen3_030))
    for stage, sp in zip(doc["stages"], qwen3_030.stages):
        assert stage["stage_id"] == sp.stage.stage_id
        assert stage["devices"] == ",".join(map(str, sp.devices))
        assert stage["tensor_parallel_size"] == len(sp.devices)
        assert stage["gpu_memory_utilization"] == sp.gpu_memory_utilization
    assert doc["connectors"]["connector_of_shared_memory"]["name"] == "SharedMemoryConnector"


def test_legacy_file_survives_the_legacy_loader_access_pattern():
    omegaconf = pytest.importorskip("omegaconf")
    result = plan(make_request("qwen3-omni-moe", "2xH100-80GB", "0.16"))
    text = render_stage_args(result)
    cfg = omegaconf.OmegaConf.create(text)
    stages = cfg.stage_args
    assert [s.engine_args.model_stage for s in stages] == ["thinker", "talker", "code2wav"]
    for s, sp in zip(stages, result.stages):
        assert s.runtime.devices == ",".join(map(str, sp.devices))
        assert s.engine_args.gpu_memory_utilization == sp.gpu_memory_utilization
        assert s.engine_args.tensor_parallel_size == sp.tensor_parallel_size
        assert s.engine_args.worker_type in ("ar", "generation")  # the 0.14+ form
    assert list(stages[1].engine_input_source) == [0]


def test_default_schema_follows_the_version():
    assert make_request("qwen3-omni-moe", "2xH100-80GB", "0.30").schema == "deploy"
    assert make_request("qwen3-omni-moe", "2xH100-80GB", "0.16").schema == "stage-args"


def test_json_has_the_documented_fields(qwen3_030):
    data = json.loads(render_json(qwen3_030))
    assert data["status"] in ("optimal", "feasible")
    assert {"gap", "solve_seconds", "gpus", "stages"} <= set(data)
    assert {"index", "name", "total_bytes", "stages"} <= set(data["gpus"][0])
    needed = {
        "stage_id", "name", "devices", "tensor_parallel_size", "gpu_memory_utilization", "weights_bytes",
        "activation_bytes", "overhead_bytes", "kv_cache_bytes", "kv_bytes_per_token", "kv_cache_tokens",
        "max_model_len", "max_concurrency",
    }
    for stage in data["stages"]:
        assert needed <= set(stage)
    assert [s["name"] for s in data["stages"]] == ["thinker", "talker", "code2wav"]


def test_same_input_gives_byte_identical_yaml_and_json(qwen3_030):
    again = plan(make_request("qwen3-omni-moe", "2xH100-80GB"))
    assert render_deploy(again) == render_deploy(qwen3_030)
    assert render_stage_args(again) == render_stage_args(qwen3_030)
    first, second = plan_dict(qwen3_030), plan_dict(again)
    first.pop("solve_seconds"), second.pop("solve_seconds")  # wall time: the one varying figure
    assert first == second


def test_header_states_version_inputs_and_memory_map(qwen3_030):
    head = [line for line in render_deploy(qwen3_030).splitlines() if line.startswith("#")]
    text = "\n".join(head)
    assert "omni-autoconf 0.1.0" in text
    assert "--gpus 2xH100-80GB" in text and "--model qwen3-omni-moe" in text
    assert "GPU 0 H100-80GB" in text and "GPU 1 H100-80GB" in text

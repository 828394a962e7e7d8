"""Output files: what they carry, the legacy loader's access pattern, stability.
(test_wheels.py loads them with vLLM-Omni's own loaders.)"""

from __future__ import annotations

import json

import pytest
import yaml

from omni_autoconf.planning.planner import plan
from omni_autoconf.emit.render import render_deploy, render_stage_args
from omni_autoconf.emit.summary import plan_dict, render_json

from conftest import make_request


@pytest.fixture(scope="module")
def qwen3_030():
    return plan(make_request("qwen3-omni-moe", "2xH100-80GB"))


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


@pytest.mark.slow
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

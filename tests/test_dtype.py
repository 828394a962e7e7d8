"""`--dtype` and a stage's `dtype:` as vLLM reads them (vllm 0.30.0 config/model.py
_STR_DTYPE_TO_TORCH_DTYPE): the planner and `check` load the stage in that dtype (weights and KV
twice as large in float32 as in bfloat16), and write what they planned."""

from __future__ import annotations

import re

import pytest
import yaml
from click.testing import CliRunner
from pydantic import ValidationError

from omni_autoconf import Request, plan
from omni_autoconf.cli.main import main

TTS = ("--gpus", "1xH100-80GB", "--model", "qwen3-tts-1.7b")


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _talker_weights(header: str) -> float:
    return float(re.search(r"stage 0 talker: .*? weights ([0-9.]+)", header).group(1))


def test_float32_doubles_the_weights_and_is_written_to_the_stage():
    base, wide = run(*TTS, "-q"), run(*TTS, "--dtype", "talker=float32", "-q")
    assert base.exit_code == 0 and wide.exit_code == 0, wide.stderr
    # the components in the model dtype go from 2 to 4 bytes a parameter; those with a dtype of
    # their own in the catalog (the speech tokenizer's encoder, logged bytes) stay
    from omni_autoconf.inputs.catalog import lookup_model

    talker = lookup_model("qwen3-tts-1.7b").stages[0]
    model_dtype = sum(c.params for c in talker.components if c.dtype is None) * 2 / 2**30
    assert any(c.dtype is not None for c in talker.components)
    assert _talker_weights(wide.stdout) == pytest.approx(_talker_weights(base.stdout) + model_dtype, abs=0.02)
    stages, before = yaml.safe_load(wide.stdout)["stages"], yaml.safe_load(base.stdout)["stages"]
    assert stages[0]["dtype"] == "float32" and "dtype" not in before[0]  # auto writes nothing
    assert stages[1] == before[1]  # code2wav as bundled
    assert "--dtype talker=float32" in wide.stdout  # the header's command re-creates the request


def test_aliases_and_auto_read_as_vllm_reads_them():
    half = run(*TTS, "--dtype", "talker=half", "-q")
    same = run(*TTS, "--dtype", "auto", "-q")
    assert half.exit_code == 0 and yaml.safe_load(half.stdout)["stages"][0]["dtype"] == "half"
    assert same.stdout == run(*TTS, "-q").stdout


@pytest.mark.parametrize("value", ["float128", "talker=int8", "talker=bf16"])
def test_a_dtype_vllm_does_not_accept_is_one_line_exit_2(value):
    result = run(*TTS, "--dtype", value)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "is not a dtype vLLM accepts" in result.stderr


def test_check_loads_the_files_dtype(tmp_path):
    planned = run(*TTS, "-q").stdout
    doc = yaml.safe_load(planned)
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump(doc))
    as_planned = run("check", path, *TTS[:4], "--format", "json")
    doc["stages"][0]["dtype"] = "float32"
    path.write_text(yaml.safe_dump(doc))
    wide = run("check", path, *TTS[:4], "--format", "json")
    import json

    kv = [json.loads(r.stdout)["stages"][0]["kv_cache_bytes"] for r in (as_planned, wide)]
    assert kv[1] < kv[0]  # the float32 weights and KV leave less of the same fraction (it was ignored before)


def test_the_api_takes_dtype_per_stage_and_refuses_a_bad_one():
    result = plan(Request(gpus="1xH100-80GB", model="qwen3-tts-1.7b", dtype={"talker": "float32"}))
    assert result.status == "optimal" and result.stages[0].knobs.dtype == "float32"
    with pytest.raises(ValidationError) as info:
        Request(gpus="1xH100-80GB", model="qwen3-tts-1.7b", dtype="float128")
    assert info.value.errors()[0]["loc"] == ("dtype",)

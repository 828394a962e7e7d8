"""`--quantization` and a stage's `quantization:` as vLLM reads them (issue 19, cause 5): fp8 on an
unquantized checkpoint quantizes its linear layers at load (vllm 0.30.0 quantization/online/fp8.py),
a method that does not match a quantized checkpoint is refused as vLLM refuses it, and what the
model cannot tell apart is refused with its name, never guessed."""

from __future__ import annotations

import re

import yaml
from click.testing import CliRunner

from omni_autoconf.cli.main import main
from omni_autoconf.memory.accuracy import run
from omni_autoconf.memory.accuracy_entries import read_entries, shipped_text
from test_checkpoints import LLAMA, llama_dir, llama_tensors, qwen3_omni_dir, write_safetensors


def _dir(path):
    path.mkdir()
    return path


def plan(*args):
    return CliRunner().invoke(main, ["--gpus", "1xH100-80GB", "-q", *map(str, args)])


def weights(out: str) -> float:
    return float(re.search(r"stage 0 llm: .*? weights ([0-9.]+)", out).group(1))


def test_fp8_at_load_stores_the_linear_layers_as_an_fp8_checkpoint_does(tmp_path):
    bf16, _ = llama_dir(_dir(tmp_path / "bf16"))
    fp8, _ = llama_dir(_dir(tmp_path / "fp8"), fp8=True)
    base, online, stored = plan("--model", bf16), plan("--model", bf16, "--quantization", "fp8"), plan("--model", fp8)
    assert base.exit_code == online.exit_code == stored.exit_code == 0, online.stderr
    # linear layers at 1 byte (plus a per-tensor scale), embeddings and norms still bf16
    assert weights(online.stdout) < weights(base.stdout)
    assert abs(weights(online.stdout) - weights(stored.stdout)) <= 0.01
    assert yaml.safe_load(online.stdout)["stages"][0]["quantization"] == "fp8"
    assert "quantization" not in yaml.safe_load(base.stdout)["stages"][0]
    assert "--quantization llm=fp8" in online.stdout  # the header's command re-creates the request


def test_float32_doubles_a_directorys_weights(tmp_path):
    root, _ = llama_dir(tmp_path)
    assert abs(weights(plan("--model", root, "--dtype", "float32").stdout) - 2 * weights(plan("--model", root).stdout)) < 0.02


def test_what_vllm_refuses_or_the_model_cannot_tell_is_one_line_exit_2(tmp_path):
    root, _ = llama_dir(_dir(tmp_path / "bf16"))
    fp8, _ = llama_dir(_dir(tmp_path / "fp8"), fp8=True)
    omni, _ = qwen3_omni_dir(_dir(tmp_path / "omni"))
    cases = [(("--model", root, "--quantization", "awq"), "'awq' on an unquantized checkpoint is not modelled"),
             (("--model", fp8, "--quantization", "gptq"), "does not match the checkpoint's 'fp8'"),
             (("--model", fp8, "--quantization", "fp8_marlin"), "does not match the checkpoint's 'fp8'"),
             (("--model", "qwen3-tts-1.7b", "--quantization", "talker=fp8"), "modelled for a one-stage LLM"),
             # a catalog pipeline read from its safetensors: its tensors are not told apart as vLLM's layers
             (("--model", omni, "--quantization", "code2wav=fp8"), "modelled for a one-stage LLM"),
             # before vLLM 0.16 the whole bf16 model is allocated before it is quantized
             (("--model", root, "--quantization", "fp8", "--omni-version", "0.14"), "before 0.16")]
    for args, needle in cases:
        result = plan(*args)
        assert result.exit_code == 2 and result.stderr.count("\n") == 1 and needle in result.stderr, result.stderr


def test_check_reads_a_files_quantization(tmp_path):
    root, _ = llama_dir(_dir(tmp_path / "m"))
    planned = plan("--model", root, "--quantization", "fp8").stdout
    path = tmp_path / "deploy.yaml"
    path.write_text(planned)
    ok = CliRunner().invoke(main, ["check", str(path), "--gpus", "1xH100-80GB", "--model", str(root)])
    assert ok.exit_code == 0, ok.output
    doc = yaml.safe_load(planned)
    doc["stages"][0]["quantization"] = "awq"
    path.write_text(yaml.safe_dump(doc))
    bad = CliRunner().invoke(main, ["check", str(path), "--gpus", "1xH100-80GB", "--model", str(root)])
    assert bad.exit_code == 2 and "'awq' on an unquantized checkpoint" in bad.stderr


def test_an_entry_run_with_fp8_at_load_predicts_the_fp8_weights():
    entry = read_entries(shipped_text(), "shipped")[0]  # Llama-3.1-8B, bf16
    plain, online = run([entry, {**entry, "quantization": "fp8"}])[0]
    assert online.predicted["model_loading_gib"] < 0.6 * plain.predicted["model_loading_gib"]


def test_a_plain_vllm_start_up_is_measured_as_vllm_measures_it():
    """The accuracy benchmark's plain-vLLM start-ups run vLLM's own worker: its profile figures, never
    vLLM-Omni 0.16-0.28's NVML reading, whose CUDA context would count inside."""
    from omni_autoconf.memory.accuracy import _plain_version

    assert _plain_version((0, 19)).kv_accounting == "profile"


def test_only_the_projections_are_quantized_whatever_the_embedding_is_called(tmp_path):
    """An embedding named as NemotronH names it (backbone.embeddings.weight) stays in bf16 under fp8:
    only tensors of known projections are quantized, so an unknown name errs high."""
    import json

    renamed = _dir(tmp_path / "renamed")
    tensors = llama_tensors()
    tensors["backbone.embeddings.weight"] = tensors.pop("model.embed_tokens.weight")
    (renamed / "config.json").write_text(json.dumps(LLAMA))
    write_safetensors(renamed / "model.safetensors", tensors)
    plain, _ = llama_dir(_dir(tmp_path / "plain"))
    assert weights(plan("--model", renamed, "--quantization", "fp8").stdout) == \
        weights(plan("--model", plain, "--quantization", "fp8").stdout)


def test_a_quantized_checkpoint_takes_its_own_method_or_its_marlin_kernel_only():
    from omni_autoconf.inputs.catalog import pipeline_from_config
    from omni_autoconf.memory.stage_memory import with_quantization
    from omni_autoconf.errors import InputError
    import pytest

    cfg = {**LLAMA, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}}
    stage = pipeline_from_config(cfg, "m").stages[0]
    assert with_quantization(stage, "AWQ_Marlin") is stage and with_quantization(stage, "awq") is stage
    for other in ("marlin", "gptq_marlin", "fp8"):
        with pytest.raises(InputError, match="does not match"):
            with_quantization(stage, other)

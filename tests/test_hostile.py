"""Hostile input is harmless: bounded sizes, one-line errors, exit 0/1/2/130 only."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from omni_autoconf.cli.main import main

QWEN3 = ["--model", "qwen3-omni-moe"]
OTHERS = '{stage_id: 1, devices: "1", gpu_memory_utilization: 0.3}, {stage_id: 2, devices: "1", gpu_memory_utilization: 0.1}'


def run(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line_error(result, code: int = 2) -> bool:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    return result.exit_code == code and len(lines) == 1 and lines[0].startswith("omni-autoconf: ") and (
        "Traceback" not in result.stderr)


def timed(*args):
    start = time.perf_counter()
    result = run(*args)
    return result, time.perf_counter() - start


# --- sizes are bounded before work is done --------------------------------------------------


@pytest.mark.parametrize("gpus", ["99999999999999999999xH100-80GB", "9" * 5000 + "xH100-80GB", "1025xH100-80GB",
                                  "1024xH100-80GB,1xL4", "x" * 10_000])
def test_huge_inventories_are_refused_at_once(gpus):
    result, seconds = timed("--gpus", gpus, *QWEN3)
    assert one_line_error(result) and seconds < 1.0


def test_yaml_alias_bomb_is_refused_at_once(tmp_path):
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, 10):
        prev, cur = chr(96 + i), chr(97 + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    lines.append("stages: [*j]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    assert path.stat().st_size < 600
    result, seconds = timed("check", path, "--gpus", "2xH100-80GB", *QWEN3)
    assert one_line_error(result) and "aliases" in result.stderr and seconds < 1.0


def test_deep_nesting_is_refused(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("stages: " + "[" * 100_000 + "]" * 100_000 + "\n")
    result = run("check", path, "--gpus", "2xH100-80GB", *QWEN3)
    assert one_line_error(result) and "nested deeper" in result.stderr


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/urandom"])
def test_only_regular_files_are_read(tmp_path, special):
    result, seconds = timed("check", special, "--gpus", "2xH100-80GB", *QWEN3)
    assert one_line_error(result) and "not a regular file" in result.stderr and seconds < 1.0
    child = tmp_path / "child.yaml"
    child.write_text(f"base_config: {special}\nstages: []\n")
    result, seconds = timed("check", child, "--gpus", "2xH100-80GB", *QWEN3)
    assert one_line_error(result) and seconds < 1.0


def test_an_oversized_file_is_refused(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("stages: []\n" + "#" * (2 << 20))
    assert one_line_error(run("check", path, "--gpus", "2xH100-80GB", *QWEN3))


# --- malformed configs: exit 2, one line, never an internal error -----------------------------

MALFORMED = {
    "binary garbage": None,
    "stages: 5": "stages: 5\n",
    "platforms: [1]": "platforms: [1]\nstages: []\n",
    "platforms.cuda: 5": "platforms: {cuda: 5}\nstages: []\n",
    "compilation_config: [1,2]": f'stages: [{{stage_id: 0, devices: "0", compilation_config: [1,2]}}, {OTHERS}]\n',
    "runtime: 5": f"stages: [{{stage_id: 0, runtime: 5}}, {OTHERS}]\n",
    "engine_args: [1]": f"stages: [{{stage_id: 0, engine_args: [1]}}, {OTHERS}]\n",
    "a stage that is a number": "stages: [1, 2]\n",
    "legacy stage without stage_id": 'stage_args: [{runtime: {devices: "0"}}]\n',
    "max_model_len: .inf": f'stages: [{{stage_id: 0, devices: "0", max_model_len: .inf}}, {OTHERS}]\n',
    "tensor_parallel_size: 0": f'stages: [{{stage_id: 0, devices: "0", tensor_parallel_size: 0}}, {OTHERS}]\n',
    "tensor_parallel_size: 1.7": f'stages: [{{stage_id: 0, devices: "0", tensor_parallel_size: 1.7}}, {OTHERS}]\n',
    "max_model_len: 0": f'stages: [{{stage_id: 0, devices: "0", max_model_len: 0}}, {OTHERS}]\n',
    "max_model_len: -5": f'stages: [{{stage_id: 0, devices: "0", max_model_len: -5}}, {OTHERS}]\n',
    "max_num_seqs: -3": f'stages: [{{stage_id: 0, devices: "0", max_num_seqs: -3}}, {OTHERS}]\n',
    "gpu_memory_utilization: true": f'stages: [{{stage_id: 0, devices: "0", gpu_memory_utilization: true}}, {OTHERS}]\n',
    "devices: [0, 1]": 'stages: [{stage_id: 0, devices: [0, 1]}]\n',
    "stage_id: x": 'stages: [{stage_id: x}]\n',
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_configs_exit_2_with_one_line(tmp_path, name):
    path = tmp_path / "bad.yaml"
    if MALFORMED[name] is None:
        path.write_bytes(bytes(range(256)) * 8)
    else:
        path.write_text(MALFORMED[name])
    result = run("check", path, "--gpus", "2xH100-80GB", *QWEN3)
    assert one_line_error(result), result.stderr


def test_a_kv_cache_dtype_vllm_refuses_is_reported(tmp_path):
    path = tmp_path / "fp4.yaml"
    path.write_text(f'stages: [{{stage_id: 0, devices: "0", kv_cache_dtype: fp4}}, {OTHERS}]\n')
    result = run("check", path, "--gpus", "2xH100-80GB", *QWEN3)
    assert result.exit_code == 1 and "[engine-config-invalid] thinker" in result.stdout and "'fp4'" in result.stdout


def test_the_string_false_is_read_as_vllm_reads_it(tmp_path):
    from omni_autoconf.inputs.configfile import read_config

    path = tmp_path / "eager.yaml"
    path.write_text(f'stages: [{{stage_id: 0, devices: "0", enforce_eager: "false"}}, {OTHERS}]\n')
    assert read_config(str(path)).stages[0].enforce_eager is False
    path.write_text(f'stages: [{{stage_id: 0, devices: "0", enforce_eager: "maybe"}}, {OTHERS}]\n')
    assert one_line_error(run("check", path, "--gpus", "2xH100-80GB", *QWEN3))


# --- flags -------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["--tp", "thinker=2", "--tp", "thinker=1"],
    ["--max-model-len", "4096", "--max-model-len", "8192"],
    ["--max-model-len", "thinker=4096,thinker=8192"],
    ["--buffer", "1", "--buffer", "2"],
    ["--devices", "thinker=0", "--devices", "thinker=1"],
    ["--enforce-eager", "talker=true", "--enforce-eager", "talker=false"],
    ["--omni-version", "0.30", "--omni-version", "0.28"],
])
def test_conflicting_flags_are_errors(args):
    result = run("--gpus", "2xH100-80GB", *QWEN3, *args)
    assert one_line_error(result), result.stderr


@pytest.mark.parametrize("args", [
    ["--gpus", "２xH100-80GB", *QWEN3],
    ["--gpus", "2xH100-80GB", *QWEN3, "--max-model-len", "１２３４"],
    ["--gpus", "2xH100-80GB", *QWEN3, "--buffer", "０.５"],
    ["--gpus", "2xH100-80GB", *QWEN3, "--buffer", "nan"],
    ["--gpus", "2xH100-80GB", *QWEN3, "--time-limit", "inf"],
    ["--gpus", "2xH100-80GB", *QWEN3, "--resolution", "0.3"],
    ["--gpus", "2xH100-80GB", *QWEN3, "--nope"],
    ["--gpus", "2xH100-80GB", *QWEN3, "--schema", "yaml"],
    ["--gpus", "2xH100-80GB", *QWEN3, "--devices", "thinker=0,x"],
    ["check", "--gpus", "2xH100-80GB"],
    ["gpus", "extra"],
])
def test_bad_values_and_usage_errors_are_one_line(args):
    assert one_line_error(run(*args)), run(*args).stderr


def test_the_recorded_command_reproduces_the_run():
    first = run("--gpus", "2xH100-80GB", *QWEN3, "--resolution", "0.142857142857", "--buffer", "0.1234567",
                "--weight", "talker=1.3333333", "-q")
    assert first.exit_code == 0, first.stderr
    recorded = re.search(r"^# Inputs: omni-autoconf (.*)$", first.stdout, re.M).group(1)
    again = run(*shlex.split(recorded), "-q")
    assert again.exit_code == 0, again.stderr
    assert again.stdout == first.stdout


# --- interrupts ----------------------------------------------------------------------------------

CLI = [sys.executable, "-m", "omni_autoconf"]


def _interrupt(args: list[str], delay: float, out: Path, after_start: bool = False):
    """Run the CLI, send Ctrl-C `delay` seconds in (after its "planning" line when
    `after_start`: Python's own start-up, before any of the tool's code runs, is no part of
    the promise), and return (exit code, stderr, seconds from the signal to the exit)."""
    proc = subprocess.Popen([*CLI, *args, "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    first = ""
    if after_start:
        first = proc.stderr.readline()
        assert "planning" in first, first
    time.sleep(delay)
    sent = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{args} hung after Ctrl-C")
    return proc.returncode, first + err, time.perf_counter() - sent


def test_ctrl_c_mid_solve_exits_130_and_leaves_the_file(tmp_path):
    # One worker on six kinds of GPU keeps the solver busy for seconds.
    out = tmp_path / "plan.yaml"
    out.write_text("the user's file\n")
    gpus = "8xH100-80GB,8xA100-80GB,8xL40S,8xA10,8xA100-40GB,8xRTX4090"
    code, err, seconds = _interrupt(["--gpus", gpus, *QWEN3, "--workers", "1"], 0.5, out, after_start=True)
    if code == 0:
        pytest.skip("the solve finished before the interrupt on this machine")
    assert code == 130 and seconds < 2.0
    lines = [line for line in err.strip().splitlines() if "planning" not in line]
    assert lines == ["omni-autoconf: interrupted; nothing was written"]
    assert out.read_text() == "the user's file\n"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.yaml"]


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.3])
def test_ctrl_c_at_any_moment_is_clean(tmp_path, delay):
    out = tmp_path / "plan.yaml"
    out.write_text("the user's file\n")
    code, err, _ = _interrupt(["--gpus", "62xH100-80GB", *QWEN3], delay, out, after_start=True)
    assert code in (0, 130), err
    if code == 130:
        assert out.read_text() == "the user's file\n" and err.strip().splitlines()[-1].startswith("omni-autoconf: interrupted")
    else:
        assert yaml.safe_load(out.read_text())["stages"]
    assert [p.name for p in tmp_path.iterdir()] == ["plan.yaml"]
    assert "Traceback" not in err and "terminate called" not in err


@pytest.mark.parametrize("delay", [0.25, 0.5])
def test_ctrl_c_while_modules_load_is_one_line_and_130(tmp_path, delay):
    out = tmp_path / "plan.yaml"
    out.write_text("the user's file\n")
    code, err, _ = _interrupt(["--gpus", "2xH100-80GB", *QWEN3, "-q"], delay, out)
    if "Fatal Python error" in err or "init_import_site" in err:
        pytest.skip("the interrupt landed in Python's own start-up, before any of the tool's code")
    assert code in (0, 130), err
    assert "internal error" not in err and "Traceback" not in err
    if code == 130:
        assert out.read_text() == "the user's file\n"


@pytest.mark.parametrize("signame, said, code", [
    ("SIGINT", "interrupted", 130),
    ("SIGTERM", "terminated (SIGTERM)", 143),  # what Kubernetes and systemd send
])
def test_a_signal_during_the_write_waits_for_it_and_says_the_file_is_whole(tmp_path, signame, said, code):
    """The signal lands between writing the temporary file and moving it in place."""
    import subprocess
    import sys

    out = tmp_path / "plan.yaml"
    out.write_text("the user's file\n")
    script = (
        "import os, signal\n"
        "from omni_autoconf.cli import interrupts, output_files\n"
        "interrupts.install()\n"
        "real = os.replace\n"
        "def replace(a, b):\n"
        f"    os.kill(os.getpid(), signal.{signame})\n"
        "    real(a, b)\n"
        "os.replace = replace\n"
        "try:\n"
        f"    output_files.write_output({str(out)!r}, 'the plan\\n')\n"
        "except KeyboardInterrupt:\n"
        "    print(interrupts.message(), interrupts.exit_code())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == "the plan\n"
    assert done.stdout.strip() == f"omni-autoconf: {said}; {out} was written in full before it {code}"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.yaml"]


# --- values no real file holds: one line, exit 2 (review of 2026-12-01) --------------------

LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096}


@pytest.mark.parametrize("change, needle", [
    ({"num_attention_heads": 0}, "num_attention_heads must be a whole number"),
    ({"num_key_value_heads": 0}, "num_key_value_heads must be a whole number"),
    ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
    ({"hidden_size": 10 ** 30}, "hidden_size must be a whole number"),
    ({"rope_scaling": "x"}, "rope_scaling must be an object"),
    ({"rope_scaling": {"type": "linear", "factor": -2}}, "rope_scaling factor"),
    ({"quantization_config": 3}, "quantization_config must be an object"),
    ({"architectures": 5}, "architectures must be a list"),
    ({"num_experts": "many"}, "num_experts must be a whole number"),
])
def test_a_model_directory_with_impossible_config_values_is_one_line(tmp_path, change, needle):
    import json

    from test_checkpoints import write_safetensors

    (tmp_path / "config.json").write_text(json.dumps({**LLAMA_CONFIG, **change}))
    write_safetensors(tmp_path / "model.safetensors", {"model.embed_tokens.weight": ("BF16", [1000, 256])})
    result = run("--gpus", "1xH100-80GB", "--model", tmp_path)
    assert one_line_error(result) and needle in result.stderr, result.stderr


def test_json_nested_too_deeply_or_with_nan_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text("[" * 100_000)
    assert one_line_error(run("--gpus", "1xH100-80GB", "--model", tmp_path))
    entries = tmp_path / "entries.jsonl"
    entries.write_text('{"model": "qwen3-omni-moe", "available_kv_gib": NaN}\n')
    result = run("bench", "accuracy", entries)
    assert one_line_error(result) and "NaN is not a JSON number" in result.stderr


def test_bench_entries_with_settings_vllm_refuses_are_skipped_with_the_reason(tmp_path):
    import json

    lines = [{"model": "qwen3-omni-moe", "gpu": "H100-80GB", "tensor_parallel_size": 0},
             {"model": "qwen3-omni-moe", "gpu": "H100-80GB", "gpu_memory_utilization": 1e300},
             {"model": "qwen3-omni-moe", "gpu": "H100-80GB", "max_model_len": -5},
             {"model": "x", "config": {**LLAMA_CONFIG, "num_attention_heads": 0}}]
    entries = tmp_path / "entries.jsonl"
    entries.write_text("".join(json.dumps(e) + "\n" for e in lines))
    result = run("bench", "accuracy", entries, "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)  # strict JSON: no NaN or Infinity
    assert [e["status"] for e in doc["entries"]] == ["skipped"] * 4
    assert "tensor_parallel_size 0 is not a setting vLLM starts with" in doc["entries"][0]["reason"]
    assert "num_attention_heads" in doc["entries"][3]["reason"]


def test_small_usage_errors_are_one_clear_line(tmp_path):
    assert one_line_error(bench := run("bench")) and "bench needs a subcommand: accuracy" in bench.stderr
    buffer = run("--gpus", "2xH100-80GB", *QWEN3, "--buffer", "-1")
    assert one_line_error(buffer) and "out of range" in buffer.stderr
    for args in (["--gpus", "2xH100-80GB", *QWEN3, "--calibration", ""], ["bench", "accuracy", ""],
                 ["check", "", "--gpus", "2xH100-80GB", *QWEN3]):
        result = run(*args)
        assert one_line_error(result) and "empty file name" in result.stderr, args
    config = Path(__file__).parent.parent / "examples" / "qwen3-omni-moe.2xH100-80GB.deploy.yaml"
    stray_output = run("check", config, "--gpus", "2xH100-80GB", *QWEN3, "-o", tmp_path / "x.yaml")
    assert one_line_error(stray_output) and "add --fix" in stray_output.stderr


def test_debug_shows_the_traceback_and_keeps_the_exit_code():
    result = run("--gpus", "0xH100-80GB", *QWEN3, "--debug")
    assert result.exit_code == 2 and "Traceback" in result.stderr and "at least 1" in result.stderr


def test_top_level_engine_settings_reach_every_stage_as_in_vllm_omni(tmp_path):
    config = Path(__file__).parent.parent / "examples" / "qwen3-omni-moe.2xH100-80GB.deploy.yaml"
    text = config.read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("enable_prefix_caching: false", "enable_prefix_caching: 7"))
    result = run("check", bad, "--gpus", "2xH100-80GB", *QWEN3)
    assert one_line_error(result) and "enable_prefix_caching 7 is not a boolean" in result.stderr
    pp = tmp_path / "pp.yaml"
    pp.write_text(text + "pipeline_parallel_size: 2\n")
    result = run("check", pp, "--gpus", "2xH100-80GB", *QWEN3)
    assert one_line_error(result) and "pipeline_parallel_size 2 is not modelled" in result.stderr


def test_a_time_limited_plan_says_how_to_reproduce_it():
    """Where the clock stopped the search depends on the machine: the header says so."""
    import dataclasses

    from conftest import make_request
    from omni_autoconf.planning.planner import plan
    from omni_autoconf.emit.render import render_deploy

    proven = plan(make_request("qwen3-omni-moe", "2xH100-80GB", time_limit_s=20, workers=3))
    assert proven.status == "optimal" and "may stop at another plan" not in render_deploy(proven)
    stopped = dataclasses.replace(proven, status="feasible", gap=0.25)
    status = render_deploy(stopped).splitlines()[2]
    assert "feasible" in status and "a run with --time-limit 20 and --workers 3 may stop at another plan" in status


@pytest.mark.parametrize("args, words", [
    (["--omni-version", ""], "not a vLLM-Omni version"),  # an unset $V is no silent 0.30
    (["--format", "json", "-o", "{tmp}/j/"], "this output is one file"),  # a trailing / never makes a file
    (["-o", "{tmp}/y/"], "this output is one file"),
    (["--max-model-len", "99999999999999999999999"], "99999999999999999999999 is out of range"),
])
def test_empty_versions_and_folder_names_for_one_file_are_refused(tmp_path, args, words):
    result = run("--gpus", "2xH100-80GB", *QWEN3, *[a.format(tmp=tmp_path) for a in args], "-q")
    assert one_line_error(result) and words in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_api_refuses_an_unknown_format_in_one_line():
    from omni_autoconf import Request, plan
    from omni_autoconf.errors import InputError

    with pytest.raises(InputError, match="format 'xml' is not one of yaml, json"):
        plan(Request(gpus="2xH100-80GB", model="qwen3-omni-moe"), fmt="xml")


@pytest.mark.parametrize("key", ["tensor_parallel_size", "num_replicas", "sequence_parallel_size"])
def test_a_gpu_count_beyond_any_inventory_in_a_file_is_one_line(tmp_path, key):
    path = tmp_path / "deploy.yaml"
    path.write_text(f"stages:\n- stage_id: 0\n  {key}: 99999999999999999999\n- stage_id: 1\n- stage_id: 2\n")
    result = run("check", str(path), "--gpus", "2xH100-80GB", *QWEN3)
    assert one_line_error(result) and f"{key} 99999999999999999999 is more than the 1024 GPUs" in result.stderr

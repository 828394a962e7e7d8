"""The command line: exit codes, one-line errors, outputs, files."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner

from omni_autoconf.cli.main import main


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_main_job_prints_a_deploy_yaml_and_a_table_on_stderr():
    result = run("--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe")
    assert result.exit_code == 0, result.stderr
    doc = yaml.safe_load(result.stdout)
    assert [s["stage_id"] for s in doc["stages"]] == [0, 1, 2]
    assert "status: optimal" in result.stderr
    assert "GPU  name" in result.stderr


def test_stage_args_to_a_file(tmp_path):
    out = tmp_path / "stage_configs.yaml"
    result = run("--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "--omni-version", "0.24", "--schema",
                 "stage-args", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    doc = yaml.safe_load(out.read_text())
    assert doc["stage_args"][0]["engine_args"]["model_stage"] == "thinker"
    assert [p.name for p in tmp_path.iterdir()] == ["stage_configs.yaml"]  # no temporary left behind


def test_mixed_gpus_json():
    result = run("--gpus", "1xH100-80GB,1xA100-80GB", "--model", "qwen2.5-omni-7b",
                 "--max-model-len", "32768", "--format", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert [g["name"] for g in data["gpus"]] == ["H100-80GB", "A100-80GB"]
    assert all(s["max_model_len"] == 32768 for s in data["stages"] if s["kv_bytes_per_token"])


def test_3b_on_one_rtx4090():
    result = run("--gpus", "1xRTX4090", "--model", "qwen2.5-omni-3b",
                 "--max-model-len", "4096", "--max-num-batched-tokens", "4096", "-q")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""


def test_no_plan_exits_1_with_the_reason():
    result = run("--gpus", "1xL4", "--model", "qwen3-omni-moe", "-q")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "no plan" in result.stderr and "thinker" in result.stderr and "GPU 0 (L4)" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--gpus", "2xH1000", "--model", "qwen3-omni-moe"], "unknown GPU 'H1000'"),
        (["--gpus", "2xH100", "--model", "qwen4"], "unknown model 'qwen4'"),
        (["--gpus", "2x", "--model", "qwen3-omni-moe"], "malformed --gpus"),
        (["--gpus", "2xH100", "--model", "qwen3-omni-moe", "--tp", "thinker=3"], "does not divide"),
        (["--gpus", "2xH100", "--model", "qwen3-omni-moe", "--tp", "thinker=16"], "not allowed"),
        (["--gpus", "2xH100", "--model", "qwen3-omni-moe", "--tp", "wizard=2"], "no stage 'wizard'"),
        (["--gpus", "2xH100", "--model", "qwen3-omni-moe", "--max-model-len", "-5"], "out of range"),
        (["--gpus", "2xH100", "--model", "qwen3-omni-moe", "--max-model-len", "lots"], "not a whole number"),
        (["--gpus", "2xH100", "--model", "qwen3-omni-moe", "--max-model-len", "1000000"], "exceeds the model's maximum"),
        (["--gpus", "2xH100", "--model", "qwen3-omni-moe", "--buffer", "-1"], "--buffer"),
        (["--gpus", "2xH100", "--model", "qwen3-omni-moe", "--resolution", "0.3"], "--resolution"),
        (["--gpus", "2xH100", "--model", "qwen3-omni-moe", "--omni-version", "9.9"], "unknown vLLM-Omni version"),
        (["--gpus", "2xH100", "--model", "qwen3-omni-moe", "--exclusive", "thinker"], "at least two"),
        (["--model", "qwen3-omni-moe"], "both --gpus and --model"),
        (["--gpus", "2xH100", "--model", "qwen3-omni-moe", "--min-concurrency", "code2wav=2"], "has no KV cache"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, needle):
    result = run(*args)
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert needle in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_tp_that_does_not_divide_heads_is_rejected_before_solving():
    result = run("--gpus", "4xH100", "--model", "qwen3-omni-moe", "--tp", "0=3", "-q")
    assert result.exit_code == 2
    assert "thinker" in result.stderr


@pytest.mark.slow
def test_same_input_byte_identical_output():
    args = ["--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "-q"]
    assert run(*args).stdout == run(*args).stdout


def test_catalog_listings():
    gpus = run("gpus")
    assert gpus.exit_code == 0 and "A100-80GB" in gpus.stdout
    # one rounding of a GPU's total everywhere: the listing shows what a plan's map shows
    listed = next(line for line in gpus.stdout.splitlines() if line.startswith("A100-80GB "))
    planned = run("--gpus", "1xA100-80GB", "--model", "qwen3-tts-1.7b")
    assert planned.exit_code == 0
    assert f"A100-80GB total {listed.split()[1]}:" in planned.stdout
    models = run("models")
    assert models.exit_code == 0 and "qwen3-omni-moe" in models.stdout


def test_python_dash_m_entry_point():
    done = subprocess.run([sys.executable, "-m", "omni_autoconf", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and "omni-autoconf" in done.stdout


def test_help_imports_no_solver_and_is_quick():
    """--help, which a pipeline may call to probe the tool, loads neither OR-Tools nor the planner."""
    script = ("import sys\nfrom omni_autoconf.cli.main import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
              "print(sorted(m for m in ('ortools', 'omni_autoconf.planning.planner', 'omni_autoconf.opt.cpsat') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().splitlines()[-1] == "[]"
    best = min(_seconds([sys.executable, "-m", "omni_autoconf", "--help"]) for _ in range(3))
    assert best < 0.5 + _seconds([sys.executable, "-c", "pass"])  # the interpreter's own start aside


def _seconds(cmd) -> float:
    import time

    t0 = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=True, timeout=60)
    return time.perf_counter() - t0

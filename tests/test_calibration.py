"""`omni-autoconf calibrate` and what it feeds: the start-up log parser, a calibration applied
by plan and check (--calibration) and refused for another model, version or GPU, how far it
applies at another TP degree, and KV pinned in the file (--pin-kv)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from omni_autoconf.cli.main import main
from omni_autoconf.inputs.configfile import read_config
from omni_autoconf.inputs.logparse import parse_log

DATA = Path(__file__).parent / "data"
LOG = DATA / "qwen3-omni-startup.log"
BUNDLED = DATA / "qwen3_omni_moe.deploy-0.30.yaml"
QWEN3 = ["--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe"]


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def calibrate(tmp_path) -> Path:
    out = tmp_path / "cal.yaml"
    result = run("calibrate", LOG, "--config", BUNDLED, *QWEN3, "-o", out)
    assert result.exit_code == 0, result.stderr
    assert "not parsed" in result.stderr
    return out


def test_the_log_parser_reads_every_stage_and_counts_the_rest():
    parsed = parse_log(LOG.read_text())
    assert sorted(parsed.stages) == [0, 1, 2]
    thinker = parsed.stages[0]
    assert (thinker.model_loading_gib, thinker.available_kv_gib, thinker.kv_cache_tokens) == (59.46, 7.02, 76656)
    assert (thinker.activation_gib, thinker.graph_gib, thinker.utilization) == (4.49, 0.61, 0.9)
    assert parsed.lines_unparsed > 0 and parsed.lines_used == 10


def test_untagged_worker_lines_follow_the_order_of_start_up():
    text = "\n".join([
        "(Worker pid=1) INFO [gpu_model_runner.py:1] Model loading took 59.46 GiB memory and 1.0 seconds",
        "(Worker pid=1) INFO [gpu_worker.py:1] Available KV cache memory: 7.00 GiB",
        "(Worker pid=2) INFO [gpu_model_runner.py:1] Model loading took 6.20 GiB memory and 1.0 seconds",
        "(Worker pid=2) INFO [gpu_worker.py:1] Available KV cache memory: 38.00 GiB",
        "garbage line",
    ])
    parsed = parse_log(text)
    assert parsed.stages[0].available_kv_gib == 7.0 and parsed.stages[1].model_loading_gib == 6.2
    assert parsed.lines_unparsed == 1


def test_a_calibrated_plan_moves_the_way_the_log_demands(tmp_path):
    cal = calibrate(tmp_path)
    doc = yaml.safe_load(cal.read_text())
    assert doc["stages"]["thinker"]["activation_delta_bytes"] > 0  # the log's peak is above the model's
    plain = json.loads(run(*QWEN3, "--format", "json", "-q").stdout)
    calibrated = json.loads(run(*QWEN3, "--calibration", cal, "--format", "json", "-q").stdout)
    kv = lambda d: {s["name"]: s["kv_cache_bytes"] for s in d["stages"]}
    assert kv(calibrated)["thinker"] < kv(plain)["thinker"]  # more activation, less KV
    text = run(*QWEN3, "--calibration", cal, "-q").stdout
    assert "# CALIBRATED: calibrated with cal.yaml" in text and f"--calibration {cal}" in text


def test_check_applies_a_calibration_too(tmp_path):
    cal = calibrate(tmp_path)
    plain = json.loads(run("check", BUNDLED, *QWEN3, "--format", "json").stdout)
    calibrated = json.loads(run("check", BUNDLED, *QWEN3, "--calibration", cal, "--format", "json").stdout)
    assert calibrated["stages"][0]["kv_cache_bytes"] < plain["stages"][0]["kv_cache_bytes"]


def test_a_calibration_of_another_model_is_refused(tmp_path):
    cal = calibrate(tmp_path)
    result = run("--gpus", "2xH100-80GB", "--model", "qwen2.5-omni-7b", "--calibration", cal)
    assert result.exit_code == 2 and "measured for qwen3-omni-moe" in result.stderr


def test_a_log_without_figures_is_exit_2(tmp_path):
    log = tmp_path / "empty.log"
    log.write_text("nothing to see\n")
    result = run("calibrate", log, "--config", BUNDLED, *QWEN3)
    assert result.exit_code == 2 and "no figure" in result.stderr


def test_pinned_kv_is_written_and_read_back(tmp_path):
    out = tmp_path / "pinned.yaml"
    assert run(*QWEN3, "--pin-kv", "-o", out, "-q").exit_code == 0
    doc = yaml.safe_load(out.read_text())
    plan = json.loads(run(*QWEN3, "--pin-kv", "--format", "json", "-q").stdout)
    pinned = {s["stage_id"]: s.get("kv_cache_memory_bytes") for s in doc["stages"]}
    assert pinned[0] == plan["stages"][0]["kv_cache_bytes"] and pinned[2] is None
    assert "# KV pinned" in out.read_text()
    assert read_config(str(out)).stages[0].kv_cache_memory_bytes == pinned[0]
    checked = json.loads(run("check", out, *QWEN3, "--parallel-init", "--format", "json").stdout)
    assert checked["problems"] == []
    assert [s["kv_cache_bytes"] for s in checked["stages"]] == [s["kv_cache_bytes"] for s in plan["stages"]]


def _pinned(tmp_path, nbytes: int) -> dict:
    text = BUNDLED.read_text().replace("    gpu_memory_utilization: 0.9\n",
                                       f"    gpu_memory_utilization: 0.9\n    kv_cache_memory_bytes: {nbytes}\n", 1)
    path = tmp_path / "over.yaml"
    path.write_text(text)
    return json.loads(run("check", path, *QWEN3, "--format", "json").stdout)


def test_a_pin_beyond_the_fraction_is_a_warning(tmp_path):
    data = _pinned(tmp_path, 12_000_000_000)  # the thinker's fraction leaves ~8 GiB of KV; the card has room
    assert any(p["code"] == "pinned-kv-beyond-fraction" for p in data["problems"]) and data["ok"]
    assert data["stages"][0]["kv_cache_bytes"] == 12_000_000_000


def test_a_pin_beyond_free_memory_fails_at_start_up(tmp_path):
    """vLLM allocates the pin whole after the profile run: beyond what is free, CUDA OOM."""
    data = _pinned(tmp_path, 20_000_000_000)
    assert not data["ok"] and any(p["code"] == "pinned-kv-oom" and p["stage"] == "thinker" for p in data["problems"])


def _edited(tmp_path, cal: Path, edit) -> Path:
    doc = yaml.safe_load(cal.read_text())
    edit(doc)
    out = tmp_path / "edited.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


BAD_EDITS = {
    "negative weights": (lambda d: d["stages"]["thinker"].update(weights_scale=-1.0), "times the predicted weights"),
    "nan weights": (lambda d: d["stages"]["thinker"].update(weights_scale=float("nan")), "not a finite number"),
    "huge activation": (lambda d: d["stages"]["thinker"].update(activation_delta_bytes=10 ** 15), "not a measurement"),
    "negative non-torch": (lambda d: d["stages"]["thinker"].update(non_torch_bytes=-5), "not a measurement"),
    "boolean TP": (lambda d: d["stages"]["thinker"].update(tensor_parallel_size=True), "not a number"),
    "TP 0": (lambda d: d["stages"]["thinker"].update(tensor_parallel_size=0), "is not 1 to"),
    "unknown stage": (lambda d: d["stages"].update(vocoder=dict(d["stages"]["thinker"])), "is not a stage of"),
    "unknown version": (lambda d: d.update(omni_version="banana"), "no vLLM-Omni version"),
    "stages a list": (lambda d: d.update(stages=[1, 2]), "not a calibration file"),
}


def test_calibration_figures_no_measurement_gives_are_refused(tmp_path):
    cal = calibrate(tmp_path)
    for name, (edit, needle) in BAD_EDITS.items():
        result = run(*QWEN3, "--calibration", _edited(tmp_path, cal, edit))
        assert result.exit_code == 2, name
        assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1, (name, result.stderr)


def test_a_calibration_of_another_version_or_gpu_is_refused(tmp_path):
    cal = calibrate(tmp_path)
    other_version = run(*QWEN3, "--omni-version", "0.24", "--calibration", cal)
    assert other_version.exit_code == 2 and "measured on vLLM-Omni 0.30, planning for 0.24" in other_version.stderr
    other_gpu = run("--gpus", "2xA100-80GB", "--model", "qwen3-omni-moe", "--calibration", cal)
    assert other_gpu.exit_code == 2 and "measured on H100-80GB" in other_gpu.stderr


def test_calibrating_a_log_of_another_model_is_refused(tmp_path):
    """The Qwen3-Omni log read as Qwen2.5-Omni-7B: its weights are far from that model's."""
    result = run("calibrate", LOG, "--config", BUNDLED, "--gpus", "2xH100-80GB", "--model", "qwen2.5-omni-7b")
    assert result.exit_code == 2 and "times the predicted weights" in result.stderr, result.stderr


def test_a_calibration_applies_in_full_only_at_its_tp(tmp_path):
    from omni_autoconf.memory.calibration import load
    from omni_autoconf.memory.stage_memory import resolve_knobs, stage_memory
    from omni_autoconf.inputs.catalog import lookup_model
    from omni_autoconf.vllm.facts import omni_version

    cal = load(str(_edited(tmp_path, calibrate(tmp_path),
                           lambda d: d["stages"]["thinker"].update(activation_delta_bytes=-2 * 2 ** 30))))
    pipeline = lookup_model("qwen3-omni-moe")
    thinker = pipeline.stages[0]
    version = omni_version("0.30")
    knobs = resolve_knobs(pipeline, "deploy", version)["thinker"]
    measured_tp = cal.stages["thinker"].tensor_parallel_size
    other_tp = 2 if measured_tp == 1 else 1
    for tp, lowered in ((measured_tp, True), (other_tp, False)):
        memory = stage_memory(thinker, tp, knobs, version)
        corrected = cal.apply("thinker", memory, tp)
        assert (corrected.activation_bytes < memory.activation_bytes) == lowered  # less need: only where measured

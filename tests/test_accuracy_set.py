"""The accuracy set as shipped (omni_autoconf/data/accuracy.jsonl, issue 19): it installs with
the package, every held-out entry quotes the figures it records, `bench accuracy` reports the
held-out start-ups apart with mean, signed and optimistic counts per figure, and `bench entry`
turns a start-up log and its config.json into an entry."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from omni_autoconf.cli.main import main
from omni_autoconf.inputs.logparse import parse_settings
from omni_autoconf.memory.accuracy import (FIGURES, EntryResult, read_entries, run, shipped_configs,
                                           shipped_text)

DATA = Path(__file__).parent / "data"
GEMMA_LOG = DATA / "gemma-3-1b-it-vllm-0.13.log"


def entries():
    return read_entries(shipped_text(), "shipped")


def test_the_shipped_set_is_the_tests_data_file():
    assert shipped_text() == (DATA / "accuracy.jsonl").read_text()


def test_every_entry_names_its_source_and_quotes_the_log():
    for i, e in enumerate(entries()):
        assert e.get("source") and e.get("quote"), i
        if e.get("held_out"):  # the held-out set: a public URL each
            assert str(e["source"]).startswith("https://"), i


def _printed(value) -> list[str]:
    """The ways a log prints a figure: 950864 as 950,864 or 950864; 1.12 as 1.12."""
    if isinstance(value, int) or float(value).is_integer():
        return [f"{int(value):,}", str(int(value))]
    return [f"{value:g}", str(value)]


def test_every_held_out_figure_is_in_its_quoted_lines():
    held = [e for e in entries() if e.get("held_out")]
    assert len(held) >= 4
    for e in held:
        for figure in ("model_loading_gib", "available_kv_gib", "kv_cache_tokens"):
            if e.get(figure) is not None:
                printed = _printed(e[figure])
                if figure == "kv_cache_tokens" and e[figure] % 16 == 0:  # V0 prints blocks of 16 tokens
                    printed += [f"{word} blocks: {e[figure] // 16}" for word in ("GPU", "cuda")]
                assert any(text in e["quote"] for text in printed), (e["model"], figure)


def test_held_out_start_ups_are_reported_apart():
    results, summary = run(entries())
    held = [r for r in results if r.held_out]
    assert summary["held_out"]["entries"] == len(held) >= 4
    for figure in FIGURES:
        part = summary["held_out"][figure]
        assert {"count", "mean_abs_pct_error", "signed_mean_pct_error", "optimistic"} <= set(part)
        assert {"mean_abs_pct_error", "signed_mean_pct_error", "optimistic"} <= set(summary[figure])


def test_the_gemma_entry_the_docs_cite_is_modelled_from_the_shipped_config():
    assert "google/gemma-3-1b-it" in shipped_configs()
    results, _ = run(entries())
    gemma = [r for r in results if r.model == "google/gemma-3-1b-it"]
    assert gemma and all(r.status == "modelled" for r in gemma)
    assert gemma[0].predicted["kv_bytes_per_token"] and gemma[0].observed["kv_bytes_per_token"]


def test_an_unknown_config_ref_is_skipped_with_the_reason():
    result = run([{"model": "x/y", "config_ref": "x/not-shipped"}])[0][0]
    assert result.status == "skipped" and "config_ref" in result.reason


def test_optimistic_is_half_a_gib_or_3_percent_on_the_optimistic_side():
    def result(**figures):
        pred = {f: figures.get(f, (None, None))[0] for f in FIGURES}
        obs = {f: figures.get(f, (None, None))[1] for f in FIGURES}
        return EntryResult(0, "s", "m", "modelled", predicted=pred, observed=obs)

    assert result(available_kv_gib=(10.6, 10.0)).optimistic_in("available_kv_gib")
    assert not result(available_kv_gib=(10.4, 10.0)).optimistic_in("available_kv_gib")  # within 0.5 GiB
    assert not result(available_kv_gib=(60.0, 70.0)).optimistic_in("available_kv_gib")  # pessimistic
    assert result(available_kv_gib=(72.2, 70.0)).optimistic_in("available_kv_gib")  # 3% of 70 is 2.1
    assert result(model_loading_gib=(14.0, 15.0)).optimistic_in("model_loading_gib")  # lighter weights
    assert not result(model_loading_gib=(16.0, 15.0)).optimistic_in("model_loading_gib")
    assert result(kv_bytes_per_token=(90.0, 100.0)).optimistic_in("kv_bytes_per_token")


def test_bench_accuracy_with_no_file_runs_the_shipped_set():
    out = CliRunner().invoke(main, ["bench", "accuracy"], terminal_width=200)
    assert out.exit_code in (0, 1), out.output
    assert "held out" in out.stdout and "mean |error|" in out.stdout and "optimistic" in out.stdout
    data = json.loads(CliRunner().invoke(main, ["bench", "accuracy", "--format", "json"]).stdout)
    for entry in data["entries"]:
        assert "held_out" in entry
        if entry["status"] == "modelled":
            assert set(entry["predicted"]) == set(entry["observed"]) == set(FIGURES)
    held = json.loads(CliRunner().invoke(main, ["bench", "accuracy", "--held-out", "--format", "json"]).stdout)
    assert held["entries"] and all(e["held_out"] for e in held["entries"])


def test_the_helps_name_the_formats_they_read():
    runner = CliRunner()
    calibrate = runner.invoke(main, ["calibrate", "--help"], terminal_width=200).stdout
    assert "Model loading took" in calibrate and "[Stage-N]" in calibrate
    accuracy = runner.invoke(main, ["bench", "accuracy", "--help"], terminal_width=200).stdout
    assert "JSON lines" in accuracy and "held_out" in accuracy and "config_ref" in accuracy


def test_the_settings_a_log_states_are_read():
    found, lines = parse_settings(GEMMA_LOG.read_text())
    assert found["vllm_version"] == "0.13.0" and found["engine"] == "V1"
    assert found["max_model_len"] == 2048 and found["gpu_memory_utilization"] == 0.95
    assert found["tensor_parallel_size"] == 1 and found["kv_cache_dtype"] == "auto"
    assert found["max_num_batched_tokens"] == 8192 and found["enforce_eager"] is False
    v0, _ = parse_settings("INFO 11-20 llm_engine.py:249] Initializing an LLM engine (v0.6.4.post1) with config: "
                           "model='m', dtype=torch.float16, max_seq_len=4096, tensor_parallel_size=2, "
                           "quantization=awq, enforce_eager=True, kv_cache_dtype=fp8")
    assert v0["engine"] == "V0" and v0["vllm_version"] == "0.6.4.post1" and v0["dtype"] == "float16"
    assert v0["quantization"] == "awq" and v0["kv_cache_dtype"] == "fp8" and v0["tensor_parallel_size"] == 2
    banner, _ = parse_settings("(APIServer pid=1) INFO [utils.py:297]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.18.0")
    assert banner["vllm_version"] == "0.18.0"
    sampler, _ = parse_settings("INFO 09-04 [topk_topp_sampler.py:50] Using FlashInfer for top-p & top-k sampling.")
    assert sampler["sampler"] == "flashinfer"
    fallback, _ = parse_settings("WARNING [topk_topp_sampler.py:61] FlashInfer is not available. Falling back to "
                                 "the PyTorch-native implementation of top-p & top-k sampling.")
    assert fallback["sampler"] == "pytorch"
    graphs, _ = parse_settings("INFO [gpu_model_runner.py:5955] Estimated CUDA graph memory: 2.35 GiB total")
    assert graphs["cudagraph_estimate_gib"] == 2.35


def test_from_vllm_0_21_the_logged_cuda_graph_estimate_comes_off_the_kv_budget():
    """vllm 0.28.0 v1/worker/gpu_worker.py determine_available_memory subtracts
    profile_cudagraph_memory() ("default since v0.21.0"); the model does not derive that estimate, so
    a start-up whose log does not print it gets no available-KV prediction, and one that does gets it
    subtracted. vLLM-Omni's workers never subtract it."""
    entry = {"model": "qwen3-tts-1.7b", "config": next(e for e in entries() if e["model"] == "Qwen/Qwen3-8B")["config"],
             "vllm_version": "0.21.0", "engine": "V1", "gpu": "H100-80GB", "gpu_memory_utilization": 0.9,
             "max_model_len": 4096, "quote": "", "source": "https://example.org"}
    unknown, eager, logged = run([entry, {**entry, "enforce_eager": True},
                                  {**entry, "quote": "Estimated CUDA graph memory: 1.50 GiB total"}])[0]
    assert unknown.predicted["available_kv_gib"] is None
    assert abs(eager.predicted["available_kv_gib"] - logged.predicted["available_kv_gib"] - 1.5) < 1e-3
    before = run([{**entry, "vllm_version": "0.20.0"}])[0][0]
    assert before.predicted["available_kv_gib"] == eager.predicted["available_kv_gib"]


def test_the_sampler_a_log_names_sets_the_profile_peak():
    """The same vLLM 0.10.1.1 start-up with FlashInfer's sampler leaves more KV than with the sort path."""
    entry = next(e for e in entries() if "Using FlashInfer for top-p & top-k sampling" in e.get("quote", ""))
    with_flashinfer = run([entry])[0][0].predicted["available_kv_gib"]
    pytorch = run([{**entry, "sampler": "pytorch"}])[0][0].predicted["available_kv_gib"]
    assert with_flashinfer > pytorch + 0.5


def test_bench_entry_turns_a_log_and_its_config_into_an_entry(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({k: v for k, v in shipped_configs()["google/gemma-3-1b-it"].items()
                                  if not k.startswith("_")}))
    out = CliRunner().invoke(main, ["bench", "entry", str(GEMMA_LOG), "--config", str(config),
                                    "--source", "https://example.org/log", "--set", "max_num_seqs=256"])
    assert out.exit_code == 0, out.output
    entry = json.loads(out.stdout)
    shipped = next(e for e in entries() if e["model"] == "google/gemma-3-1b-it")
    for key in ("model_loading_gib", "available_kv_gib", "kv_cache_tokens", "max_model_len",
                "gpu_memory_utilization", "vllm_version", "max_num_batched_tokens"):
        assert entry[key] == shipped[key], key
    assert entry["max_num_seqs"] == 256 and entry["held_out"] is True
    assert "Model loading took 1.9148 GiB" in entry["quote"]
    path = tmp_path / "e.jsonl"
    path.write_text(out.stdout)
    result = run(read_entries(path.read_text(), str(path)))[0][0]
    assert result.status == "modelled"


def test_bench_entry_refuses_a_stage_the_log_lacks_and_a_missing_config(tmp_path):
    config = tmp_path / "config.json"
    config.write_text("{}")
    runner = CliRunner()
    assert runner.invoke(main, ["bench", "entry", str(GEMMA_LOG)]).exit_code == 2
    out = runner.invoke(main, ["bench", "entry", str(GEMMA_LOG), "--config", str(config), "--stage", "3"])
    assert out.exit_code == 2 and re.search(r"stage 3", out.stderr)


def test_a_catalog_stage_at_a_version_it_does_not_model_is_skipped_with_the_reason():
    entry = {"model": "qwen3-tts-0.6b:talker", "omni_version": "0.18", "model_loading_gib": 1.73,
             "source": "https://example.org", "quote": "Model loading took 1.73 GiB"}
    result = run([entry])[0][0]
    assert result.status == "skipped" and "no stage-args defaults" in result.reason


def test_a_logged_zero_is_compared_without_a_percentage(tmp_path):
    entry = next(e for e in entries() if e["model"] == "Qwen/Qwen3-8B")
    path = tmp_path / "zero.jsonl"
    path.write_text(json.dumps({**entry, "available_kv_gib": 0.0, "kv_cache_tokens": None}) + "\n")
    for fmt in ("table", "json"):
        out = CliRunner().invoke(main, ["bench", "accuracy", str(path), "--format", fmt])
        assert out.exit_code in (0, 1) and "internal error" not in out.output, out.output
    assert "each logged as 0" in CliRunner().invoke(main, ["bench", "accuracy", str(path)]).stdout


def test_the_graph_estimate_is_read_from_the_utilization_line_and_refused_when_impossible():
    entry = {"model": "m", "config": next(e for e in entries() if e["model"] == "Qwen/Qwen3-8B")["config"],
             "vllm_version": "0.21.0", "engine": "V1", "gpu": "H100-80GB", "gpu_total_gib": 80.0,
             "gpu_memory_utilization": 0.9, "max_model_len": 4096, "source": "https://example.org",
             "quote": "The current --gpu-memory-utilization=0.9000 is equivalent to --gpu-memory-utilization=0.8875"}
    derived, logged, eager, negative, blank = run([
        entry, {**entry, "quote": "Estimated CUDA graph memory: 1.00 GiB total"}, {**entry, "enforce_eager": True},
        {**entry, "cudagraph_estimate_gib": -5}, {**entry, "enforce_eager": True, "quantization": "  ", "dtype": " "}])[0]
    assert abs(eager.predicted["available_kv_gib"] - derived.predicted["available_kv_gib"] - 1.0) < 1e-3
    assert abs(derived.predicted["available_kv_gib"] - logged.predicted["available_kv_gib"]) < 1e-3
    assert negative.status == "skipped" and "not a size in GiB" in negative.reason
    assert blank.status == "modelled" and blank.predicted == eager.predicted
    backwards = run([{**entry, "quote": entry["quote"].replace("0.8875", "0.9500")}])[0][0]
    assert backwards.status == "skipped" and "negative" in backwards.reason

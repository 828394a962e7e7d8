"""The accuracy benchmark (`omni-autoconf bench accuracy`) on the shipped start-up logs
(tests/data/accuracy.jsonl): the documented bounds hold, entries it cannot model are skipped
with a reason, and the default buffer covers the worst over-prediction."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from omni_autoconf.memory.accuracy import read_entries, run
from omni_autoconf.cli.main import main

DATA = Path(__file__).parent / "data" / "accuracy.jsonl"


def shipped():
    return run(read_entries(DATA.read_text(), str(DATA)))


def test_no_prediction_is_optimistic_and_bounded_entries_are_within_the_bound():
    results, summary = shipped()
    assert summary["optimistic"] == 0
    assert summary["bounded"] >= 8 and summary["outside_bound"] == 0


def test_kv_bytes_per_token_is_exact_wherever_the_log_has_the_figures():
    results, _ = shipped()
    compared = [r for r in results if r.status == "modelled" and r.observed["kv_bytes_per_token"] is not None]
    assert len(compared) >= 15
    for r in compared:
        assert r.observed["kv_bytes_per_token"] == r.predicted["kv_bytes_per_token"], (r.index, r.model)


def test_weights_are_within_3_percent_where_logged():
    results, _ = shipped()
    for r in results:
        if r.status == "modelled" and r.observed["model_loading_gib"]:
            assert abs(r.error("model_loading_gib")) <= 0.03 * r.observed["model_loading_gib"], (r.index, r.model)


def test_the_qwen3_omni_entries_are_reproduced():
    results, _ = shipped()
    omni = [r for r in results if r.model.startswith("qwen3-omni-moe")]
    assert len(omni) == 3 and all(r.status == "modelled" for r in omni)
    talker = next(r for r in omni if r.observed["kv_cache_tokens"])
    assert talker.predicted["kv_bytes_per_token"] == 20480 == talker.observed["kv_bytes_per_token"]


def test_entries_it_cannot_model_are_skipped_with_a_reason():
    results, _ = shipped()
    skipped = [r for r in results if r.status == "skipped"]
    assert skipped and all(r.reason for r in skipped)
    assert any("pipeline parallelism" in r.reason for r in skipped)


def test_mla_geometry_from_a_config_gives_1152_bytes_per_layer_at_every_tp():
    cfg = json.loads(next(line for line in DATA.read_text().splitlines() if "DeepSeek-V2-Lite" in line))["config"]
    for tp in (1, 2, 4):
        entry = {"model": "deepseek-ai/DeepSeek-V2-Lite", "config": cfg, "tensor_parallel_size": tp}
        result = run([entry])[0][0]
        assert result.predicted["kv_bytes_per_token"] == 1152 * cfg["num_hidden_layers"]


def test_the_command_prints_the_table_and_json():
    runner = CliRunner()
    table = runner.invoke(main, ["bench", "accuracy", str(DATA)])
    assert table.exit_code == 0, table.stdout
    assert "0 optimistic beyond max(1 GiB, 10%)" in table.stdout
    data = json.loads(runner.invoke(main, ["bench", "accuracy", str(DATA), "--format", "json"]).stdout)
    assert {"entries", "summary"} <= set(data)
    first = data["entries"][0]
    assert {"source", "status", "predicted", "observed"} <= set(first)
    assert set(first["predicted"]) == {"model_loading_gib", "available_kv_gib", "kv_cache_tokens", "kv_bytes_per_token"}


def test_a_malformed_entries_file_is_exit_2(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"model": "x"}\nnot json\n')
    result = CliRunner().invoke(main, ["bench", "accuracy", str(path)])
    assert result.exit_code == 2 and "line 2" in result.stderr


def test_the_default_buffer_covers_the_worst_over_prediction():
    """README: the default --buffer is at least the largest KV over-prediction on the set."""
    from omni_autoconf.defaults import DEFAULT_BUFFER_GIB

    _, summary = shipped()
    assert summary["most_optimistic_kv_gib"] <= DEFAULT_BUFFER_GIB

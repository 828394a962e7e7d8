"""A small subset of `make bench` (benchmarks/solve_times.py): every row is a result, a
refusal included, and rows are emitted as they are solved. No timing is asserted."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "solve_times.py"


def _bench():
    spec = importlib.util.spec_from_file_location("solve_times", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_subset_prints_each_row_and_treats_refusals_as_results():
    bench = _bench()
    printed: list[str] = []
    inventories = [("1 GPU", "1xH100-80GB"), ("2 GPUs", "2xH100-80GB")]
    rows = bench.scale_rows(["qwen2.5-omni-3b", "hunyuan-image-3.0", "qwen3-omni-moe"], inventories, fleets=False,
                            emit=printed.append)
    assert len(rows) == len(printed) == 6
    assert all(len(r) == len(bench.SCALE_HEADER) for r in rows)
    status = {(r[0], r[1]): r[2] for r in rows}
    assert status["qwen2.5-omni-3b", "1 GPU"] == "optimal"
    assert status["qwen3-omni-moe", "1 GPU"] == "infeasible"  # a proven "no plan" is a row
    assert status["hunyuan-image-3.0", "1 GPU"].startswith(("refused", "infeasible"))  # once an uncaught error
    table = bench._table(bench.SCALE_HEADER, rows)
    assert table.count("\n") == len(rows) + 1


def test_bench_lists_every_catalog_model_and_the_fleets():
    from omni_autoconf.inputs.catalog import catalog_names

    bench = _bench()
    seen: list[tuple[str, str]] = []
    bench.scale_row = lambda model, label, gpus, *nodes: seen.append((model, label)) or [model, label] + ["-"] * 6
    bench.scale_rows(emit=lambda line: None)
    assert {m for m, _ in seen} == set(catalog_names())
    assert {label for m, label in seen if m == bench.FLAGSHIP} >= {label for label, *_ in bench.FLEETS}

"""`omni-autoconf bench accuracy FILE.jsonl`: the memory model against observed start-ups.

Exit 0 when no modelled entry is optimistic beyond the documented bound (more KV
predicted than vLLM allocated, by more than max(1 GiB, 10%)) and every V1 entry with a
whole configuration lies within it; 1 otherwise; 2 on invalid input.
"""

from __future__ import annotations

import json

import click

from ..errors import InputError
from .common import once, run_command
from .output_files import write_output


@click.group("bench", invoke_without_command=True)
@click.pass_context
def bench_group(ctx: click.Context) -> None:
    """Benchmarks of the memory model."""
    if ctx.invoked_subcommand is None:
        raise click.UsageError(f"bench needs a subcommand: {', '.join(sorted(bench_group.commands))}")


@bench_group.command("accuracy")
@click.argument("entries")
@click.option("--format", "fmt", multiple=True, type=click.Choice(["table", "json"]), help="Default: table.")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def accuracy_command(entries: str, fmt: tuple[str, ...], debug: bool) -> None:
    """Predicted vs observed start-up figures for each entry of ENTRIES (JSON lines in the
    format of tests/data/accuracy.jsonl), then the error summary."""
    run_command(debug, lambda: _accuracy(entries, once(fmt, "--format", "table")))


def _accuracy(path: str, fmt: str) -> int:
    from ..inputs.yamlio import read_text
    from ..memory.accuracy import read_entries, run

    results, summary = run(read_entries(read_text(path), path))
    if fmt == "json":
        write_output(None, json.dumps({"entries": [r.as_dict() for r in results], "summary": summary}, indent=2) + "\n")
    else:
        write_output(None, render_accuracy(results, summary))
    return 1 if summary["optimistic"] or summary["outside_bound"] else 0


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.{digits}f}"
    return f"{int(value):,}" if abs(value) >= 1000 else f"{value:g}"


def render_accuracy(results, summary) -> str:
    from ..emit.summary import text_table as _table

    rows = [("#", "model", "weights GiB (pred/obs)", "KV GiB (pred/obs)", "KV error", "tokens (pred/obs)",
             "bytes/token", "status")]
    for r in results:
        if r.status != "modelled":
            rows.append((str(r.index), r.model[:38], "-", "-", "-", "-", "-", f"skipped: {r.reason}"[:70]))
            continue
        p, o = r.predicted, r.observed
        err = r.error("available_kv_gib")
        bpt = "exact" if o["kv_bytes_per_token"] == p["kv_bytes_per_token"] else (
            f"{_fmt(p['kv_bytes_per_token'])} vs {_fmt(o['kv_bytes_per_token'], 0)}" if o["kv_bytes_per_token"] else "-")
        rows.append((str(r.index), r.model[:38], f"{_fmt(p['model_loading_gib'])}/{_fmt(o['model_loading_gib'])}",
                     f"{_fmt(p['available_kv_gib'])}/{_fmt(o['available_kv_gib'])}",
                     "-" if err is None else f"{err:+.2f}", f"{_fmt(p['kv_cache_tokens'])}/{_fmt(o['kv_cache_tokens'])}",
                     bpt, "OPTIMISTIC" if r.optimistic() else ("outside bound" if r.outside_bound() else (
                         "ok" if r.bounded else "ok (unbounded)"))))
    lines = [_table(rows)]
    s = summary
    lines.append(f"{s['entries']} entries: {s['modelled']} modelled, {s['skipped']} skipped; "
                 f"{s['optimistic']} optimistic beyond max(1 GiB, 10%); {s['outside_bound']} of the {s['bounded']} "
                 "V1 entries with a whole configuration outside it")
    for figure in ("model_loading_gib", "available_kv_gib", "kv_cache_tokens", "kv_bytes_per_token"):
        f = s[figure]
        if f["count"]:
            lines.append(f"  {figure}: {f['count']} compared, median |error| {_fmt(f['median_abs_error'])}, "
                         f"max |error| {_fmt(f['max_abs_error'])} ({f['max_relative_error']:.1%} at most)")
    return "\n".join(lines) + "\n"


__all__ = ["bench_group", "InputError"]

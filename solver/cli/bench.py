"""`omni-autoconf bench accuracy [FILE.jsonl]` and `omni-autoconf bench entry LOG --config FILE`.

`accuracy` runs the memory model against observed start-ups: the shipped set (installed with
the package, omni_autoconf/data/accuracy.jsonl) or a file of entries in its format. Exit 0
when no modelled entry is optimistic beyond the documented bound (more KV predicted than vLLM
allocated, by more than max(1 GiB, 10%)) and every V1 entry with a whole configuration lies
within it; 1 otherwise; 2 on invalid input. `entry` turns one vLLM start-up log and its
config.json into an entry of that format.
"""

from __future__ import annotations

import json

import click

from ..errors import InputError
from .common import once, run_command
from .output_files import write_output

ENTRY_FORMAT = """\
ENTRIES is JSON lines, one observed start-up a line (default: the shipped set). Each object holds
the settings of the run (tensor_parallel_size, max_model_len, max_num_seqs, max_num_batched_tokens,
gpu_memory_utilization, kv_cache_dtype, enforce_eager, vllm_version, engine V0/V1, gpu and/or
gpu_total_gib, usage_context api_server/llm; a setting left out is unknown), the figures vLLM printed (model_loading_gib from
"Model loading took", available_kv_gib from "Available KV cache memory", kv_cache_tokens from
"GPU KV cache size"), source (URL) and quote (the log lines), and the model: `model` names a
catalog model (`model:stage`), or `config` holds the HF config.json, or `config_ref` names a
Hub id whose config the package ships. `held_out: true` marks a start-up the memory model was
not tuned on. `omni-autoconf bench entry` writes one from a log."""


@click.group("bench", invoke_without_command=True)
@click.pass_context
def bench_group(ctx: click.Context) -> None:
    """Benchmarks of the memory model."""
    if ctx.invoked_subcommand is None:
        raise click.UsageError(f"bench needs a subcommand: {', '.join(sorted(bench_group.commands))}")


@bench_group.command("accuracy", epilog=ENTRY_FORMAT)
@click.argument("entries", required=False)
@click.option("--format", "fmt", multiple=True, type=click.Choice(["table", "json"]), help="Default: table.")
@click.option("--held-out", is_flag=True, help="Only the entries marked held_out (never tuned on).")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def accuracy_command(entries: str | None, fmt: tuple[str, ...], held_out: bool, debug: bool) -> None:
    """Predicted vs observed start-up figures for each entry of ENTRIES, then per figure the
    mean absolute and signed mean % error and the count of predictions more than
    max(0.5 GiB, 3%) optimistic, for all entries and for the held-out ones."""
    run_command(debug, lambda: _accuracy(entries, once(fmt, "--format", "table"), held_out))


def _accuracy(path: str | None, fmt: str, held_out: bool) -> int:
    from ..inputs.yamlio import read_text
    from ..memory.accuracy import read_entries, run, shipped_text

    # `is not None`: an empty name ("") is a usage error (read_text says so, exit 2), not the shipped set
    text, where = (read_text(path), path) if path is not None else (shipped_text(), "the shipped accuracy set")
    entries = read_entries(text, where)
    if held_out:
        entries = [e for e in entries if e.get("held_out")]
    results, summary = run(entries)
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
        index = f"{r.index}{'*' if r.held_out else ''}"
        if r.status != "modelled":
            rows.append((index, r.model[:38], "-", "-", "-", "-", "-", f"skipped: {r.reason}"[:70]))
            continue
        p, o = r.predicted, r.observed
        err = r.error("available_kv_gib")
        bpt = "exact" if o["kv_bytes_per_token"] == p["kv_bytes_per_token"] else (
            f"{_fmt(p['kv_bytes_per_token'])} vs {_fmt(o['kv_bytes_per_token'], 0)}" if o["kv_bytes_per_token"] else "-")
        rows.append((index, r.model[:38], f"{_fmt(p['model_loading_gib'])}/{_fmt(o['model_loading_gib'])}",
                     f"{_fmt(p['available_kv_gib'])}/{_fmt(o['available_kv_gib'])}",
                     "-" if err is None else f"{err:+.2f}", f"{_fmt(p['kv_cache_tokens'])}/{_fmt(o['kv_cache_tokens'])}",
                     bpt, "OPTIMISTIC" if r.optimistic() else ("outside bound" if r.outside_bound() else (
                         "ok" if r.bounded else "ok (unbounded)"))))
    lines = [_table(rows)]
    s = summary
    lines.append(f"{s['entries']} entries: {s['modelled']} modelled, {s['skipped']} skipped; "
                 f"{s['optimistic']} optimistic beyond max(1 GiB, 10%); {s['outside_bound']} of the {s['bounded']} "
                 "V1 entries with a whole configuration outside it")
    for title, part in (("all entries", s), (f"held out (* above: never tuned on), {s['held_out']['entries']} "
                                              f"entries, {s['held_out']['modelled']} modelled", s["held_out"])):
        lines.append(f"{title}: per figure, mean |error| and signed mean as % of the logged figure, and predictions "
                     "more than max(0.5 GiB, 3%) optimistic")
        for figure in ("model_loading_gib", "available_kv_gib", "kv_cache_tokens", "kv_bytes_per_token"):
            f = part[figure]
            if f["count"] and f["max_relative_error"] is None:  # every logged figure is 0: no % error
                lines.append(f"  {figure}: {f['count']} compared, each logged as 0, {f['optimistic']} optimistic; "
                             f"max |error| {_fmt(f['max_abs_error'])}")
            elif f["count"]:
                lines.append(f"  {figure}: {f['count']} compared, mean |error| {f['mean_abs_pct_error']:.1f}%, signed "
                             f"{f['signed_mean_pct_error']:+.1f}%, {f['optimistic']} optimistic; median |error| "
                             f"{_fmt(f['median_abs_error'])}, max {_fmt(f['max_abs_error'])}; largest relative "
                             f"{f['max_relative_error']:.1%}")
            else:
                lines.append(f"  {figure}: none compared")
    return "\n".join(lines) + "\n"


@bench_group.command("entry")
@click.argument("log")
@click.option("--config", "config_path", multiple=True, metavar="FILE", help="The model's config.json.  [required]")
@click.option("--model", multiple=True, metavar="ID", help="Hub id (default: the log's model).")
@click.option("--stage", multiple=True, type=int, metavar="N", help="Which stage of a vLLM-Omni log. Default: 0.")
@click.option("--gpu", multiple=True, metavar="NAME", help="The GPU it ran on (a catalog name, or as the log says).")
@click.option("--gpu-total-gib", multiple=True, type=float, metavar="X", help="What CUDA reports as total, in GiB.")
@click.option("--source", multiple=True, metavar="URL", help="Where the log was published.")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="A setting the log does not state (max_num_seqs=256, tensor_parallel_size=2, ...).")
@click.option("--held-out/--tuned", default=True, help="Mark it held out (default) or tuned on.")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def entry_command(log: str, config_path, model, stage, gpu, gpu_total_gib, source, settings, held_out, debug) -> None:
    """Turn a vLLM (or vLLM-Omni) start-up LOG and the model's config.json into one entry of
    `bench accuracy`'s format, printed as a JSON line. The settings come from the log's
    "non-default args", engine-config and version lines (--set adds or overrides one), the
    figures from the lines `calibrate` reads; what neither states is left out (unknown)."""
    run_command(debug, lambda: _entry(log, once(config_path, "--config"), once(model, "--model"),
                                      int(once(tuple(map(str, stage)), "--stage", "0")), once(gpu, "--gpu"),
                                      once(tuple(map(str, gpu_total_gib)), "--gpu-total-gib"),
                                      once(source, "--source"), settings, held_out))


def _entry(log, config_path, model, stage, gpu, total, source, settings, held_out) -> int:
    from ..inputs.logparse import _value, parse_log, parse_settings
    from ..inputs.yamlio import parse_json, read_text

    if not config_path:
        raise InputError("bench entry needs --config (the model's config.json)")
    config = parse_json(read_text(config_path), config_path)
    if not isinstance(config, dict):
        raise InputError(f"{config_path}: expected a JSON object")
    text = read_text(log)
    found, setting_lines = parse_settings(text)
    parsed = parse_log(text)
    if stage not in parsed.stages:
        raise InputError(f"{log}: no start-up figures for stage {stage} (found: "
                         f"{', '.join(map(str, sorted(parsed.stages))) or 'none'})")
    fig = parsed.stages[stage]
    entry = {k: v for k, v in found.items() if v is not None or k == "quantization"}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set {item!r}: expected KEY=VALUE")
        entry[key.strip()] = _value(value)
    entry["model"] = model or entry.get("model") or config.get("_name_or_path") or "?"
    entry["config"] = config
    for key in ("model_loading_gib", "available_kv_gib", "kv_cache_tokens"):
        if getattr(fig, key) is not None:
            entry[key] = getattr(fig, key)
    if total is not None or fig.total_gib is not None:
        entry["gpu_total_gib"] = float(total) if total is not None else fig.total_gib
    if fig.utilization is not None:
        entry.setdefault("gpu_memory_utilization", fig.utilization)
    if gpu:
        entry["gpu"] = gpu
    lines = text.splitlines()
    entry["quote"] = "\n".join(_clip(lines[n - 1]) for n in sorted(set(setting_lines) | set(fig.lines)))
    entry["source"] = source or log
    entry["held_out"] = held_out
    write_output(None, json.dumps(entry, sort_keys=True, ensure_ascii=False) + "\n")
    return 0


def _clip(line: str, width: int = 600) -> str:
    return line if len(line) <= width else line[:width] + " [...]"


__all__ = ["bench_group", "InputError", "ENTRY_FORMAT"]

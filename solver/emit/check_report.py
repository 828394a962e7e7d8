"""`check` results for people (a table) and machines (JSON). Pure: report -> text."""

from __future__ import annotations

import json
from typing import Any

from .. import __version__
from ..planning.check import CheckReport
from ..vllm.facts import gib_text
from .summary import text_table as _table


def check_dict(report: CheckReport) -> dict[str, Any]:
    """A start-up prediction as data; byte figures per rank."""
    return {
        "tool": {"name": "omni-autoconf", "version": __version__},
        "config": report.config.path,
        "schema": report.config.schema,
        "omni_version": report.version.name,
        "mode": "upstream" if report.upstream else "vllm-omni",
        "parallel_init": report.parallel_init,
        "ok": report.ok,
        "gpus": [
            {
                "index": g.gpu.index,
                "name": g.gpu.name,
                "total_bytes": g.gpu.total_bytes,
                "stages": list(g.stages),
                "used_bytes": g.used_bytes,
                "margin_bytes": g.margin_bytes,
                "free_bytes": g.free_bytes,
            }
            for g in report.gpus
        ],
        "stages": [
            {
                "stage_id": o.run.stage_id,
                "name": o.run.name,
                "devices": list(o.run.devices),
                "num_replicas": o.run.replicas,
                "replica_kv_cache_tokens": list(o.replica_kv_tokens),
                "tensor_parallel_size": o.run.tensor_parallel_size,
                # a diffusion stage that declares none has none (its runtime reads none)
                "gpu_memory_utilization": o.run.gpu_memory_utilization if o.run.bounded or o.run.util_steps else None,
                "bounded_by_fraction": o.run.bounded,
                "started": o.started,
                "requested_bytes": o.requested_bytes,
                "budget_bytes_per_gpu": {str(d): b for d, b in sorted(o.budget_bytes_per_gpu.items())},
                "weights_bytes": o.run.memory.weights_bytes if o.run.memory else None,
                "activation_bytes": o.run.memory.activation_bytes if o.run.memory else None,
                "overhead_bytes": o.run.memory.overhead_bytes if o.run.memory else None,
                "kv_cache_bytes": o.kv_cache_bytes,
                "kv_bytes_per_token": o.run.memory.kv_bytes_per_token if o.run.memory else None,
                "kv_cache_tokens": o.kv_cache_tokens,
                "max_model_len": o.run.knobs.max_model_len if o.run.has_kv else None,
                "max_num_seqs": o.run.knobs.max_num_seqs,
                "max_num_batched_tokens": o.run.knobs.max_num_batched_tokens,
                "max_concurrency": round(o.max_concurrency, 4),
            }
            for o in report.stages
        ],
        "problems": [p.as_dict() for p in report.problems],
    }


def render_check_json(report: CheckReport) -> str:
    return json.dumps(check_dict(report), indent=2) + "\n"


def render_check_table(report: CheckReport) -> str:
    rows = [("stage", "devices", "TP", "util", "weights", "activ.", "KV/rank", "KV tokens", "x max_len", "starts")]
    for o in report.stages:
        r = o.run
        kv = r.has_kv and r.memory is not None
        rows.append(
            (
                f"{r.stage_id} {r.name}" + (f" x{r.replicas}" if r.replicas > 1 else ""),
                ",".join(map(str, r.devices)),
                str(r.tensor_parallel_size),
                f"{r.gpu_memory_utilization:g}" if r.bounded else "-",  # a diffusion stage ignores it
                gib_text(r.memory.weights_bytes) if r.memory else "-",
                gib_text(r.memory.activation_bytes) if r.memory else "-",
                gib_text(o.kv_cache_bytes) if kv else "-",
                str(o.kv_cache_tokens) if kv else "-",
                f"{o.max_concurrency:.2f}" if kv else "-",
                "yes" if o.started else "NO",
            )
        )
    out = [_table(rows)]
    rows = [("GPU", "name", "total", "used", "margin", "free", "stages")]
    for g in report.gpus:
        rows.append((str(g.gpu.index), g.gpu.name, gib_text(g.gpu.total_bytes), gib_text(g.used_bytes),
                     gib_text(g.margin_bytes), gib_text(g.free_bytes), ",".join(g.stages) or "-"))
    out.append(_table(rows))
    mode = "upstream vLLM (refuses)" if report.upstream else "vLLM-Omni (caps to free memory)"
    errors = report.errors
    warnings = len(report.problems) - len(errors)
    if report.ok:
        tail = f"; {warnings} warning(s) below" if warnings else ""
        out.append(f"OK: {report.config.path} starts with no predicted problem ({mode}; memory in GiB{tail})\n")
    else:
        tail = f" and {warnings} warning(s)" if warnings else ""
        out.append(f"{len(errors)} problem(s){tail} predicted for {report.config.path} ({mode}):\n")
    for p in report.problems:
        where = " ".join(x for x in (p.stage or "", f"GPU {p.gpu}" if p.gpu is not None else "") if x)
        label = p.code if p.severity == "error" else f"warning: {p.code}"
        out.append(f"  [{label}] {where}: {p.message}\n")
    return "\n".join(out)


def render_gain_table(report: CheckReport, plan) -> str:
    """KV per stage before (the file, as it would start) and after (the fixed plan)."""
    rows = [("stage", "before: tokens", "x max_len", "after: tokens", "x max_len", "gain")]
    for o, sp in zip(report.stages, plan.stages):
        if not sp.stage.has_kv_cache:
            continue
        before = o.kv_cache_tokens if o.started else 0
        gain = f"{sp.kv_cache_tokens / before:.2f}x" if before else "starts now"
        rows.append((sp.stage.name, str(before), f"{o.max_concurrency if o.started else 0:.2f}",
                     str(sp.kv_cache_tokens), f"{sp.max_concurrency:.2f}", gain))
    return _table(rows)

"""The plan as data and as a summary for people: JSON (`--format json`) and the tables
the command line prints on stderr. The files vLLM-Omni reads are render.py's."""

from __future__ import annotations

import json
from typing import Any

from .. import __version__
from ..inputs.gpus import local_index, node_names
from ..errors import NoPlanError
from ..planning.planner import Plan
from ..vllm.facts import gib_text
from .render import DIFFUSION_UTIL_NOTE, _devices, status_line


def plan_dict(plan: Plan) -> dict[str, Any]:
    """The plan as plain data (the JSON output). Byte figures are per TP rank. GPU indices
    run over all hosts; a replica's `devices` are the ids on its own host (`node`), as
    that host's deploy file names them."""
    gpus = [g.gpu for g in plan.gpus]

    def replicas(sp) -> list[dict[str, Any]]:
        return [{"node": gpus[devs[0]].node, "devices": [local_index(gpus, gpus[d]) for d in devs],
                 "tensor_parallel_size": sp.tensor_parallel_size,
                 "headroom": round(h, 4) if sp.stage.has_kv_cache else None}
                for devs, h in zip(sp.replica_devices(), sp.replica_headroom())]

    out = {
        "tool": {"name": "omni-autoconf", "version": __version__},
        "model": plan.request.pipeline.name,
        "model_ref": plan.request.model_ref or plan.request.pipeline.name,
        "model_notes": list(plan.request.model_notes),
        "omni_version": plan.request.version.name,
        # the patch release --omni-version named, planned as omni_version; present only when one was named
        **({"omni_version_given": plan.request.omni_version_given} if plan.request.omni_version_given else {}),
        "schema": plan.request.schema,
        "status": plan.status,
        "gap": round(plan.gap, 6),
        "notes": list(plan.notes),
        "option_notes": list(plan.option_notes),
        "version_notes": plan.request.pipeline.deploy_notes(plan.request.version.name)
        if plan.request.schema == "deploy" else [],
        "solve_seconds": round(plan.solve_seconds, 3),
        "frontend_gpu_bytes": plan.request.pipeline.frontend_gpu_bytes,  # on each host's first GPU
        "objective_min_kv_requests": round(plan.min_kv_requests, 4),
        "untested_tp": [sp.stage.name for sp in plan.stages
                        if sp.tensor_parallel_size not in sp.stage.tested_tp_degrees(plan.request.version.name)],
        "gpus": [
            {
                "index": g.gpu.index,
                "node": g.gpu.node,
                "local_index": local_index(gpus, g.gpu),
                "name": g.gpu.name,
                "total_bytes": g.gpu.total_bytes,
                "stages": list(g.stages),
                "requested_bytes": g.requested_bytes,
                "outside_bytes": g.outside_bytes,
                "margin_bytes": g.margin_bytes,
                "free_bytes": g.free_bytes,
            }
            for g in plan.gpus
        ],
        "stages": [
            {
                "stage_id": sp.stage.stage_id,
                "name": sp.stage.name,
                "devices": list(sp.devices),
                "tensor_parallel_size": sp.tensor_parallel_size,
                "gpu_memory_utilization": sp.gpu_memory_utilization,
                "bounded_by_fraction": sp.stage.bounded_by_fraction,
                "weights_bytes": sp.memory.weights_bytes - sp.memory.load_buffer_bytes,
                "load_buffer_bytes": sp.memory.load_buffer_bytes,
                "activation_bytes": sp.memory.activation_bytes,
                "overhead_bytes": sp.memory.overhead_bytes,
                "kv_cache_bytes": sp.kv_cache_bytes,
                "kv_bytes_per_token": sp.memory.kv_bytes_per_token,
                "kv_cache_tokens": sp.kv_cache_tokens,
                "max_model_len": sp.knobs.max_model_len if sp.stage.has_kv_cache else None,
                "max_concurrency": round(sp.max_concurrency, 4),
                "headroom": round(sp.headroom, 4) if sp.stage.has_kv_cache else None,
                "max_num_seqs": sp.knobs.max_num_seqs,
                "max_num_batched_tokens": sp.knobs.max_num_batched_tokens,
                "enforce_eager": sp.knobs.enforce_eager,
                "kv_cache_bytes_per_gpu": {str(g): b for g, b in sorted(sp.kv_bytes_per_gpu.items())},
                "num_replicas": sp.num_replicas,
                "replicas": replicas(sp),
                "memory": {
                    "non_torch_bytes": sp.memory.non_torch_bytes,
                    "persistent_activation_bytes": sp.memory.persistent_bytes,
                    "runner_buffer_bytes": sp.memory.runner_bytes,
                    "kv_accounting": sp.memory.accounting,
                    "cuda_context_bytes": sp.memory.context_bytes,
                    "nccl_bytes": sp.memory.nccl_bytes,
                    "graph_reserve_bytes": sp.memory.graph_reserve_bytes,
                    "serving_outside_bytes": sp.memory.serving_outside_bytes,
                },
            }
            for sp in plan.stages
        ],
    }
    if plan.rate is not None:  # --target-rate only: other plans keep their bytes
        from .rate_text import json_key

        out.update(json_key(plan))
    if plan.knobs_lowered:  # only then: a plan at the bundled knobs keeps its bytes
        out["knobs_lowered"] = [change.as_dict() for change in plan.knobs_lowered]
    if len(node_names(gpus)) > 1:
        from .multihost import argv, file_name, head_of, layouts, shell_words

        head, head_stage = head_of(plan)
        all_layouts = layouts(plan)
        out["head"] = {"node": head, "stage_id": head_stage}
        out["deploy_files"] = {file_name(layout): layout.node for layout in all_layouts}
        # argv: the same command as a list of words; "${NAME}" words are environment variables
        out["hosts"] = [{"node": node, "commands": [{"command": shell_words(words), "after_head": wait,
                                                     "argv": list(map(str, words))}
                                                    for words, wait in argv(plan, node, all_layouts)]}
                        for node in node_names(gpus)]
    return out


def render_json(plan: Plan) -> str:
    return json.dumps(plan_dict(plan), indent=2) + "\n"


def render_table(plan: Plan) -> str:
    """A readable per-GPU and per-stage summary for people (goes to stderr)."""
    gpus = [g.gpu for g in plan.gpus]
    several = len(node_names(gpus)) > 1
    rows = [("GPU", "name", "total", "requested", "outside", "margin", "free", "stages")]
    for g in plan.gpus:
        rows.append(
            (
                str(g.gpu.index) + (f" ({g.gpu.node} {local_index(gpus, g.gpu)})" if several else ""),
                g.gpu.name,
                gib_text(g.gpu.total_bytes),
                gib_text(g.requested_bytes),
                gib_text(g.outside_bytes),
                gib_text(g.margin_bytes),
                gib_text(g.free_bytes),
                ",".join(g.stages) or "-",
            )
        )
    out = [text_table(rows)]
    rows = [("stage", "devices", "TP", "util", "weights", "activ.", "KV/rank", "KV tokens", "x max_len", "headroom")]
    for sp in plan.stages:
        rows.append(
            (
                f"{sp.stage.stage_id} {sp.stage.name}",
                _devices(sp),
                str(sp.tensor_parallel_size) + (f" x{sp.num_replicas}" if sp.num_replicas > 1 else ""),
                f"{sp.gpu_memory_utilization:g}" + ("" if sp.stage.bounded_by_fraction else "*"),
                gib_text(sp.memory.weights_bytes),
                gib_text(sp.memory.activation_bytes),
                gib_text(sp.kv_cache_bytes) if sp.stage.has_kv_cache else "-",
                str(sp.kv_cache_tokens) if sp.stage.has_kv_cache else "-",
                f"{sp.max_concurrency:.2f}" if sp.stage.has_kv_cache else "-",
                f"{sp.headroom:.2f}" if sp.stage.has_kv_cache else "-",
            )
        )
    out.append(text_table(rows))
    if plan.knobs_lowered:
        out.append("knobs lowered (the bundled values leave no plan):\n"
                   + "".join(f"  {change.text()}\n" for change in plan.knobs_lowered))
    per = "; TP xN: N replicas, KV tokens and headroom summed over them" if any(
        sp.num_replicas > 1 for sp in plan.stages) else ""
    if not all(sp.stage.bounded_by_fraction for sp in plan.stages):
        per += f"; util*: {DIFFUSION_UTIL_NOTE}"
    if plan.rate is not None:
        from .rate_text import table

        out.append(table(plan))
    out.append(f"status: {status_line(plan)}; solved in {plan.solve_seconds:.2f} s; memory in GiB per GPU / per rank{per}")
    return "\n".join(out) + "\n"


def text_table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def no_plan_dict(exc: NoPlanError) -> dict[str, Any]:
    """A failed plan as data (`--format json`): status "infeasible" or "unknown"."""
    from ..planning.fixes import FIX_KINDS

    out = {"status": exc.status, "message": exc.message, "reasons": exc.reasons}
    if exc.status == "infeasible":
        out.update({"conflict": exc.conflict, "fixes": [f.as_dict() for f in exc.fixes], "fixes_tried": FIX_KINDS,
                    "fix_search_note": exc.fix_search_note})
    return out

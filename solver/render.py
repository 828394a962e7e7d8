"""Renderers: a Plan -> deploy YAML, legacy stage_args YAML, JSON, or a summary table.

Pure functions returning text; writing files is the CLI's job. Output is byte-stable:
no timestamps, fixed key order, fixed number formatting (JSON's `solve_seconds` is the
one figure that changes between runs, and it is not in the YAML).
"""

from __future__ import annotations

import copy
import json
import shlex
from typing import Any

import yaml

from . import __version__
from .catalog import PLANNED_KEYS  # noqa: F401  (re-exported for tests)
from .defaults import DEFAULT_BUFFER_GIB, DEFAULT_RESOLUTION, default_workers
from .planner import Plan, Request, StagePlan
from .vllm_facts import GiB


class _Dumper(yaml.SafeDumper):
    """Block style, no aliases, lists of scalars inline (as vLLM-Omni's own files)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(not isinstance(x, (dict, list)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


class _Quoted(str):
    """A string written in double quotes (device lists, as in vLLM-Omni's files: "0,1")."""


_Dumper.add_representer(list, _represent_list)
_Dumper.add_representer(_Quoted, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style='"'))


def _dump(data: dict) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=100)


def _gib(nbytes: float) -> str:
    return f"{nbytes / GiB:.2f}"


def _devices(sp: StagePlan) -> str:
    return _Quoted(",".join(str(d) for d in sp.devices))


def command_line(request: Request) -> str:
    """The options that reproduce `request` (without the program name). Floats are written
    in their shortest exact form, so the command re-creates the same request."""
    r = request
    parts = [f"--gpus {gpu_terms(r.gpus)}", f"--model {shlex.quote(r.model_ref or r.pipeline.name)}",
             f"--omni-version {r.version.name}"]
    if r.schema != r.version.schema:
        parts.append(f"--schema {r.schema}")
    for flag, mapping in (
        ("--tp", r.tp),
        ("--max-model-len", r.max_model_len),
        ("--max-num-seqs", r.max_num_seqs),
        ("--max-num-batched-tokens", r.max_num_batched_tokens),
        ("--min-concurrency", r.min_concurrency),
        ("--weight", r.weight),
    ):
        option = flag[2:].replace("-", "_")
        terms = [_number(r.global_values[option])] if option in r.global_values else []
        terms += [f"{k}={_number(v)}" for k, v in sorted(mapping.items())]
        if terms:
            parts.append(f"{flag} " + ",".join(terms))
    if r.enforce_eager:
        parts.append("--enforce-eager " + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(r.enforce_eager.items())))
    for name, devices in sorted(r.devices.items()):
        parts.append(f"--devices {name}={','.join(map(str, devices))}")
    for group in r.exclusive:
        parts.append("--exclusive " + ",".join(group))
    if r.kv_cache_dtype != "auto":
        parts.append(f"--kv-cache-dtype {r.kv_cache_dtype}")
    if r.allow_untested_tp:
        parts.append("--allow-untested-tp")
    if r.replicas is not None:
        parts.append(f"--replicas {r.replicas}")
    if r.pin_kv:
        parts.append("--pin-kv")
    if r.calibration is not None:
        parts.append(f"--calibration {shlex.quote(r.calibration.path)}")
    if r.buffer_gib != DEFAULT_BUFFER_GIB:
        parts.append(f"--buffer {_number(r.buffer_gib)}")
    if r.resolution != DEFAULT_RESOLUTION:
        parts.append(f"--resolution {_number(1 / r.resolution)}")
    return " ".join(parts)


def _number(v: float) -> str:
    """Integers as such; other floats by repr(), which reads back as the same float."""
    if isinstance(v, int) or float(v).is_integer():
        return str(int(v))
    return repr(float(v))


def gpu_terms(gpus) -> str:
    """`2xH100-80GB,1xA100-40GB` for a GPU list (consecutive equal names grouped)."""
    terms: list[list] = []
    for gpu in gpus:
        if terms and terms[-1][1] == gpu.name:
            terms[-1][0] += 1
        else:
            terms.append([1, gpu.name])
    return ",".join(f"{n}x{name}" for n, name in terms)


def status_line(plan: Plan) -> str:
    """The solver's outcome in words: optimal, or feasible with its proven gap."""
    if plan.status == "optimal":
        return "optimal (proven by CP-SAT)"
    text = f"feasible (time limit reached; proven gap {plan.gap:.2%} on the smallest headroom)"
    text += "".join(f"; {note}" for note in plan.notes)
    # Where the clock stopped the search depends on the machine: only a proven optimum is
    # the same bytes everywhere.
    workers = plan.request.workers or default_workers()
    return text + (f"; a run with --time-limit {_number(plan.request.time_limit_s)} and --workers {workers} "
                   "may stop at another plan: raise --time-limit for a proven one")


def header(plan: Plan) -> str:
    """Comment block: tool version, inputs, solver status, per-GPU memory map."""
    lines = [
        f"Generated by omni-autoconf {__version__}. Do not edit by hand: re-run the planner.",
        f"Inputs: omni-autoconf {command_line(plan.request)}",
        f"Plan: {status_line(plan)}; smallest KV headroom {plan.min_kv_requests:.2f} max-length requests.",
    ]
    lines += [f"Note: {note}" for note in plan.option_notes]
    if plan.request.model_ref and plan.request.model_ref != plan.request.pipeline.name:
        lines.append(f"Model: {plan.request.model_ref} read as pipeline {plan.request.pipeline.name}; weights from "
                     "its safetensors headers.")
    lines += [f"Note: {note}" for note in plan.request.model_notes]
    if plan.request.calibration is not None and plan.request.calibration.model == plan.request.pipeline.name:
        lines.append(f"CALIBRATED: {plan.request.calibration.describe()}.")
    if plan.request.pin_kv:
        lines.append("KV pinned: each KV stage's kv_cache_memory_bytes is the planned KV; vLLM allocates it without "
                     "sizing, and gpu_memory_utilization stays the start-up gate.")
    for group in plan.request.exclusive:
        lines.append(
            f"Assumes {', '.join(group)} are never resident at the same time (separate launches or "
            "sleep mode); their fractions are sized for that, not for a joint launch."
        )
    for sp in plan.stages:
        if sp.tensor_parallel_size not in sp.stage.tested_tp_degrees(plan.request.version.name):
            lines.append(
                f"UNTESTED: {sp.stage.name} at tensor_parallel_size {sp.tensor_parallel_size}: no vLLM-Omni "
                f"{plan.request.version.name} config or test runs it (--allow-untested-tp)."
            )
    lines.append("Per-GPU memory map (GiB; requested = ceil(total x gpu_memory_utilization)):")
    for g in plan.gpus:
        lines.append(
            f"  GPU {g.gpu.index} {g.gpu.name} total {_gib(g.gpu.total_bytes)}: "
            f"requested {_gib(g.requested_bytes)} + outside {_gib(g.outside_bytes)} "
            f"+ margin {_gib(g.margin_bytes)} -> free {_gib(g.free_bytes)}  [{', '.join(g.stages) or '-'}]"
        )
    for sp in plan.stages:
        kv = "no KV cache"
        if sp.stage.has_kv_cache:
            kv = f"KV {_gib(sp.kv_cache_bytes)} = {sp.kv_cache_tokens} tokens = {sp.max_concurrency:.2f} x {sp.knobs.max_model_len}"
            if sp.headroom_cap is not None:
                kv += f", headroom {sp.headroom:.2f} (max_num_seqs {sp.knobs.max_num_seqs}, no prefix caching)"
        replicas = f" x{sp.num_replicas} replicas" if sp.num_replicas > 1 else ""
        lines.append(
            f"  stage {sp.stage.stage_id} {sp.stage.name}: devices {_devices(sp)}{replicas} TP={sp.tensor_parallel_size} "
            f"util {sp.gpu_memory_utilization:g}: weights {_gib(sp.memory.weights_bytes)}, "
            f"activations {_gib(sp.memory.activation_bytes)}, {kv} (per rank)"
        )
    return "".join(f"# {line}\n" for line in lines)


def _planned_fields(sp: StagePlan, pin_kv: bool = False) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if sp.num_replicas > 1:  # devices is then the pool (replica r: a consecutive slice of TP ids)
        fields["num_replicas"] = sp.num_replicas
    fields.update(tensor_parallel_size=sp.tensor_parallel_size, gpu_memory_utilization=sp.gpu_memory_utilization)
    if sp.stage.has_kv_cache:
        fields["max_model_len"] = sp.knobs.max_model_len
    fields["max_num_seqs"] = sp.knobs.max_num_seqs
    fields["max_num_batched_tokens"] = sp.knobs.max_num_batched_tokens
    fields["enforce_eager"] = sp.knobs.enforce_eager
    if sp.knobs.kv_cache_dtype != "auto" and sp.stage.has_kv_cache:
        fields["kv_cache_dtype"] = sp.knobs.kv_cache_dtype
    if pin_kv and sp.stage.has_kv_cache:
        fields["kv_cache_memory_bytes"] = sp.kv_cache_bytes
    return fields


def with_planned(head: dict[str, Any], planned: dict[str, Any], catalog: dict[str, Any]) -> dict[str, Any]:
    """`head`, then the planned values, then the catalog's other fields: a planned value
    always wins over a catalog field of the same name."""
    out = dict(head)
    out.update(planned)
    for key, value in catalog.items():
        if key not in out:
            out[key] = copy.deepcopy(value)
    return out


def ensure_renderable(request: Request) -> None:
    """Refuse (InputError, exit 2) a schema the chosen version's loader does not read, and
    a legacy file whose stage wiring names functions that version no longer has."""
    from .errors import InputError
    from .vllm_facts import SCHEMA_VERSIONS, in_range

    v, schema, pipeline = request.version, request.schema, request.pipeline
    if not v.reads(schema):
        raise InputError(
            f"vLLM-Omni {v.name} does not read the {schema} schema (it is read by vLLM-Omni "
            f"{_range_text(SCHEMA_VERSIONS[schema])}); choose --schema {'deploy' if schema == 'stage-args' else 'stage-args'}"
            " or another --omni-version"
        )
    if schema == "stage-args" and not in_range(v.name, pipeline.legacy_versions):
        raise InputError(
            f"a stage_args file for {pipeline.name} works on vLLM-Omni {_range_text(pipeline.legacy_versions)} only: "
            f"{pipeline.legacy_versions_source}; use --schema deploy for {v.name}"
        )


def _range_text(versions: str) -> str:
    low, sep, high = versions.partition("-")
    return f"{low} to {high}" if high else (f"{low} and later" if sep else low)


def render_deploy(plan: Plan) -> str:
    """The vLLM-Omni deploy YAML (`stages:`, 0.20+), loadable by load_deploy_config.

    Engine args that are not StageDeployConfig fields (kv_cache_dtype, moe_backend,
    enable_chunked_prefill) are written as flat stage keys, as the bundled files do: every
    version's _parse_stage_deploy passes unknown stage keys on to the engine, while an
    `engine_extras:` mapping is dropped by 0.20 and 0.22 (a reserved key there)."""
    ensure_renderable(plan.request)
    top = copy.deepcopy(plan.request.pipeline.deploy_top)
    connectors = top.pop("connectors", None)
    doc: dict[str, Any] = dict(top)
    if connectors is not None:
        doc["connectors"] = connectors
    stages = []
    for sp in plan.stages:
        catalog = copy.deepcopy(sp.stage.deploy_fields)
        extras = catalog.pop("engine_extras", {})
        entry = with_planned({"stage_id": sp.stage.stage_id, "devices": _devices(sp)},
                             _planned_fields(sp, plan.request.pin_kv), {**catalog, **extras})
        stages.append(entry)
    doc["stages"] = stages
    return header(plan) + _dump(doc)


def render_stage_args(plan: Plan) -> str:
    """The legacy `stage_args` YAML as vLLM-Omni's OmegaConf loader reads it, with the
    fields of the version planned for (worker_type from 0.14, overlays by version)."""
    ensure_renderable(plan.request)
    version = plan.request.version
    stage_args = []
    for sp in plan.stages:
        st = sp.stage
        fields = copy.deepcopy(st.legacy_fields)
        entry: dict[str, Any] = {"stage_id": st.stage_id, "stage_type": fields.pop("stage_type", "llm")}
        planned = _planned_fields(sp, plan.request.pin_kv)
        runtime_planned = {"devices": _devices(sp), "max_batch_size": sp.knobs.max_num_seqs}
        if "num_replicas" in planned:  # a runtime key in the legacy schema (0.20-0.26)
            runtime_planned["num_replicas"] = planned.pop("num_replicas")
        entry["runtime"] = with_planned({}, runtime_planned, st.legacy_runtime)
        catalog = _legacy_engine_args(st, version)
        entry["engine_args"] = with_planned({}, planned, catalog)
        entry.update(fields)
        stage_args.append(entry)
    doc: dict[str, Any] = {"stage_args": stage_args}
    doc.update(copy.deepcopy(plan.request.pipeline.legacy_top))
    return header(plan) + _dump(doc)


# vllm-omni 0.14-0.30 wheels, vllm_omni/engine/stage_init_utils.py (0.14/0.16:
# entrypoints/omni_stage.py): worker_type "ar" / "generation" resolves to the platform's
# GPUARWorker / GPUGenerationWorker, the classes the 0.12 files name as worker_cls.
_WORKER_TYPES = {
    "vllm_omni.worker.gpu_ar_worker.GPUARWorker": "ar",
    "vllm_omni.worker.gpu_generation_worker.GPUGenerationWorker": "generation",
}


def _legacy_engine_args(st, version) -> dict[str, Any]:
    from .vllm_facts import in_range

    args = copy.deepcopy(st.legacy_engine_args)
    if version.legacy_worker_type and args.get("worker_cls") in _WORKER_TYPES:
        rebuilt = {}
        for key, value in args.items():  # same position in the file
            if key == "worker_cls":
                rebuilt["worker_type"] = _WORKER_TYPES[value]
            else:
                rebuilt[key] = value
        args = rebuilt
    for overlay in st.legacy_overlays:
        if in_range(version.name, overlay.versions):
            args.update(copy.deepcopy(overlay.engine_args))
    return args


def plan_dict(plan: Plan) -> dict[str, Any]:
    """The plan as plain data (the JSON output). Byte figures are per TP rank."""
    return {
        "tool": {"name": "omni-autoconf", "version": __version__},
        "model": plan.request.pipeline.name,
        "model_ref": plan.request.model_ref or plan.request.pipeline.name,
        "model_notes": list(plan.request.model_notes),
        "omni_version": plan.request.version.name,
        "schema": plan.request.schema,
        "status": plan.status,
        "gap": round(plan.gap, 6),
        "notes": list(plan.notes),
        "option_notes": list(plan.option_notes),
        "solve_seconds": round(plan.solve_seconds, 3),
        "objective_min_kv_requests": round(plan.min_kv_requests, 4),
        "untested_tp": [sp.stage.name for sp in plan.stages
                        if sp.tensor_parallel_size not in sp.stage.tested_tp_degrees(plan.request.version.name)],
        "gpus": [
            {
                "index": g.gpu.index,
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
                "replicas": [{"node": 0, "devices": list(devs), "tensor_parallel_size": sp.tensor_parallel_size,
                              "headroom": round(h, 4) if sp.stage.has_kv_cache else None}
                             for devs, h in zip(sp.replica_devices(), sp.replica_headroom())],
                "memory": {
                    "non_torch_bytes": sp.memory.non_torch_bytes,
                    "persistent_activation_bytes": sp.memory.persistent_bytes,
                    "runner_buffer_bytes": sp.memory.runner_bytes,
                    "kv_accounting": sp.memory.accounting,
                    "cuda_context_bytes": sp.memory.context_bytes,
                    "nccl_bytes": sp.memory.nccl_bytes,
                    "graph_reserve_bytes": sp.memory.graph_reserve_bytes,
                },
            }
            for sp in plan.stages
        ],
    }


def render_json(plan: Plan) -> str:
    return json.dumps(plan_dict(plan), indent=2) + "\n"


def render_table(plan: Plan) -> str:
    """A readable per-GPU and per-stage summary for people (goes to stderr)."""
    rows = [("GPU", "name", "total", "requested", "outside", "margin", "free", "stages")]
    for g in plan.gpus:
        rows.append(
            (
                str(g.gpu.index),
                g.gpu.name,
                _gib(g.gpu.total_bytes),
                _gib(g.requested_bytes),
                _gib(g.outside_bytes),
                _gib(g.margin_bytes),
                _gib(g.free_bytes),
                ",".join(g.stages) or "-",
            )
        )
    out = [_table(rows)]
    rows = [("stage", "devices", "TP", "util", "weights", "activ.", "KV/rank", "KV tokens", "x max_len", "headroom")]
    for sp in plan.stages:
        rows.append(
            (
                f"{sp.stage.stage_id} {sp.stage.name}",
                _devices(sp),
                str(sp.tensor_parallel_size) + (f" x{sp.num_replicas}" if sp.num_replicas > 1 else ""),
                f"{sp.gpu_memory_utilization:g}",
                _gib(sp.memory.weights_bytes),
                _gib(sp.memory.activation_bytes),
                _gib(sp.kv_cache_bytes) if sp.stage.has_kv_cache else "-",
                str(sp.kv_cache_tokens) if sp.stage.has_kv_cache else "-",
                f"{sp.max_concurrency:.2f}" if sp.stage.has_kv_cache else "-",
                f"{sp.headroom:.2f}" if sp.stage.has_kv_cache else "-",
            )
        )
    out.append(_table(rows))
    per = "; TP xN: N replicas, KV tokens and headroom summed over them" if any(
        sp.num_replicas > 1 for sp in plan.stages) else ""
    out.append(f"status: {status_line(plan)}; solved in {plan.solve_seconds:.2f} s; memory in GiB per GPU / per rank{per}")
    return "\n".join(out) + "\n"


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


RENDERERS = {"deploy": render_deploy, "stage-args": render_stage_args}

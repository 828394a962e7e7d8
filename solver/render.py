"""Renderers: a Plan -> deploy YAML, legacy stage_args YAML, JSON, or a summary table.

Pure functions returning text; writing files is the CLI's job. Output is byte-stable:
no timestamps, fixed key order, fixed number formatting (JSON's `solve_seconds` is the
one figure that changes between runs, and it is not in the YAML).
"""

from __future__ import annotations

import copy
import shlex
from typing import Any

import yaml

from . import __version__
from .defaults import DEFAULT_BUFFER_GIB, DEFAULT_RESOLUTION, default_workers
from .configfile import HEAD_FILE_NOTE, HOST_FILE_NOTE
from .gpus import local_index, node_names
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
    parts = [inventory_options(r.gpus), f"--model {shlex.quote(r.model_ref or r.pipeline.name)}",
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


def inventory_options(gpus) -> str:
    """`--gpus ...` (and `--nodes N`) that re-create an inventory of one or more hosts."""
    hosts = node_names(gpus)
    if len(hosts) == 1:
        return f"--gpus {gpu_terms(gpus)}"
    per_host = [gpu_terms([g for g in gpus if g.node == h]) for h in hosts]
    if hosts == [f"node{i}" for i in range(len(hosts))] and len(set(per_host)) == 1:
        return f"--nodes {len(hosts)} --gpus {per_host[0]}"
    return "--gpus " + shlex.quote(";".join(f"{h}={t}" for h, t in zip(hosts, per_host)))


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


DIFFUSION_UTIL_NOTE = ("a diffusion stage's fraction is what it holds at its largest request, declared for "
                       "vLLM-Omni's admission (parallel_stage_init); its dense runtime is bounded by no fraction")


def header(plan: Plan) -> str:
    """Comment block: tool version, inputs, solver status, per-GPU memory map."""
    lines = [
        f"Generated by omni-autoconf {__version__}. Do not edit by hand: re-run the planner.",
        f"Inputs: omni-autoconf {command_line(plan.request)}",
        f"Plan: {status_line(plan)}; " + (f"smallest KV headroom {plan.min_kv_requests:.2f} max-length requests."
                                           if any(sp.stage.has_kv_cache for sp in plan.stages)
                                           else "no stage holds a KV cache."),
    ]
    lines += [f"Note: {note}" for note in plan.option_notes]
    if plan.request.model_ref and plan.request.model_ref != plan.request.pipeline.name:
        lines.append(f"Model: {plan.request.model_ref} read as pipeline {plan.request.pipeline.name}; weights from "
                     "its safetensors headers.")
    lines += [f"Note: {note}" for note in plan.request.model_notes]
    if plan.request.schema == "deploy":
        lines += [f"Note: {note}" for note in plan.request.pipeline.deploy_notes(plan.request.version.name)]
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
    lines.append("Per-GPU memory map (GiB; requested = ceil(total x gpu_memory_utilization), or what a stage "
                 "without KV cache or with pinned KV holds):")
    gpus = [g.gpu for g in plan.gpus]
    several = len(node_names(gpus)) > 1
    for g in plan.gpus:
        where = f" ({g.gpu.node} GPU {local_index(gpus, g.gpu)})" if several else ""
        lines.append(
            f"  GPU {g.gpu.index}{where} {g.gpu.name} total {_gib(g.gpu.total_bytes)}: "
            f"requested {_gib(g.requested_bytes)} + outside {_gib(g.outside_bytes)} "
            f"+ margin {_gib(g.margin_bytes)} -> free {_gib(g.free_bytes)}  [{', '.join(g.stages) or '-'}]"
        )
    if not all(sp.stage.bounded_by_fraction for sp in plan.stages):
        lines.append(f"Note: {DIFFUSION_UTIL_NOTE}.")
    for sp in plan.stages:
        rows = sp.stage.kv_rows_per_request
        if sp.stage.has_kv_cache and rows > 1:
            lines.append(f"Note: a request of {sp.stage.name} is {rows} KV rows (CFG's); its headroom and max_num_seqs "
                         f"count rows: {sp.headroom / rows:.2f} requests, {sp.knobs.max_num_seqs // rows} at once.")
    if plan.request.pipeline.frontend_gpu_bytes:
        where = "each host's first GPU holds" if several else "GPU 0's outside holds"
        lines.append(f"Note: {where} {_gib(plan.request.pipeline.frontend_gpu_bytes)} GiB for the API process's "
                     "own front-end encoder, loaded on the first request that needs it.")
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
    return "".join(f"# {comment_text(line)}\n" for line in lines)


def comment_text(text: str) -> str:
    """`text` safe inside a one-line comment of YAML or sh: characters that are not
    printable (line breaks of either, NEL, U+2028) written as escapes."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def _planned_fields(sp: StagePlan, pin_kv: bool = False) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if sp.num_replicas > 1:  # devices is then the pool (replica r: a consecutive slice of TP ids)
        fields["num_replicas"] = sp.num_replicas
    fields.update(tensor_parallel_size=sp.tensor_parallel_size, gpu_memory_utilization=sp.gpu_memory_utilization)
    # a stage without KV cache gets one only where its bundled file sets it (the codec stream a
    # code2wav accumulates must fit: vllm_omni 0.30.0 deploy/qwen3_tts.yaml stage 1)
    if sp.stage.has_kv_cache or any(d.max_model_len for d in sp.stage.defaults.values()):
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
    from .vllm_facts import SCHEMA_VERSIONS, range_text

    v, schema, pipeline = request.version, request.schema, request.pipeline
    if not v.reads(schema):
        raise InputError(
            f"vLLM-Omni {v.name} does not read the {schema} schema (it is read by vLLM-Omni "
            f"{range_text(SCHEMA_VERSIONS[schema])}); choose --schema {'deploy' if schema == 'stage-args' else 'stage-args'}"
            " or another --omni-version"
        )
    hosts = node_names(request.gpus)
    if len(hosts) > 1 and not v.multi_host:
        raise InputError(
            f"a plan over {len(hosts)} hosts is written for vLLM-Omni 0.26+: there each host runs its stages "
            "headless (--stage-id, --omni-dp-size-local) against the head with the file's connectors; 0.22 and 0.24 "
            "headless stages ignore the connectors (run_headless passes async_chunk=False to "
            "get_stage_connector_spec, vllm_omni/entrypoints/cli/serve.py), 0.20's single-stage mode runs no LLM "
            "replicas and 0.18 has no headless mode. Plan one host per pipeline for older versions")
    if len(hosts) > 1 and not all(st.bounded_by_fraction for st in pipeline.stages):
        raise InputError(
            f"a plan of {pipeline.name} over {len(hosts)} hosts is not written: a diffusion stage (its dense runtime, "
            "and BAGEL's KV received from the thinker) is not modelled across hosts; plan one host")
    if len(hosts) > 1 and schema != "deploy":
        raise InputError(f"a plan over {len(hosts)} hosts is written in the deploy schema: use --schema deploy")
    reason = pipeline.unserved_reason(schema, v.name)
    if reason is not None:
        raise InputError(reason)


def _stage_number(key: str, prefix: str) -> int | None:
    tail = key[len(prefix):] if key.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else None


def render_deploy(plan: Plan, layout=None) -> str:
    """The vLLM-Omni deploy YAML (`stages:`, 0.20+), loadable by load_deploy_config.

    Engine args that are not StageDeployConfig fields (kv_cache_dtype, moe_backend,
    enable_chunked_prefill) are written as flat stage keys, as the bundled files do: every
    version's _parse_stage_deploy passes unknown stage keys on to the engine, while an
    `engine_extras:` mapping is dropped by 0.20 and 0.22 (a reserved key there).

    `layout` (multihost.HostLayout): the file of one host of a multi-host plan, with that
    host's devices and replica counts, and its connectors across hosts."""
    ensure_renderable(plan.request)
    top = copy.deepcopy(plan.request.pipeline.deploy_top_at(plan.request.version.name))
    connectors = top.pop("connectors", None)
    if layout is not None and layout.connectors:
        connectors = {**(connectors or {}), **copy.deepcopy(layout.connectors)}
    doc: dict[str, Any] = dict(top)
    if connectors is not None:
        doc["connectors"] = connectors
    stages = []
    for sp in plan.stages:
        catalog = copy.deepcopy(sp.stage.deploy_fields)
        extras = catalog.pop("engine_extras", {})
        planned = _planned_fields(sp, plan.request.pin_kv)
        head: dict[str, Any] = {"stage_id": sp.stage.stage_id, "devices": _devices(sp)}
        if layout is not None:
            sid = sp.stage.stage_id
            planned.pop("num_replicas", None)
            head.pop("devices")
            if sid in layout.devices:  # elsewhere: no placement here (the head waits for one replica)
                head["devices"] = _Quoted(",".join(map(str, layout.devices[sid])))
                if layout.replicas[sid] > 1:
                    planned = {"num_replicas": layout.replicas[sid], **planned}
            if sid in layout.inputs:
                catalog["input_connectors"] = {**(catalog.get("input_connectors") or {}), **layout.inputs[sid]}
            if catalog.get("output_connectors"):  # both ends of an edge must name one connector type
                catalog["output_connectors"] = {  # (vllm_omni 0.30.0 distributed/omni_connectors/utils/initialization.py)
                    key: layout.inputs.get(_stage_number(key, "to_stage_"), {}).get(f"from_stage_{sid}", ref)
                    for key, ref in catalog["output_connectors"].items()}
        stages.append(with_planned(head, planned, {**catalog, **extras}))
    doc["stages"] = stages
    note = "" if layout is None else (HEAD_FILE_NOTE if layout.head else HOST_FILE_NOTE).format(node=layout.node)
    return header(plan) + note + _dump(doc)


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


RENDERERS = {"deploy": render_deploy, "stage-args": render_stage_args}

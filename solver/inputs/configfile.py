"""Reading an existing stage config YAML (either schema) into per-stage settings.

Deploy schema (vLLM-Omni 0.20+): `stages:`, with `base_config` inheritance resolved
relative to the file (stages merged by stage_id, nested dicts deep-merged, as vLLM-Omni's
loader does) and the `platforms.<platform>.stages` overrides applied. Legacy schema:
`stage_args` with `runtime` and `engine_args`. Absent fields are left as None here; the
defaults vLLM would use are filled in by `configcheck`.

Values are read as YAML delivers them to vLLM, and a value vLLM would refuse is an input
error naming the field, never mended: `tensor_parallel_size: 1.7`, `max_model_len: 0`,
`gpu_memory_utilization: true`. Booleans follow pydantic's lax reading, which vLLM's
config classes use ("false", "no", "0" are false).
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from .. import defaults as D
from ..errors import InputError
from .yamlio import parse_mapping, read_text


@dataclass(frozen=True)
class StageSetting:
    """What a config file says about one stage's memory (None: not set in the file)."""

    stage_id: int
    devices: tuple[int, ...] | None
    tensor_parallel_size: int | None
    gpu_memory_utilization: float | None
    max_model_len: int | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    enforce_eager: bool | None
    kv_cache_dtype: str | None
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    kv_cache_memory_bytes: int | None = None
    num_replicas: int | None = None
    disable_hybrid_kv_cache_manager: bool | None = None
    kv_transfer_config: bool = False  # the stage names one (its connector may turn the hybrid manager off)
    dtype: str | None = None
    quantization: str | None = None  # vLLM's `quantization` (fp8 quantizes an unquantized checkpoint at load)
    mamba_cache_dtype: str = "auto"  # a hybrid's conv state dtype (auto: the model's)
    mamba_ssm_cache_dtype: str = "auto"  # its SSM state dtype (auto: the model's config hook, else the conv dtype)
    kv_skip_layers: int = 0  # kv_cache_dtype_skip_layers: layers whose KV stays in the model dtype
    sequence_parallel: int = 1  # a diffusion stage's parallel_config sequence-parallel degree (Ulysses x ring)
    line: int | None = None  # the line of the stage's entry in the file named (None: from a base_config only)
    keys: tuple[tuple[str, str, int | None], ...] = ()  # (section: "" or engine_args/engine_extras, key, line) as written


@dataclass(frozen=True)
class ConfigFile:
    path: str
    schema: str  # "deploy" or "stage-args"
    stages: tuple[StageSetting, ...]
    async_chunk: bool | None = None  # the file's top-level async_chunk (None: the loader's default)
    pipeline: str | None = None  # a deploy file's `pipeline:` override (a registry key of vLLM-Omni)
    top_keys: tuple[tuple[str, int | None], ...] = ()  # a deploy file's top-level keys (base_config merged), line


def _merge(base: Any, overlay: Any) -> Any:
    """Deep merge: dicts key by key, anything else replaced by the overlay."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        out = dict(base)
        for k, v in overlay.items():
            out[k] = _merge(base.get(k), v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(overlay)


def _merge_stages(base: list, overlay: list) -> list:
    """Stages merged by stage_id; stages only in the overlay are appended."""
    by_id = {s.get("stage_id"): s for s in base if isinstance(s, dict)}
    out = [copy.deepcopy(s) for s in base]
    for stage in overlay:
        if not isinstance(stage, dict):
            continue
        sid = stage.get("stage_id")
        if sid in by_id:
            i = next(i for i, s in enumerate(out) if isinstance(s, dict) and s.get("stage_id") == sid)
            out[i] = _merge(out[i], stage)
        else:
            out.append(copy.deepcopy(stage))
    return out


def _mapping(value: Any, where: str, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"{where}: {what} must be a mapping, not {type(value).__name__} {_show(value)}")
    return value


def _sequence(value: Any, where: str, what: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InputError(f"{where}: {what} must be a list, not {type(value).__name__} {_show(value)}")
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _load_yaml(path: Path) -> dict:
    return parse_mapping(read_text(path), str(path))


def _resolve_deploy(path: Path, depth: int = 0) -> dict:
    if depth > D.MAX_BASE_CONFIG_DEPTH:
        raise InputError(f"{path}: base_config chain deeper than {D.MAX_BASE_CONFIG_DEPTH} (a cycle?)")
    raw = _load_yaml(path)
    where = str(path)
    _sequence(raw.get("stages"), where, "stages")
    for name, section in _mapping(raw.get("platforms"), where, "platforms").items():
        _sequence(_mapping(section, where, f"platforms.{name}").get("stages"), where, f"platforms.{name}.stages")
    base_name = raw.pop("base_config", None)
    if base_name is None:
        return raw
    if not isinstance(base_name, str):
        raise InputError(f"{where}: base_config must be a file name, not {_show(base_name)}")
    base = _resolve_deploy((path.parent / base_name).resolve(), depth + 1)
    merged = _merge({k: v for k, v in base.items() if k not in ("stages", "platforms")},
                    {k: v for k, v in raw.items() if k not in ("stages", "platforms")})
    merged["stages"] = _merge_stages(base.get("stages") or [], raw.get("stages") or [])
    platforms = dict(base.get("platforms") or {})
    for name, section in (raw.get("platforms") or {}).items():
        old = platforms.get(name) or {}
        platforms[name] = {**_merge(old, section or {}),
                           "stages": _merge_stages(old.get("stages") or [], (section or {}).get("stages") or [])}
    if platforms:
        merged["platforms"] = platforms
    return merged


def _devices(value: Any, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InputError(f"{where}: devices {_show(value)} must be GPU indices like \"0,1\"")
    parts = [p.strip() for p in str(value).split(",") if p.strip()]
    if not parts or not all(p.isascii() and p.isdigit() for p in parts):
        raise InputError(f"{where}: devices {_show(value)} must be GPU indices like \"0,1\"")
    return tuple(int(p) for p in parts)


def _integer(value: Any, where: str, field: str, low: int = 1, high: int | None = None) -> int | None:
    """An int as vLLM's pydantic fields take it: an int, or a float with no fraction; `high`: a
    count of GPUs, above which no inventory this tool judges can hold it."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
        isinstance(value, float) and (not math.isfinite(value) or not value.is_integer())
    ):
        raise InputError(f"{where}: {field} {_show(value)} is not a whole number")
    if value < low:
        raise InputError(f"{where}: {field} {_show(value)} must be at least {low}")
    if high is not None and value > high:
        raise InputError(f"{where}: {field} {_show(value)} is more than the {high} GPUs this tool judges")
    return int(value)


def _fraction(value: Any, where: str, field: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{where}: {field} {_show(value)} is not a number")
    if not 0 < value <= 1:
        raise InputError(f"{where}: {field} {value} is not in (0, 1]")
    return float(value)


_TRUE = {"true", "t", "yes", "y", "on", "1"}
_FALSE = {"false", "f", "no", "n", "off", "0"}


def _boolean(value: Any, where: str, field: str) -> bool | None:
    """A bool as pydantic's lax mode reads it (vLLM's config classes are pydantic)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise InputError(f"{where}: {field} {_show(value)} is not a boolean")


def _string(value: Any, where: str, field: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise InputError(f"{where}: {field} {_show(value)} must be a string")


_MAMBA_DTYPES = ("auto", "float32", "bfloat16", "float16")


def _setting(flat: dict, devices: Any, where: str, replicas: Any = None) -> StageSetting:
    if "stage_id" not in flat or flat["stage_id"] is None:
        raise InputError(f"{where}: a stage has no stage_id")
    eager = _boolean(flat.get("enforce_eager"), where, "enforce_eager")
    compilation = _mapping(flat.get("compilation_config"), where, "compilation_config")
    mode = str(compilation.get("cudagraph_mode", "")).upper()
    if mode.endswith("NONE"):
        eager = True  # no graphs captured, as enforce_eager (vllm_omni/engine/stage_admission.py)
    for field in ("pipeline_parallel_size", "data_parallel_size"):
        if (_integer(flat.get(field), where, field, high=D.MAX_GPUS) or 1) > 1:
            raise InputError(f"{where}: {field} {flat[field]} is not modelled (tensor parallelism and replicas are); "
                             "check cannot judge this file")
    # a diffusion stage's degrees sit in parallel_config (vllm_omni 0.30.0 diffusion/data.py
    # DiffusionParallelConfig: its world is their product); tensor and sequence parallelism are modelled
    parallel = _mapping(flat.get("parallel_config"), where, "parallel_config")
    # a degree on the stage itself is moved into parallel_config by vLLM-Omni (config/stage_config.py
    # _apply_diffusion_parallel_runtime_overrides), so both places are read, the stage's first
    degree = {field: _integer(flat[field] if flat.get(field) is not None else parallel.get(field),
                              f"{where}: parallel_config", field, high=D.MAX_GPUS) or 1
              for field in ("pipeline_parallel_size", "data_parallel_size", "cfg_parallel_size", "sequence_parallel_size",
                            "ulysses_degree", "ring_degree", "allgather_degree")}
    for field in ("pipeline_parallel_size", "data_parallel_size", "cfg_parallel_size"):
        if degree[field] > 1:
            raise InputError(f"{where}: parallel_config {field} {degree[field]} is not modelled (tensor and sequence "
                             "parallelism and replicas are); check cannot judge this file")
    # DiffusionParallelConfig: sequence_parallel_size = allgather_degree, else ulysses x ring
    sequence_parallel = (degree["allgather_degree"] if degree["allgather_degree"] > 1
                         else degree["ulysses_degree"] * degree["ring_degree"])
    if degree["sequence_parallel_size"] not in (1, sequence_parallel):
        raise InputError(f"{where}: parallel_config sequence_parallel_size {degree['sequence_parallel_size']} is not "
                         f"the product of its degrees ({sequence_parallel})")
    if sequence_parallel > 1024:
        raise InputError(f"{where}: parallel_config sequence parallelism of {sequence_parallel} is more than any host has GPUs")
    tp = _integer(flat.get("tensor_parallel_size"), where, "tensor_parallel_size", high=D.MAX_GPUS)
    if tp is None:
        tp = _integer(parallel.get("tensor_parallel_size"), f"{where}: parallel_config", "tensor_parallel_size",
                      high=D.MAX_GPUS)
    mamba = {}
    for field in ("mamba_cache_dtype", "mamba_ssm_cache_dtype"):  # vllm 0.30.0 config/cache.py MambaDType
        value = _string(flat.get(field), where, field) or "auto"
        if value not in _MAMBA_DTYPES:
            raise InputError(f"{where}: {field} {_show(value)} must be one of {', '.join(_MAMBA_DTYPES)}")
        mamba[field] = value
    block = _integer(flat.get("block_size"), where, "block_size")
    if block not in (None, 16):  # vLLM's default (config/cache.py); a hybrid's block and pages follow it
        raise InputError(f"{where}: block_size {block} is not modelled (vLLM's default 16 is); check cannot judge this file")
    if flat.get("speculative_config") is not None or flat.get("num_speculative_tokens") is not None:
        raise InputError(f"{where}: speculative decoding is not modelled (a draft model's weights and KV, a hybrid's "
                         "extra state blocks); check cannot judge this file")
    if flat.get("mamba_cache_mode") not in (None, "none", "align") or _boolean(flat.get("use_replayssm"), where,
                                                                                "use_replayssm"):
        raise InputError(f"{where}: mamba_cache_mode {_show(flat.get('mamba_cache_mode'))} or use_replayssm is not "
                         "modelled (the state pool is sized for modes none and align); check cannot judge this file")
    skip = flat.get("kv_cache_dtype_skip_layers") or []
    if not isinstance(skip, list) or len(skip) > 4096 or not all(
            isinstance(x, (int, str)) and not isinstance(x, bool) and str(x).isdigit() for x in skip):
        raise InputError(f"{where}: kv_cache_dtype_skip_layers {_show(skip)} must list layer indices (attention-type "
                         "names such as sliding_window are not modelled)")
    mml = flat.get("max_model_len")
    if isinstance(mml, int) and not isinstance(mml, bool) and mml == -1:
        raise InputError(f"{where}: max_model_len -1 (fit to memory) is not modelled; give a length")
    return StageSetting(
        stage_id=_integer(flat["stage_id"], where, "stage_id", low=0),
        devices=_devices(devices, where),
        tensor_parallel_size=tp,
        gpu_memory_utilization=_fraction(flat.get("gpu_memory_utilization"), where, "gpu_memory_utilization"),
        max_model_len=_integer(mml, where, "max_model_len"),
        max_num_seqs=_integer(flat.get("max_num_seqs"), where, "max_num_seqs"),
        max_num_batched_tokens=_integer(flat.get("max_num_batched_tokens"), where, "max_num_batched_tokens"),
        enforce_eager=eager,
        kv_cache_dtype=_string(flat.get("kv_cache_dtype"), where, "kv_cache_dtype"),
        enable_chunked_prefill=_boolean(flat.get("enable_chunked_prefill"), where, "enable_chunked_prefill"),
        enable_prefix_caching=_boolean(flat.get("enable_prefix_caching"), where, "enable_prefix_caching"),
        kv_cache_memory_bytes=_integer(flat.get("kv_cache_memory_bytes"), where, "kv_cache_memory_bytes", low=0) or None,
        num_replicas=_integer(replicas, where, "num_replicas", high=D.MAX_GPUS),
        disable_hybrid_kv_cache_manager=_boolean(flat.get("disable_hybrid_kv_cache_manager"), where,
                                                 "disable_hybrid_kv_cache_manager"),
        kv_transfer_config=flat.get("kv_transfer_config") is not None,
        dtype=_string(flat.get("dtype"), where, "dtype"),
        quantization=_string(flat.get("quantization"), where, "quantization"),
        kv_skip_layers=len({int(x) for x in skip}),
        sequence_parallel=sequence_parallel,
        **mamba,
    )


def _lines(text: str) -> dict[tuple, int]:
    """1-based lines of what a file names, by path: ("", key) a top-level key, (stage_id,) a stage's
    entry, (stage_id, section, key) its keys (section "" flat, or engine_args/engine_extras). The
    text was measured by parse_mapping already (bounded depth and size)."""
    root, out = yaml.compose(text, Loader=yaml.SafeLoader), {}
    for key, value in root.value if isinstance(root, yaml.MappingNode) else ():
        out[("", key.value)] = key.start_mark.line + 1
        for item in value.value if key.value in ("stages", "stage_args") and isinstance(value, yaml.SequenceNode) else ():
            pairs = item.value if isinstance(item, yaml.MappingNode) else []
            sid = next((v.value for k, v in pairs if k.value == "stage_id" and isinstance(v, yaml.ScalarNode)), None)
            out.setdefault((sid,), item.start_mark.line + 1)
            for k, v in pairs:
                out.setdefault((sid, "", k.value), k.start_mark.line + 1)
                for k2, _ in v.value if k.value in ("engine_args", "engine_extras") and isinstance(v, yaml.MappingNode) else ():
                    out.setdefault((sid, k.value, k2.value), k2.start_mark.line + 1)
    return out


def _keyed(setting: StageSetting, lines: dict, sections: dict[str, Any]) -> StageSetting:
    """The setting with its entry's line and the keys it writes (section -> mapping)."""
    sid = str(setting.stage_id)
    keys = tuple((name, k, lines.get((sid, name, k))) for name, mapping in sections.items()
                 for k in (mapping if isinstance(mapping, dict) else {}) if isinstance(k, str))
    return replace(setting, line=lines.get((sid,)), keys=keys)


def _legacy(raw: dict, path: str, lines: dict) -> ConfigFile:
    stages = []
    for i, entry in enumerate(_sequence(raw.get("stage_args"), path, "stage_args")):
        where = f"{path}: stage_args[{i}]"
        entry = _mapping(entry, where, "a stage")
        runtime = _mapping(entry.get("runtime"), where, "runtime")
        engine_args = _mapping(entry.get("engine_args"), where, "engine_args")
        flat = {**engine_args, "stage_id": entry.get("stage_id")}
        if "max_num_seqs" not in flat and "max_batch_size" in runtime:
            flat["max_num_seqs"] = runtime["max_batch_size"]
        stages.append(_keyed(_setting(flat, runtime.get("devices"), where, runtime.get("num_replicas")), lines,
                             {"engine_args": engine_args}))
    return ConfigFile(path, "stage-args", tuple(stages), _boolean(raw.get("async_chunk"), path, "async_chunk"))


PIPELINE_WIDE_FIELDS = ("enable_prefix_caching", "enable_chunked_prefill", "data_parallel_size", "pipeline_parallel_size",
                        "dtype", "quantization")

# The comment line render.py writes into each file of a multi-host plan: such a file places
# only its host's stages, so judged as a whole pipeline it would be wrong.
HEAD_FILE_NOTE = "# Head of host {node}: its own stage's devices only; `sh launch.sh {node}` starts it.\n"
HOST_FILE_NOTE = "# Host {node}: start it with `sh launch.sh {node}`.\n"
_HOST_FILE_MARK = re.compile(r"^# (?:Head of host|Host) (\S+):.*`sh launch.sh", re.M)


def read_config(path: str, platform: str = "cuda", engine_extras: bool = True) -> ConfigFile:
    """Read a deploy or legacy stage config file of one host's whole pipeline.
    `engine_extras=False` reads a deploy file as vLLM-Omni 0.20/0.22 do, which drop a
    stage's `engine_extras:` mapping."""
    if not path.strip():
        raise InputError("an empty file name was given (\"\"); name a file")
    p = Path(path)
    text = read_text(p)
    found = _HOST_FILE_MARK.search(text)
    if found:
        raise InputError(f"{path}: the file of host {found.group(1)} of a multi-host plan (it places only that "
                         "host's stages); only a whole pipeline on one host can be judged")
    raw = parse_mapping(text, str(p))
    lines = _lines(text)
    if "stage_args" in raw:
        return _legacy(raw, path, lines)
    if "stages" not in raw and "base_config" not in raw:
        raise InputError(f"{path}: neither a deploy config (`stages:`) nor a legacy one (`stage_args:`)")
    doc = _resolve_deploy(p.resolve())
    entries = _sequence(doc.get("stages"), path, "stages")
    platforms = _mapping(doc.get("platforms"), path, "platforms")
    section = _mapping(platforms.get(platform), path, f"platforms.{platform}")
    entries = _merge_stages(entries, _sequence(section.get("stages"), path, f"platforms.{platform}.stages"))
    # Top-level engine settings apply to every stage that does not set its own
    # (vllm_omni/config/stage_config.py _PIPELINE_WIDE_ENGINE_FIELDS, 0.20-0.30).
    pipeline_wide = {k: doc[k] for k in PIPELINE_WIDE_FIELDS if doc.get(k) is not None}
    stages = []
    for i, entry in enumerate(entries):
        where = f"{path}: stages[{i}]"
        entry = _mapping(entry, where, "a stage")
        runtime = _mapping(entry.get("runtime"), where, "runtime")
        extras = _mapping(entry.get("engine_extras"), where, "engine_extras") if engine_extras else {}
        flat = {**pipeline_wide, **entry, **_mapping(entry.get("engine_args"), where, "engine_args"), **extras}
        # runtime.num_replicas wins over a flat key (vllm_omni 0.22+ _parse_stage_deploy)
        replicas = runtime.get("num_replicas", entry.get("num_replicas"))
        stages.append(_keyed(_setting(flat, runtime.get("devices", entry.get("devices")), where, replicas), lines,
                             {"": entry, "engine_args": entry.get("engine_args"), "engine_extras": extras}))
    named = doc.get("pipeline")
    if named is not None and (not isinstance(named, str) or not named.isprintable() or len(named) > 200):
        raise InputError(f"{path}: pipeline must be a registry key (one line of text), not {named!r:.80}")
    return ConfigFile(path, "deploy", tuple(stages), _boolean(doc.get("async_chunk"), path, "async_chunk"), named,
                      tuple((k, lines.get(("", k))) for k in [*doc, *(["base_config"] if "base_config" in raw else [])]
                            if isinstance(k, str)))

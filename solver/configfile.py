"""Reading an existing stage config YAML (either schema) into per-stage settings.

Deploy schema (vLLM-Omni 0.26+): `stages:`, with `base_config` inheritance resolved
relative to the file (stages merged by stage_id, nested dicts deep-merged, as vLLM-Omni's
loader does) and the `platforms.<platform>.stages` overrides applied. Legacy schema:
`stage_args` with `runtime` and `engine_args`. Absent fields are left as None here; the
defaults vLLM would use are filled in by `startup.resolve_settings`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InputError
from .yamlio import parse_mapping

MAX_BASE_DEPTH = 8


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


@dataclass(frozen=True)
class ConfigFile:
    path: str
    schema: str  # "deploy" or "stage-args"
    stages: tuple[StageSetting, ...]


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
            i = next(i for i, s in enumerate(out) if s.get("stage_id") == sid)
            out[i] = _merge(out[i], stage)
        else:
            out.append(copy.deepcopy(stage))
    return out


def _load_yaml(path: Path) -> dict:
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    return parse_mapping(text, str(path))


def _resolve_deploy(path: Path, depth: int = 0) -> dict:
    if depth > MAX_BASE_DEPTH:
        raise InputError(f"{path}: base_config chain deeper than {MAX_BASE_DEPTH} (a cycle?)")
    raw = _load_yaml(path)
    base_name = raw.pop("base_config", None)
    if base_name is None:
        return raw
    base = _resolve_deploy((path.parent / str(base_name)).resolve(), depth + 1)
    merged = _merge({k: v for k, v in base.items() if k not in ("stages", "platforms")},
                    {k: v for k, v in raw.items() if k not in ("stages", "platforms")})
    merged["stages"] = _merge_stages(base.get("stages") or [], raw.get("stages") or [])
    platforms = dict(base.get("platforms") or {})
    for name, section in (raw.get("platforms") or {}).items():
        old = platforms.get(name) or {}
        platforms[name] = {**_merge(old, section), "stages": _merge_stages(old.get("stages") or [], (section or {}).get("stages") or [])}
    if platforms:
        merged["platforms"] = platforms
    return merged


def _devices(value: Any, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    text = str(value).strip()
    try:
        return tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise InputError(f"{where}: devices {text!r} must list GPU indices like \"0,1\"") from None


def _number(value: Any, cast, where: str, field: str):
    if value is None:
        return None
    try:
        return cast(value)
    except (TypeError, ValueError):
        raise InputError(f"{where}: {field} {value!r} is not a number") from None


def _setting(flat: dict, devices: Any, where: str) -> StageSetting:
    if "stage_id" not in flat:
        raise InputError(f"{where}: a stage has no stage_id")
    eager = flat.get("enforce_eager")
    mode = str((flat.get("compilation_config") or {}).get("cudagraph_mode", "")).upper()
    if mode.endswith("NONE"):
        eager = True  # no graphs captured, as enforce_eager (stage_admission.py)
    return StageSetting(
        stage_id=_number(flat["stage_id"], int, where, "stage_id"),
        devices=_devices(devices, where),
        tensor_parallel_size=_number(flat.get("tensor_parallel_size"), int, where, "tensor_parallel_size"),
        gpu_memory_utilization=_number(flat.get("gpu_memory_utilization"), float, where, "gpu_memory_utilization"),
        max_model_len=_number(flat.get("max_model_len"), int, where, "max_model_len"),
        max_num_seqs=_number(flat.get("max_num_seqs"), int, where, "max_num_seqs"),
        max_num_batched_tokens=_number(flat.get("max_num_batched_tokens"), int, where, "max_num_batched_tokens"),
        enforce_eager=None if eager is None else bool(eager),
        kv_cache_dtype=flat.get("kv_cache_dtype"),
    )


def read_config(path: str, platform: str = "cuda") -> ConfigFile:
    """Read a deploy or legacy stage config file."""
    p = Path(path)
    raw = _load_yaml(p)
    if "stage_args" in raw:
        stages = []
        for i, entry in enumerate(raw.get("stage_args") or []):
            where = f"{path}: stage_args[{i}]"
            if not isinstance(entry, dict):
                raise InputError(f"{where}: expected a mapping")
            runtime = entry.get("runtime") or {}
            flat = {**(entry.get("engine_args") or {}), "stage_id": entry.get("stage_id")}
            if "max_num_seqs" not in flat and "max_batch_size" in runtime:
                flat["max_num_seqs"] = runtime["max_batch_size"]
            stages.append(_setting(flat, runtime.get("devices"), where))
        return ConfigFile(path, "stage-args", tuple(stages))
    if "stages" not in raw and "base_config" not in raw:
        raise InputError(f"{path}: neither a deploy config (`stages:`) nor a legacy one (`stage_args:`)")
    doc = _resolve_deploy(p.resolve())
    entries = doc.get("stages") or []
    section = (doc.get("platforms") or {}).get(platform) or {}
    entries = _merge_stages(entries, section.get("stages") or [])
    stages = []
    for i, entry in enumerate(entries):
        where = f"{path}: stages[{i}]"
        if not isinstance(entry, dict):
            raise InputError(f"{where}: expected a mapping")
        runtime = entry.get("runtime") or {}
        flat = {**entry, **(entry.get("engine_args") or {}), **(entry.get("engine_extras") or {})}
        stages.append(_setting(flat, runtime.get("devices", entry.get("devices")), where))
    return ConfigFile(path, "deploy", tuple(stages))

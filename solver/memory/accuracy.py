"""The accuracy benchmark: the memory model against real vLLM start-ups.

Each entry is one observed start-up (tests/data/accuracy.jsonl's format: the settings and
the figures vLLM printed). It names a catalog model (optionally `model:stage`), or carries
a `config` object (an HF config.json); anything else is reported as skipped, with the
reason. For each modelled entry the model predicts what vLLM would print and the error is
measured; the summary counts optimistic predictions (more KV than vLLM gave), the one
error a planner must not make.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from ..inputs.catalog import lookup_model, pipeline_from_config
from ..inputs.gpus import lookup_gpu
from ..inputs.yamlio import parse_json
from ..vllm import facts as F
from ..vllm.facts import OMNI_VERSIONS, GiB, OmniVersion
from .stage_memory import StageKnobs, kv_tokens, stage_memory

FIGURES = ("model_loading_gib", "available_kv_gib", "kv_cache_tokens", "kv_bytes_per_token")
# The documented bound (docs/accuracy.md): available KV within max(1 GiB, 10%) of what vLLM printed.
KV_BOUND_GIB, KV_BOUND_FRACTION = 1.0, 0.10
WEIGHTS_BOUND_FRACTION = 0.03


@dataclass
class EntryResult:
    index: int
    source: str
    model: str
    status: str  # "modelled" or "skipped"
    reason: str = ""
    predicted: dict[str, float | None] = field(default_factory=dict)
    observed: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    bounded: bool = False  # a V1 entry with its whole configuration: the two-sided bound applies

    def outside_bound(self) -> bool:
        err = self.error("available_kv_gib")
        if err is None or not self.bounded:
            return False
        return abs(err) > max(KV_BOUND_GIB, KV_BOUND_FRACTION * abs(self.observed["available_kv_gib"]))

    def error(self, figure: str) -> float | None:
        p, o = self.predicted.get(figure), self.observed.get(figure)
        return None if p is None or o is None else p - o

    def optimistic(self) -> bool:
        """More KV predicted than vLLM allocated, beyond the bound."""
        err = self.error("available_kv_gib")
        if err is None:
            return False
        return err > max(KV_BOUND_GIB, KV_BOUND_FRACTION * abs(self.observed["available_kv_gib"]))

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "source": self.source, "model": self.model, "status": self.status}
        if self.reason:
            out["reason"] = self.reason
        if self.status == "modelled":
            out["predicted"] = self.predicted
            out["observed"] = self.observed
            out["error"] = {f: (None if self.error(f) is None else round(self.error(f), 4)) for f in FIGURES}
            out["optimistic"] = self.optimistic()
            out["bounded"] = self.bounded
            out["notes"] = self.notes
        return out


class Skip(Exception):
    """An entry the model cannot predict; the message says why."""


def _number(value: Any) -> float | None:
    """A figure as the log printed it: 0.9, "default (0.9)", "12.13 (PP stage 0) / ..."."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    m = re.search(r"-?\d+(?:\.\d+)?", str(value).replace(",", ""))
    return float(m.group()) if m else None


def _vllm_version(entry: dict) -> tuple[int, int] | None:
    m = re.search(r"(\d+)\.(\d+)", str(entry.get("vllm_version") or ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


def _stage(entry: dict):
    """(stage spec, pipeline name, omni version or None) for an entry."""
    name = str(entry.get("model") or "")
    if isinstance(entry.get("config"), dict):
        pipeline = pipeline_from_config(entry["config"], name or "model", where=f"entry {name!r} config")
        return pipeline.stages[0], None
    if entry.get("checkpoint"):
        raise Skip("checkpoint paths are not read by the benchmark yet; give a `config`")
    key, _, stage_name = name.partition(":")
    try:
        pipeline = lookup_model(key)
    except InputError:
        raise Skip(f"{name!r} is neither a catalog model nor an entry with a `config`") from None
    version = OMNI_VERSIONS.get(str(entry.get("omni_version") or "0.30").lstrip("v")[:4])
    if version is None:
        raise Skip(f"unknown vLLM-Omni version {entry.get('omni_version')!r}")
    return pipeline.stage(stage_name or 0), version


def _gpu_total(entry: dict) -> int | None:
    total = _number(entry.get("gpu_total_gib"))
    if total is not None:
        return int(total * GiB)
    if entry.get("gpu"):
        try:
            return lookup_gpu(str(entry["gpu"]).split("(")[0].strip()).capacity_bytes
        except InputError:
            return None
    return None


def predict(index: int, entry: dict) -> EntryResult:
    """Model one entry; a Skip becomes a skipped result with its reason."""
    source = str(entry.get("source") or f"entry {index}")
    model = str(entry.get("model") or "?")
    try:
        return _predict(index, source, model, entry)
    except Skip as why:
        return EntryResult(index, source, model, "skipped", reason=str(why))
    except InputError as exc:
        return EntryResult(index, source, model, "skipped", reason=str(exc))


# Settings an entry may state, and the range vLLM itself accepts for each (beyond it vLLM
# refuses to start, so no start-up log can carry the value).
SETTING_RANGES = {
    "tensor_parallel_size": (1, 1024),
    "pipeline_parallel_size": (1, 1024),
    "max_model_len": (1, 2 ** 31 - 1),
    "max_num_seqs": (1, 2 ** 31 - 1),
    "max_num_batched_tokens": (1, 2 ** 31 - 1),
    "gpu_memory_utilization": (1e-9, 1.0),
    "gpu_total_gib": (1e-9, 4096.0),
}


def _check_settings(entry: dict) -> None:
    for key, (low, high) in SETTING_RANGES.items():
        if entry.get(key) is None:
            continue
        value = _number(entry[key])  # None: "default" and the like, a value not stated
        if value is not None and not low <= value <= high:
            allowed = f"{low} to {high}" if isinstance(low, int) else f"above 0, at most {high:g}"
            raise Skip(f"{key} {entry[key]!r} is not a setting vLLM starts with ({allowed})")


def _predict(index: int, source: str, model: str, entry: dict) -> EntryResult:
    _check_settings(entry)
    pp = _number(entry.get("pipeline_parallel_size"))
    if pp is not None and pp > 1:
        raise Skip("pipeline parallelism is not modelled")
    spec, omni = _stage(entry)
    tp = int(_number(entry.get("tensor_parallel_size")) or 1)
    vllm = _vllm_version(entry) or (omni.vllm if omni else None)
    engine = str(entry.get("engine") or "")
    notes: list[str] = []
    version = omni or _plain_version(vllm)
    if version is None:
        notes.append("vLLM version not stated: read as 0.30")
        version = _plain_version((0, 30))
    mml = int(_number(entry.get("max_model_len")) or spec.transformer.max_position)
    total = _gpu_total(entry)
    kv_dtype = "fp8" if str(entry.get("kv_cache_dtype") or "auto").startswith("fp8") else "auto"
    if omni is not None:  # a catalog stage: the bundled defaults of that version's files, unless the log says
        d = spec.defaults[omni.schema]
        seqs = int(_number(entry.get("max_num_seqs")) or d.max_num_seqs)
        tokens = int(_number(entry.get("max_num_batched_tokens")) or d.max_num_batched_tokens)
    else:
        seqs, tokens = _batch(entry, engine, version, total, mml, spec)
    knobs = StageKnobs(mml, seqs, tokens, bool(entry.get("enforce_eager")), kv_dtype,
                       async_chunk=omni is not None)
    memory = stage_memory(spec, tp, knobs, version)
    bpt = memory.kv_bytes_per_token  # with sliding-window layers, the effective figure of a max_model_len request
    predicted: dict[str, float | None] = {"model_loading_gib": round(memory.weights_bytes / GiB, 4),
                                          "kv_bytes_per_token": bpt}
    util = _number(entry.get("gpu_memory_utilization"))
    if total is None or util is None:
        notes.append("available KV not modelled: " + ("the GPU's total" if total is None else "gpu_memory_utilization")
                     + " is not in the log")
        predicted.update(available_kv_gib=None, kv_cache_tokens=None)
    else:
        requested = -(-int(total * util * 1_000_000) // 1_000_000)
        available = requested - memory.inside_bytes
        predicted["available_kv_gib"] = round(available / GiB, 4)
        predicted["kv_cache_tokens"] = kv_tokens(available, bpt)
    observed = {"model_loading_gib": _number(entry.get("model_loading_gib")),
                "available_kv_gib": _number(entry.get("available_kv_gib")),
                "kv_cache_tokens": _number(entry.get("kv_cache_tokens")),
                "kv_bytes_per_token": _observed_bpt(entry, bpt)}
    if isinstance(entry.get("available_kv_gib"), str):
        notes.append(f"available KV as logged: {entry['available_kv_gib']!r} (the first figure is compared)")
    bounded = (not engine.upper().startswith("V0") and predicted.get("available_kv_gib") is not None
               and observed["available_kv_gib"] is not None and not entry.get("bound_exempt"))
    if entry.get("bound_exempt"):
        notes.append(f"outside the accuracy bound: {entry['bound_exempt']}")
    return EntryResult(index, source, model, "modelled", predicted=predicted, observed=observed, notes=notes,
                       bounded=bounded)


def _plain_version(vllm: tuple[int, int] | None) -> OmniVersion | None:
    """Plain vLLM (no vLLM-Omni worker): its own formula, read as the "profile" accounting."""
    if vllm is None:
        return None
    return OmniVersion(name=f"{vllm[0]}.{vllm[1]}", vllm=vllm, schema="deploy", talker_builds_encoders=False,
                       caps_to_free_memory=False, has_admission_check=False)


def _batch(entry: dict, engine: str, version: OmniVersion, total: int | None, mml: int, spec) -> tuple[int, int]:
    """max_num_seqs and max_num_batched_tokens as that vLLM resolves them."""
    seqs, tokens = _number(entry.get("max_num_seqs")), _number(entry.get("max_num_batched_tokens"))
    seqs = int(seqs) if seqs is not None else None
    tokens = int(tokens) if tokens is not None else None
    if engine.upper().startswith("V0"):
        # V0 profiles one max-length batch of 256 sequences, unless it turned chunked prefill
        # on by itself above 32K of context (vllm 0.6 EngineArgs: use_long_context), with a
        # small token budget: 2048 here, the larger of the budgets it used (errs high).
        return seqs or 256, tokens or (max(mml, 2048) if mml <= 32768 else 2048)
    if total is None:
        return seqs or 256, tokens or 8192
    gpu = str(entry.get("gpu") or "")
    return F.default_batch(version.vllm, gpu, total, mml, True, seqs, tokens)


def _observed_bpt(entry: dict, predicted_bpt: int) -> float | None:
    """KV bytes per token the log implies: its available KV over its tokens. Both are
    rounded (2 decimals, whole blocks), so the predicted figure counts as exact when it
    lies in the interval they allow; then that figure is reported."""
    avail, tokens = _number(entry.get("available_kv_gib")), _number(entry.get("kv_cache_tokens"))
    if avail is None or not tokens:
        return None
    low = (avail - 0.005) * GiB / (tokens + F.BLOCK_SIZE_TOKENS)
    high = (avail + 0.005) * GiB / tokens
    if low <= predicted_bpt <= high:
        return float(predicted_bpt)
    return round(avail * GiB / tokens, 1)


def run(entries: list[dict]) -> tuple[list[EntryResult], dict[str, Any]]:
    results = [predict(i, e) for i, e in enumerate(entries)]
    return results, summary(results)


def summary(results: list[EntryResult]) -> dict[str, Any]:
    modelled = [r for r in results if r.status == "modelled"]
    out: dict[str, Any] = {"entries": len(results), "modelled": len(modelled),
                           "skipped": len(results) - len(modelled)}
    for figure in FIGURES:
        errors = [abs(r.error(figure)) for r in modelled if r.error(figure) is not None]
        relative = [abs(r.error(figure)) / abs(r.observed[figure]) for r in modelled
                    if r.error(figure) is not None and r.observed[figure]]
        out[figure] = {"count": len(errors),
                       "median_abs_error": round(statistics.median(errors), 4) if errors else None,
                       "max_abs_error": round(max(errors), 4) if errors else None,
                       "max_relative_error": round(max(relative), 4) if relative else None}
    out["optimistic"] = sum(r.optimistic() for r in modelled)
    out["bounded"] = sum(r.bounded for r in modelled)
    out["outside_bound"] = sum(r.outside_bound() for r in modelled)
    out["most_optimistic_kv_gib"] = max([r.error("available_kv_gib") for r in modelled
                                         if r.error("available_kv_gib") is not None] or [None], key=lambda x: x or 0)
    return out


def read_entries(text: str, where: str) -> list[dict]:
    """JSON lines; a line that is not a JSON object is an input error naming the line."""
    entries = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        value = parse_json(line, f"{where}: line {n}")
        if not isinstance(value, dict):
            raise InputError(f"{where}: line {n}: expected a JSON object")
        entries.append(value)
    return entries

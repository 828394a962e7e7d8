"""The accuracy benchmark: the memory model against real vLLM start-ups.

Each entry is one observed start-up, one JSON object a line (the shipped set,
omni_autoconf/data/accuracy.jsonl, is the format's reference): the settings and the figures
vLLM printed (`model_loading_gib`, `available_kv_gib`, `kv_cache_tokens`), with `source`
and `quote`. It names a catalog model (optionally `model:stage`), or carries a `config`
object (an HF config.json), or names a Hub id whose config the shipped set holds
(`config_ref`, or `model` itself); anything else is reported as skipped, with the reason.
`held_out: true` marks a start-up the memory model was not tuned on; the summary reports
those apart. For each modelled entry the model predicts what vLLM would print and the
error is measured; the summary counts optimistic predictions (more KV than vLLM gave,
lighter weights), the one error a planner must not make.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import InputError
from ..inputs.catalog import lookup_model, pipeline_from_config
from ..inputs.gpus import lookup_gpu
from ..inputs.logparse import CUDAGRAPH_APPLIED, CUDAGRAPH_UTIL, parse_settings
from ..vllm import facts as F
from ..vllm.facts import OMNI_VERSIONS, GiB, OmniVersion
from .accuracy_entries import (  # noqa: F401  (re-exported: the set's vocabulary)
    FIGURES, NEWEST_PLANNED_VLLM, EntryResult, Skip, _number, read_entries, shipped_configs, shipped_text, summary,
)
from .hybrid_kv import SlidingLayout, cdiv, group_size
from .stage_memory import StageKnobs, kv_tokens, stage_memory


def _vllm_version(entry: dict) -> tuple[int, int] | None:
    m = re.search(r"(\d+)\.(\d+)", str(entry.get("vllm_version") or ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


# The newest vLLM with a V0 engine: 0.10.1.1's vllm/engine/llm_engine.py is the V0 LLMEngine ("Initializing
# a V0 LLM engine (v%s)"), 0.11.0's an alias of vllm.v1.engine.llm_engine.LLMEngine.
LAST_V0 = (0, 10)


def _v0_version(entry: dict, notes: list[str]) -> tuple[int, int]:
    """A V0 entry that states no version: the one its quoted engine line prints ("Initializing an LLM
    engine (v0.6.4.post1)"), else the newest vLLM that had a V0 engine (LAST_V0): every version-dependent
    term then takes its pre-V1 form (the sort-path sampler: facts.TRITON_TOPK_FROM is 0.18)."""
    m = re.search(r"LLM engine \(v(\d+)\.(\d+)", str(entry.get("quote") or ""))
    if m:
        notes.append(f"vLLM version from the quoted engine line: {m.group(1)}.{m.group(2)}")
        return int(m.group(1)), int(m.group(2))
    notes.append(f"V0 engine, version not stated: read as {LAST_V0[0]}.{LAST_V0[1]}, the newest vLLM with V0")
    return LAST_V0


def _stage(entry: dict):
    """(stage spec, pipeline name, omni version or None) for an entry."""
    name = str(entry.get("model") or "")
    config = entry.get("config")
    if config is None and entry.get("config_ref"):  # a config the shipped set holds, by Hub id
        config = shipped_configs().get(str(entry["config_ref"]))
        if config is None:
            raise Skip(f"config_ref {entry['config_ref']!r} is not among the shipped configs")
    if isinstance(config, dict):
        config = _with_mxfp4_backends(config, entry)
        pipeline = pipeline_from_config(config, name or "model", where=f"entry {name!r} config")
        return pipeline.stages[0], None
    if entry.get("checkpoint"):
        raise Skip("checkpoint paths are not read by the benchmark yet; give a `config`")
    key, _, stage_name = name.partition(":")
    try:
        pipeline = lookup_model(key)
    except InputError:
        if name in shipped_configs():  # a Hub id with no `config` of its own: the shipped one
            return _stage({**entry, "config_ref": name})
        raise Skip(f"{name!r} is neither a catalog model nor an entry with a `config`") from None
    version = OMNI_VERSIONS.get(str(entry.get("omni_version") or "0.30").lstrip("v")[:4])
    if version is None:
        raise Skip(f"unknown vLLM-Omni version {entry.get('omni_version')!r}")
    return pipeline.stage(stage_name or 0), version


# vllm 0.11.0 model_executor/layers/quantization/mxfp4.py get_mxfp4_backend, on CUDA: compute capability
# below 9 -> MARLIN; 9.0 -> FlashInfer only when VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1 (envs.py default 0),
# else TRITON when the optional `triton_kernels` package imports and torch >= 2.8.0, MARLIN otherwise (the
# log does not say which, so both count and the larger padding is taken). 0.10.1.1 (Mxfp4MoEMethod.
# _should_use_marlin) and 0.14.1 choose among the same kernels with the same padding on these GPUs; other
# versions and GPUs keep quantization.py's unknown-backend padding (errs high).
MXFP4_BACKENDS_READ = ((0, 10), (0, 11), (0, 14))  # the wheels read (0.10.1.1, 0.11.0, 0.14.1)
_SM90 = ("H100", "H200", "H800", "H20", "GH200")
_SM8X = ("A100", "A800", "A10", "A30", "A40", "A6000", "L4", "L40", "L20", "RTX 30", "RTX 40", "RTX A")


def _mxfp4_backends(entry: dict) -> list[str] | None:
    vllm = _vllm_version(entry)
    gpu = str(entry.get("gpu") or "").upper()
    if vllm not in MXFP4_BACKENDS_READ or not gpu:
        return None
    if any(name.upper() in gpu for name in _SM90):
        return ["marlin", "triton"]
    if any(name.upper() in gpu for name in _SM8X):
        return ["marlin"]
    return None


def _with_mxfp4_backends(config: dict, entry: dict) -> dict:
    """An mxfp4 config with the backends that entry's vLLM picks on its GPU (quantization.py pads to them)."""
    from ..inputs.quantization import MXFP4_BACKEND_KEY

    q = config.get("quantization_config")
    backends = _mxfp4_backends(entry)
    if not isinstance(q, dict) or q.get("quant_method") != "mxfp4" or backends is None:
        return config
    tp = int(_number(entry.get("tensor_parallel_size")) or 1)
    return {**config, "quantization_config": {**q, MXFP4_BACKEND_KEY: {"backends": backends, "tp": tp}}}


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
    held_out = bool(entry.get("held_out"))
    try:
        return _predict(index, source, model, entry)
    except Skip as why:
        return EntryResult(index, source, model, "skipped", reason=str(why), held_out=held_out)
    except InputError as exc:
        return EntryResult(index, source, model, "skipped", reason=str(exc), held_out=held_out)


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
    logged, _ = parse_settings(str(entry.get("quote") or ""))  # the quoted lines, read as `bench entry` reads them
    pp = _number(entry.get("pipeline_parallel_size"))
    if pp is not None and pp > 1:
        raise Skip("pipeline parallelism is not modelled")
    spec, omni = _stage(entry)
    tp = int(_number(entry.get("tensor_parallel_size")) or 1)
    vllm = _vllm_version(entry) or (omni.vllm if omni else None)
    engine = str(entry.get("engine") or "")
    notes: list[str] = []
    if vllm is None and engine.upper().startswith("V0"):
        vllm = _v0_version(entry, notes)
    version = omni or _plain_version(vllm)
    if version is None:
        notes.append("vLLM version not stated: read as 0.30")
        version = _plain_version((0, 30))
    mml = int(_number(entry.get("max_model_len")) or spec.transformer.max_position)
    total = _gpu_total(entry)
    kv_dtype = "fp8" if str(entry.get("kv_cache_dtype") or "auto").startswith("fp8") else "auto"
    if omni is not None:  # a catalog stage: the bundled defaults of that version's files, unless the log says
        if omni.schema not in spec.defaults:
            raise Skip(f"{model.partition(':')[0]}'s catalog entry has no {omni.schema} defaults: vLLM-Omni "
                       f"{omni.name} is not among the versions it models")
        d = spec.defaults[omni.schema]
        seqs = int(_number(entry.get("max_num_seqs")) or d.max_num_seqs)
        tokens = int(_number(entry.get("max_num_batched_tokens")) or d.max_num_batched_tokens)
    else:
        seqs, tokens = _batch(entry, engine, version, total, mml, spec, notes)
    flashinfer = _flashinfer_sampler(entry, logged)
    if flashinfer is None and omni is None and vllm is not None and vllm <= F.FLASHINFER_SAMPLER_IF_INSTALLED_UNTIL \
            and not engine.upper().startswith("V0"):
        notes.append("sampler not stated: this vLLM samples with FlashInfer where it is installed; the sort path "
                     "is counted (errs high)")
    knobs = StageKnobs(mml, seqs, tokens, bool(entry.get("enforce_eager")), kv_dtype,
                       async_chunk=omni is not None, flashinfer_sampler=flashinfer,
                       dtype=_setting_text(entry, "dtype"),
                       # a quantized checkpoint started, so the setting was its own method (or its Marlin
                       # kernel): only a run-time quantization of an unquantized one changes the weights
                       quantization=None if spec.quantization else _setting_text(entry, "quantization"))
    memory = stage_memory(spec, tp, knobs, version)
    bpt = memory.kv_bytes_per_token  # with sliding-window layers, the effective figure of a max_model_len request
    printed = printed_pool_bytes_per_token(memory.kv_layout, version.vllm)
    if printed is not None:
        notes.append(f"hybrid sliding-window pool: vLLM {version.vllm[0]}.{version.vllm[1]} prints pool tokens "
                     f"(blocks // KV cache groups x 16), {printed} bytes each; a max_model_len request costs "
                     f"{bpt} per token")
        bpt = printed
    predicted: dict[str, float | None] = {"model_loading_gib": round(memory.weights_bytes / GiB, 4),
                                          "kv_bytes_per_token": bpt}
    util = _number(entry.get("gpu_memory_utilization"))
    graphs = _cudagraph_estimate(entry, omni, vllm, total, logged, notes)
    if total is None or util is None or graphs is None:
        if graphs is not None:
            notes.append("available KV not modelled: " + ("the GPU's total" if total is None
                                                          else "gpu_memory_utilization") + " is not in the log")
        predicted.update(available_kv_gib=None, kv_cache_tokens=None)
    else:
        requested = -(-int(total * util * 1_000_000) // 1_000_000)
        available = requested - memory.inside_bytes - graphs
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
    # plans are made for vLLM-Omni's V1 workers, never for a V0 engine
    planned_vllm = (vllm is None or vllm <= NEWEST_PLANNED_VLLM) and not engine.upper().startswith("V0")
    if not planned_vllm and vllm is not None and vllm > NEWEST_PLANNED_VLLM:
        notes.append(f"vLLM {vllm[0]}.{vllm[1]} is newer than any vLLM-Omni version plans are made for "
                     f"(their newest vLLM is {NEWEST_PLANNED_VLLM[0]}.{NEWEST_PLANNED_VLLM[1]})")
    return EntryResult(index, source, model, "modelled", predicted=predicted, observed=observed, notes=notes,
                       bounded=bounded, held_out=bool(entry.get("held_out")), planned_vllm=planned_vllm)


def printed_pool_bytes_per_token(layout, vllm: tuple[int, int]) -> int | None:
    """The bytes per printed token of a hybrid sliding-window pool in the vLLM versions that print
    pool tokens (POOL_TOKENS_PRINTED_UNTIL), else None. There (vllm 0.13.0 v1/core/kv_cache_utils.py
    get_kv_cache_config_from_groups, get_num_blocks, _report_kv_cache_config) the pool has
    num_blocks = available // page_size // G (G layers per group, page_size one layer's 16 tokens), and
    the log prints num_blocks // n_groups x 16 with n_groups = cdiv(full, G) + cdiv(sliding, G), padding
    layers included; floor(floor(a / b) / c) = floor(a / (b c)), so the printed tokens are
    kv_tokens(available, n_groups x G x layer bytes), exactly, the null block included in num_blocks."""
    if not isinstance(layout, SlidingLayout) or vllm > F.POOL_TOKENS_PRINTED_UNTIL:
        return None
    full = layout.num_layers - layout.sliding_layers
    g = group_size(full, layout.sliding_layers, vllm)
    return (cdiv(full, g) + cdiv(layout.sliding_layers, g)) * g * layout.layer_token_bytes


def _plain_version(vllm: tuple[int, int] | None) -> OmniVersion | None:
    """Plain vLLM (no vLLM-Omni worker): its own formula, read as the "profile" accounting."""
    if vllm is None:
        return None
    return OmniVersion(name=f"{vllm[0]}.{vllm[1]}", vllm=vllm, schema="deploy", talker_builds_encoders=False,
                       caps_to_free_memory=False, has_admission_check=False, omni_worker=False)

def _cudagraph_estimate(entry: dict, omni, vllm: tuple[int, int] | None, total: int | None, logged: dict,
                        notes: list[str]) -> int | None:
    """Bytes of CUDA-graph estimate vLLM subtracted from the KV budget: 0 where it subtracts none
    (vLLM-Omni's workers, plain vLLM before facts.CUDAGRAPH_ESTIMATE_IN_KV_FROM, eager mode); from
    0.21 the figure its log prints ("Estimated CUDA graph memory: X GiB total", the entry's
    `cudagraph_estimate_gib`, or `logged`: what its quoted lines state), else None: the memory model
    does not derive that estimate, so the available KV of such a start-up is not predicted."""

    quote = str(entry.get("quote") or "")
    applied = CUDAGRAPH_APPLIED.search(quote)  # the log says it is subtracted (an opt-in before 0.21)
    version = vllm or (0, 30)  # an unstated version is read as 0.30 (see _predict)
    if omni is not None or entry.get("enforce_eager") is True or (version < F.CUDAGRAPH_ESTIMATE_IN_KV_FROM
                                                                   and not applied):
        return 0
    raw = entry.get("cudagraph_estimate_gib")
    stated = None if isinstance(raw, bool) else _number(raw)
    if raw is not None and (stated is None or stated < 0):
        raise Skip(f"cudagraph_estimate_gib {raw!r} is not a size in GiB")
    found, util = logged.get("cudagraph_estimate_gib"), CUDAGRAPH_UTIL.search(quote)
    if stated is None and found is not None:
        stated = found
    elif stated is None and util and total:  # "--gpu-memory-utilization=A is equivalent to ...=B": (A - B) x total
        stated = (float(util.group(1)) - float(util.group(2))) * total / GiB
        if stated < 0:
            raise Skip("the quoted utilization line gives a negative CUDA-graph estimate")
    if stated is None:
        notes.append(f"available KV not modelled: vLLM {version[0]}.{version[1]} subtracts its CUDA-graph estimate, "
                     "which the log does not print")
        return None
    notes.append(f"vLLM's CUDA-graph estimate as logged: {stated:g} GiB, subtracted from the KV budget")
    return int(stated * GiB)


def _setting_text(entry: dict, key: str) -> str | None:
    """A string setting as vLLM reads it (`dtype`, `quantization`); None where the entry leaves it to
    the checkpoint ("auto", "default", absent)."""
    value = entry.get(key)
    if value is None or str(value).lower() in ("auto", "default", "none", ""):
        return None
    words = str(value).lower().replace("torch.", "").split()  # "fp8 (checkpoint)": the method
    return words[0] if words else None


def _flashinfer_sampler(entry: dict, logged: dict) -> bool | None:
    """Whether vLLM sampled with FlashInfer: the entry's `sampler` ("flashinfer" or "pytorch"), else
    what its quoted lines say (`logged`, logparse.SAMPLER_LINES); None when neither says."""
    for stated in (entry.get("sampler"), logged.get("sampler")):
        if str(stated or "").lower() in ("flashinfer", "pytorch"):
            return str(stated).lower() == "flashinfer"
    return None


def _usage_context(entry: dict) -> str | None:
    """"api_server" (`vllm serve`) or "llm" (the offline LLM class): the entry's `usage_context`, else
    what its quote or notes say it ran; None when neither says."""
    stated = str(entry.get("usage_context") or "").lower()
    if stated in ("api_server", "openai_api_server", "llm", "llm_class"):
        return "llm" if stated.startswith("llm") else "api_server"
    text = f"{entry.get('quote') or ''} {entry.get('notes') or ''}"
    serve = re.search(r"vllm serve|api_server|openai api server|vllm-openai", text, re.I)
    offline = re.search(r"\bLLM\(|offline LLM", text)
    if bool(serve) != bool(offline):
        return "api_server" if serve else "llm"
    return None


def _batch(entry: dict, engine: str, version: OmniVersion, total: int | None, mml: int, spec,
           notes: list[str] | None = None) -> tuple[int, int]:
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
    if seqs is not None and tokens is not None:
        return seqs, tokens
    usage = _usage_context(entry)
    default_tokens, default_seqs = F.vllm_batch_defaults(version.vllm, str(entry.get("gpu") or ""), total, usage)
    if notes is not None:
        notes.append(f"vLLM's {'LLM class' if usage in (None, 'llm') else 'API server'} batch defaults "
                     f"{default_tokens}/{default_seqs}" + (" (usage context not stated: the larger)" if usage is None
                                                            else ""))
    # then as the scheduler resolves them, chunked prefill on (V1)
    return F.default_batch(version.vllm, str(entry.get("gpu") or ""), total, mml, True, seqs, tokens, usage or "llm")


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

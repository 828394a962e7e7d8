"""Bytes per weight of a quantized checkpoint described by config.json alone, as vLLM loads it.

(A checkpoint's safetensors headers give the stored bytes exactly; this is the config-only path.)
`quant_bytes` turns `quantization_config` into bytes per parameter of the layers vLLM quantizes
(the decoder's linear layers and experts; embeddings, lm_head, norms and routers stay in the model
dtype). An unknown `quant_method`, format or bit width is an InputError naming it (exit 2): a
quantized checkpoint is never read as bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from ..vllm.facts import VLLM_DTYPES
from ..vllm.quantization import (
    MXFP4_PADDING,
    MXFP4_PADDING_UNKNOWN,
    QUANT_SCALE_BYTES_PER_WEIGHT,
)

# torch_dtype names a config may give: the names vLLM reads as a dtype (vllm.facts.VLLM_DTYPES)
DTYPES = {name: torch for name, torch in VLLM_DTYPES.items() if torch is not None}

@dataclass(frozen=True)
class QuantBytes:
    """Bytes per parameter of the quantized layers (None: that part stays in the model dtype)."""

    linear: float | None  # attention and dense MLP projections
    experts: float | None  # routed experts
    method: str
    pad_hidden_to: int = 1  # vLLM pads the expert weights' hidden size to a multiple of this
    pad_intermediate_to: int = 1  # and each TP rank's share of the intermediate size to a multiple of this
    tp: int = 1  # the TP degree the intermediate padding is taken at (per rank)


# `quantization_config[MXFP4_BACKEND_KEY]`: {"backends": [names vLLM may pick], "tp": n}, set by a caller
# that knows the GPU and vLLM version (memory/accuracy.py); the largest padding of those backends counts.
MXFP4_BACKEND_KEY = "_vllm_mxfp4_backends"


def _mxfp4_padding(q: dict, where: str) -> tuple[int, int, int]:
    hint = q.get(MXFP4_BACKEND_KEY)
    if not isinstance(hint, dict):
        return (*MXFP4_PADDING_UNKNOWN, 1)
    names = hint.get("backends") or []
    unknown = [n for n in names if n not in MXFP4_PADDING]
    if unknown or not names:
        raise InputError(f"{where}: mxfp4 backend(s) {unknown or names!r} not known (known: {sorted(MXFP4_PADDING)})")
    tp = hint.get("tp", 1)
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise InputError(f"{where}: mxfp4 backend tp {tp!r} is not a TP degree")
    return (max(MXFP4_PADDING[n][0] for n in names), max(MXFP4_PADDING[n][1] for n in names), tp)


def _group_bytes(bits: int, group: int, scale_bytes: float, zero_point: bool) -> float:
    """bits / 8 per weight, one scale per group (and a packed zero point of `bits` per group)."""
    per_group = scale_bytes + (bits / 8 if zero_point else 0)
    return bits / 8 + per_group / group


def _int(q: dict, key: str, where: str, allowed: tuple) -> int:
    value = q.get(key)
    if value not in allowed or isinstance(value, bool):
        raise InputError(f"{where}: quantization_config {key} {value!r} is not one of {list(allowed)}")
    return value


def _compressed_tensors(q: dict, where: str) -> float:
    """vllm 0.30.0 model_executor/layers/quantization/compressed_tensors/compressed_tensors.py: each
    config group's `weights` args (num_bits, type, strategy, group_size, symmetric); the widest group
    counts for every layer (errs high where groups differ)."""
    fmt = q.get("format")
    if fmt not in ("pack-quantized", "int-quantized", "float-quantized", "naive-quantized"):
        raise InputError(f"{where}: compressed-tensors format {fmt!r} is not modelled (known: pack-quantized, "
                         "int-quantized, float-quantized, naive-quantized)")
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise InputError(f"{where}: compressed-tensors quantization_config without config_groups")
    widest = 0.0
    for name, group in groups.items():
        w = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(w, dict):
            raise InputError(f"{where}: compressed-tensors group {name!r} has no weights arguments")
        kind = w.get("type")
        bits = _int(w, "num_bits", f"{where} group {name}", (4, 8) if kind == "int" else (8,))
        if kind not in ("int", "float"):
            raise InputError(f"{where}: compressed-tensors weight type {kind!r} is not modelled (int, float)")
        strategy = w.get("strategy")
        if strategy == "group":
            size = _int(w, "group_size", f"{where} group {name}", tuple(2 ** k for k in range(4, 12)))
            # weight_scale in the model dtype per group; weight_zero_point packed when asymmetric
            widest = max(widest, _group_bytes(bits, size, 2, not w.get("symmetric", True)))
        elif strategy == "block":
            block = w.get("block_structure") or [128, 128]
            widest = max(widest, bits / 8 + 4 / (block[0] * block[1]))
        elif strategy in ("tensor", "channel"):
            widest = max(widest, bits / 8 + QUANT_SCALE_BYTES_PER_WEIGHT)
        else:
            raise InputError(f"{where}: compressed-tensors strategy {strategy!r} is not modelled")
    return widest


def quant_bytes(cfg: dict, where: str, override: str | None = None) -> QuantBytes | None:
    """How a config's quantization_config (or the run-time `--quantization`) stores the weights.

    `override`: vLLM's `quantization` setting; "fp8" on an unquantized checkpoint quantizes its
    linear layers to fp8 at load (vllm 0.30.0 quantization/fp8.py Fp8LinearMethod, per-tensor
    scales), other values must match the checkpoint's method."""
    q = cfg.get("quantization_config")
    if q is not None and not isinstance(q, dict):
        raise InputError(f"{where}: quantization_config must be an object, not {q!r}")
    if not q:
        if override in (None, "none"):
            return None
        if override == "fp8":
            return QuantBytes(1 + QUANT_SCALE_BYTES_PER_WEIGHT, 1 + QUANT_SCALE_BYTES_PER_WEIGHT, "fp8")
        raise InputError(f"{where}: --quantization {override!r} on a checkpoint without quantization_config is not "
                         "modelled (only fp8 quantizes at load)")
    method = q.get("quant_method")
    if override not in (None, "none", method) and not (override.endswith("_marlin") or override == "marlin"):
        raise InputError(f"{where}: --quantization {override!r} does not match the checkpoint's {method!r}")
    if method == "fp8":  # quantization/fp8.py: fp8 weights, fp32 scale_inv per weight_block_size block
        block = q.get("weight_block_size")
        extra = 4 / (block[0] * block[1]) if isinstance(block, list) and len(block) == 2 else QUANT_SCALE_BYTES_PER_WEIGHT
        return QuantBytes(1 + extra, 1 + extra, "fp8")
    if method in ("gptq", "awq"):  # quantization/gptq.py, awq.py: packed int32 qweight, fp16 scales, packed zeros
        bits = _int(q, "bits" if method == "gptq" else "w_bit" if "w_bit" in q else "bits", where, (2, 3, 4, 8))
        group = q.get("group_size", q.get("q_group_size", 128))
        if group == -1:
            group = 1024  # one scale per column: at most the bytes of a group of 1024 (every layer is wider)
        if not isinstance(group, int) or isinstance(group, bool) or group <= 0:
            raise InputError(f"{where}: quantization_config group_size {group!r} is not modelled")
        per = _group_bytes(bits, group, 2, True) + (4 / 1024 if q.get("desc_act") else 0)  # g_idx int32 per row
        return QuantBytes(per, per, method)
    if method == "compressed-tensors":
        per = _compressed_tensors(q, where)
        return QuantBytes(per, per, method)
    if method == "mxfp4":  # gpt-oss: only the experts (quantization/mxfp4.py Mxfp4MoEMethod): 4 bits + e8m0 per 32
        hidden_pad, inter_pad, tp = _mxfp4_padding(q, where)  # MXFP4_PADDING: the backend's round-up
        return QuantBytes(None, 0.5 + 1 / 32, method, pad_hidden_to=hidden_pad, pad_intermediate_to=inter_pad, tp=tp)
    if method == "bitsandbytes":  # quantization/bitsandbytes.py
        if q.get("load_in_4bit"):  # 4-bit nf4/fp4, an fp32 absmax per 64 weights (double quant: less)
            return QuantBytes(0.5 + 4 / 64, 0.5 + 4 / 64, method)
        if q.get("load_in_8bit"):  # int8 with an fp32 scale per row
            return QuantBytes(1 + QUANT_SCALE_BYTES_PER_WEIGHT, 1 + QUANT_SCALE_BYTES_PER_WEIGHT, method)
        raise InputError(f"{where}: bitsandbytes quantization_config with neither load_in_4bit nor load_in_8bit")
    raise InputError(f"{where}: quantization method {method!r} is not modelled (known: fp8, gptq, awq, "
                     "compressed-tensors, mxfp4, bitsandbytes)")


def load_dtype(cfg: dict, where: str) -> str:
    """The dtype vLLM loads a config's weights in with `--dtype auto` (vllm 0.30.0 config/model.py
    _resolve_auto_dtype): the config's torch_dtype (transformers 5 writes `dtype`), float32 and a
    config without one (absent or null) taken down to bfloat16. A value that names no dtype
    ("float128", a list, a number) is refused."""
    key = "torch_dtype" if cfg.get("torch_dtype") is not None or "dtype" not in cfg else "dtype"
    if cfg.get(key) is None:  # absent or null: PretrainedConfig's None, which vLLM reads as float32 -> bfloat16
        return "bfloat16"
    value = cfg[key]
    name = value.replace("torch.", "") if isinstance(value, str) else None
    if name not in DTYPES:
        raise InputError(f"{where}: {key} {value!r} is not a dtype vLLM loads (bfloat16, float16, float32)")
    return "bfloat16" if DTYPES[name] == "float32" else DTYPES[name]


def linear_components(cfg: dict, where: str, linear: int, parts: dict, source: str) -> list[dict]:
    """The decoder's projections, and its routed experts apart where the quantization treats them apart,
    in the bytes the checkpoint's quantization_config stores (quantization.py), else the model dtype."""
    quant = quant_bytes(cfg, where)
    experts = parts.get("experts", 0)
    if quant is None:
        return [{"name": "linear", "params": max(1, linear), "sharding": "tp",
                 "source": f"{source}: attention and MLP weights from the geometry"}]
    out = []
    dense = linear - experts if experts else linear
    if dense:
        out.append({"name": "linear", "params": max(1, int(dense * quant.linear)) if quant.linear else dense,
                    "sharding": "tp", "dtype": "bytes" if quant.linear else None,
                    "source": f"{source}: attention and MLP weights, {quant.method} as quantization.py stores them"})
    if experts:
        count, hidden, width = parts["expert_dims"]
        ph, pi, tp = quant.pad_hidden_to, quant.pad_intermediate_to, quant.tp
        # each rank holds cdiv(width, tp) rounded up to pi (mxfp4.py create_weights pads the partition)
        padded_width = (-(-(-(-width // tp)) // pi) * pi) * tp
        padded = experts * (-(-hidden // ph) * ph) * padded_width // (hidden * width)
        stored = padded * quant.experts if quant.experts else None
        out.append({"name": "experts", "params": max(1, int(stored)) if stored else experts, "sharding": "tp",
                    "dtype": "bytes" if stored else None,
                    "source": f"{source}: {count} routed experts, {quant.method} as quantization.py stores them"})
    return out

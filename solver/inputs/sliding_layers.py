"""Which layers of a decoder config slide: the window and the sliding layer count as vLLM reads
a config.json (its config class's defaults where the file is silent). The KV such layers take
in vLLM's hybrid pool is memory/hybrid_kv.py's."""

from __future__ import annotations

from typing import Any

from ..errors import InputError

# Families whose HF config class derives layer_types when config.json has none, as
# (sliding_window default, layer i slides): transformers' configuration_gemma2.py,
# configuration_gemma3.py, configuration_cohere2.py, configuration_olmo3.py; gpt-oss slides
# the even layers whatever layer_types says (vllm 0.30.0 model_executor/models/gpt_oss.py:174).
_PATTERNED = {
    "gemma2": (4096, lambda i, cfg: (i + 1) % 2 != 0),
    "gpt_oss": (128, lambda i, cfg: i % 2 == 0),
    "gemma3": (4096, lambda i, cfg: (i + 1) % _pattern(cfg, 6) != 0),
    "gemma3_text": (4096, lambda i, cfg: (i + 1) % _pattern(cfg, 6) != 0),
    "cohere2": (4096, lambda i, cfg: (i + 1) % _pattern(cfg, 4) != 0),
    "olmo3": (4096, lambda i, cfg: (i + 1) % 4 != 0),
}
# Families with no layer_types in their config class: a window applies to every layer
# (vllm/engine/arg_utils.py sets cache_config.sliding_window when there are no layer_types).
_EVERY_LAYER = ("mistral", "mixtral", "phi3", "starcoder2")
# Config keys of layer layouts this module does not size (Gemma 4's wider full layers,
# Gemma 3n's shared KV layers).
UNMODELLED_KEYS = ("global_head_dim", "num_global_key_value_heads", "num_kv_shared_layers", "per_layer_config")
# Marks of a config with Mamba, linear-attention or convolution layers, whose per-sequence state
# vLLM keeps in the KV pool: a family hfconfig.py does not read (it reads NemotronH and
# Qwen3-Next/3.5 before this is asked) is refused by Jamba's period, Zamba's and Granite-H's
# block types, and the mamba_*/ssm_*/linear_* geometry keys of their families.
_STATE_KEYS = ("hybrid_override_pattern", "layers_block_type", "attn_layer_period", "full_attention_interval",
               "linear_attn_config", "conv_L_cache")
_STATE_PREFIXES = ("mamba", "ssm_", "linear_num", "linear_key", "linear_value")
_STATE_LAYER_WORDS = ("mamba", "linear", "conv", "ssm", "recurrent", "delta")


def _pattern(cfg: dict, default: int) -> int:
    value = cfg.get("sliding_window_pattern", default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"config.json: sliding_window_pattern must be a whole number >= 1, not {value!r}")
    return value


def sliding_layout(cfg: dict[str, Any], num_layers: int, where: str) -> tuple[int, int]:
    """(window, sliding layer count) of a decoder config as vLLM 0.30 reads it; (0, 0) when
    no layer slides. A family whose defaults are not known here, with a window and no
    layer_types, is refused: guessing either way can promise KV vLLM does not give."""
    kind = str(cfg.get("model_type", ""))
    state = [k for k in cfg if k in _STATE_KEYS or k.startswith(_STATE_PREFIXES)]
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list):
        state += sorted({str(t) for t in layer_types if any(w in str(t).lower() for w in _STATE_LAYER_WORDS)})
    if state or kind.startswith("mamba"):
        raise InputError(f"{where}: {', '.join(state[:3]) or kind}: Mamba or linear-attention layers, whose state vLLM "
                         "keeps in its KV pool, are not read from a config yet")
    unknown = [k for k in UNMODELLED_KEYS if cfg.get(k) is not None]
    if unknown:
        raise InputError(f"{where}: {', '.join(unknown)}: layers of unequal KV size are not modelled")
    if isinstance(layer_types, list) and layer_types:
        sliding = sum("sliding" in str(t).lower() for t in layer_types)
        if sliding and len(layer_types) != num_layers:
            raise InputError(f"{where}: layer_types names {len(layer_types)} layers, num_hidden_layers {num_layers}")
        if kind == "gpt_oss":
            sliding = -(-num_layers // 2)
        if kind.startswith(("qwen2", "qwen3")) and 0 < sliding < num_layers:  # vllm 0.30.0 qwen2.py:350 asserts
            raise InputError(f"{where}: layer_types mix sliding and full layers: vLLM refuses such a "
                             f"{kind} model at start-up (max_window_layers must equal num_hidden_layers)")
        window = cfg.get("sliding_window", _PATTERNED.get(kind, (None,))[0])
    elif kind.startswith(("qwen2", "qwen3")):
        if not cfg.get("use_sliding_window", False) or cfg.get("sliding_window") in (None, 0):
            return 0, 0  # transformers' Qwen2/Qwen3Config: use_sliding_window defaults to False
        first = cfg.get("max_window_layers", 28)  # its default
        if isinstance(first, bool) or not isinstance(first, int):
            raise InputError(f"{where}: max_window_layers must be a whole number, not {first!r}")
        sliding = max(0, num_layers - first)  # layers from max_window_layers on slide
        if 0 < sliding < num_layers:  # vllm 0.30.0 qwen2.py asserts against a mixed model
            raise InputError(f"{where}: sliding window on layers {first} and up only: vLLM refuses such a "
                             "model at start-up (max_window_layers must equal num_hidden_layers)")
        window = cfg["sliding_window"]
    elif kind in _PATTERNED:
        window = cfg.get("sliding_window", _PATTERNED[kind][0])
        if window in (None, 0):
            return 0, 0
        slides = _PATTERNED[kind][1]
        sliding = sum(1 for i in range(num_layers) if slides(i, cfg))
    else:
        window = cfg.get("sliding_window")
        if window in (None, 0, False) or cfg.get("use_sliding_window", True) is False:
            return 0, 0
        if kind not in _EVERY_LAYER:
            raise InputError(f"{where}: sliding_window {window!r} without layer_types: which layers of a "
                             f"{kind or 'this'} model slide is not known here (its config class decides)")
        sliding = num_layers
    if not sliding:
        return 0, 0
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= 2 ** 31 - 1:
        raise InputError(f"{where}: sliding_window must be a whole number of tokens, not {window!r}")
    return window, sliding

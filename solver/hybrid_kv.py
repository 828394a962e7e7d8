"""Sliding-window layers: which layers of a config slide, and the KV a request of
max_model_len takes when they share vLLM's hybrid pool with full-attention layers.

vLLM 0.26-0.30 (hybrid KV cache manager, on by default) puts full and sliding layers in
separate groups of `G` layers (G = the smaller layer count, or the larger one when the two
are within 1.5x; vllm 0.30.0 v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size)
that share one pool of blocks of G pages each (get_kv_cache_config_from_groups). A request
takes cdiv(L, block) blocks in each full group and cdiv(min(window - 1 + in-flight tokens,
L), block) + 1 in each sliding group (v1/kv_cache_interface.py SlidingWindowSpec
max_memory_usage_bytes). Block 0 is the null block, which the 0.30 start-up check keeps
back (kv_cache_utils.py get_kv_cache_configs). The planner works in bytes per token, so
these are folded into one effective figure for a request of max_model_len: never below
what vLLM takes (the null block is charged to every request, the floor of the block count
to none)."""

from __future__ import annotations

from typing import Any

from . import vllm_facts as F
from .errors import InputError


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def sliding_layout(cfg: dict[str, Any], num_layers: int, where: str) -> tuple[int, int]:
    """(window, sliding layer count) of a decoder config as vLLM 0.30 reads it; (0, 0) when
    no layer slides. Gemma 2 and gpt-oss slide every even layer, Gemma 3 all but every
    `sliding_window_pattern`-th (their HF configs' layer_types defaults; vllm 0.30.0
    gemma2.py, gemma3.py, gpt_oss.py:174); an explicit layer_types says it per layer; any
    other config with a window slides every layer (vllm/engine/arg_utils.py sets
    cache_config.sliding_window when there are no layer_types)."""
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        sliding = sum("sliding" in str(t).lower() for t in layer_types)
        if sliding and len(layer_types) != num_layers:
            raise InputError(f"{where}: layer_types names {len(layer_types)} layers, num_hidden_layers {num_layers}")
    elif window in (None, 0, False) or cfg.get("use_sliding_window", True) is False:
        return 0, 0
    else:
        kind = str(cfg.get("model_type", ""))
        if kind in ("gemma2", "gpt_oss"):
            sliding = _cdiv(num_layers, 2)
        elif kind.startswith("gemma3"):
            pattern = cfg.get("sliding_window_pattern", 6)
            if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
                raise InputError(f"{where}: sliding_window_pattern must be a whole number >= 1, not {pattern!r}")
            sliding = num_layers - num_layers // pattern
        elif isinstance(cfg.get("max_window_layers"), int) and "use_sliding_window" in cfg:
            sliding = max(0, num_layers - cfg["max_window_layers"])  # Qwen2: layers from max_window_layers on
            if 0 < sliding < num_layers:  # vllm 0.30.0 qwen2.py asserts against a mixed model
                raise InputError(f"{where}: sliding window on layers {cfg['max_window_layers']} and up only: vLLM "
                                 "refuses such a Qwen2 model at start-up (max_window_layers must equal num_hidden_layers)")
        else:
            sliding = num_layers
    if not sliding:
        return 0, 0
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= 2 ** 31 - 1:
        raise InputError(f"{where}: sliding_window must be a whole number of tokens, not {window!r}")
    return window, sliding


def hybrid_bytes_per_token(layer_token_bytes: int, num_layers: int, sliding_layers: int, window: int,
                           max_model_len: int, max_num_batched_tokens: int) -> int:
    """Effective KV bytes per token of a max_model_len request (per rank) for a model with
    `sliding_layers` of `num_layers` sliding over `window` tokens; `layer_token_bytes`: one
    layer's K and V of one token on one rank."""
    block = F.BLOCK_SIZE_TOKENS
    full = num_layers - sliding_layers
    if full == 0:  # one uniform sliding group
        group, full_groups, sliding_groups = sliding_layers, 0, 1
    else:
        low, high = sorted((full, sliding_layers))
        group = high if high < 1.5 * low else low
        full_groups, sliding_groups = _cdiv(full, group), _cdiv(sliding_layers, group)
    in_flight = F.SLIDING_WINDOW_IN_FLIGHT_BATCHES * max_num_batched_tokens
    sliding_blocks = _cdiv(min(window - 1 + in_flight, max_model_len), block) + 1
    per_request = full_groups * _cdiv(max_model_len, block) + sliding_groups * sliding_blocks
    block_bytes = group * layer_token_bytes * block
    return _cdiv(block_bytes * (per_request + 1), max_model_len)

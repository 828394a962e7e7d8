"""Sliding-window layers: the KV a request of
max_model_len takes when they share vLLM's hybrid pool with full-attention layers.

vLLM 0.26-0.30 (hybrid KV cache manager, on by default) puts full and sliding layers in
separate groups of `G` layers (G = the smaller layer count, or the larger one when the two
are within 1.5x, 1.25x before vLLM 0.18; vllm 0.30.0 v1/core/kv_cache_utils.py
_get_kv_cache_groups_uniform_page_size) that share one pool of blocks of G pages each
(get_kv_cache_config_from_groups). A request takes cdiv(L, block) blocks in each full group
and cdiv(min(window - 1 + in-flight tokens, L), block) + 1 in each sliding group
(v1/kv_cache_interface.py SlidingWindowSpec max_memory_usage_bytes). Block 0 is the null
block, which the 0.30 start-up check keeps back (kv_cache_utils.py get_kv_cache_configs).
The planner works in bytes per token, so these are folded into one effective figure for a
request of max_model_len: never below what vLLM takes (the null block is charged to every
request, the floor of the block count to none). With the hybrid manager off
(disable_hybrid_kv_cache_manager) every sliding layer of a mixed model is sized as full.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..vllm import facts as F


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def group_size(first: int, second: int, vllm: tuple[int, int]) -> int:
    """Layers per group when two kinds of layer (`first`, `second` of them) share one pool:
    the smaller count, or the larger when the two are within 1.5x (1.25x before vLLM 0.18;
    vllm 0.18.1 kv_cache_utils.py:1043, 0.16.0 :1036); one kind alone is one group."""
    if not first or not second:
        return first or second
    low, high = sorted((first, second))
    factor = 1.5 if vllm >= (0, 18) else 1.25
    return high if high < factor * low else low


@dataclass(frozen=True)
class SlidingLayout:
    """Full and sliding-window layers in vLLM's hybrid pool, per rank (see the module)."""

    layer_token_bytes: int  # one layer's K and V of one token on one rank
    num_layers: int
    sliding_layers: int
    window: int
    max_num_batched_tokens: int
    vllm: tuple[int, int] = (0, 30)

    def request_bytes(self, length: int) -> int:
        """Bytes of one request of `length` tokens, its null block included."""
        block = F.BLOCK_SIZE_TOKENS
        full = self.num_layers - self.sliding_layers
        group = group_size(full, self.sliding_layers, self.vllm)
        in_flight = F.SLIDING_WINDOW_IN_FLIGHT_BATCHES * self.max_num_batched_tokens
        sliding_blocks = cdiv(min(self.window - 1 + in_flight, length), block) + 1
        per_request = cdiv(full, group) * cdiv(length, block) + cdiv(self.sliding_layers, group) * sliding_blocks
        return group * self.layer_token_bytes * block * (per_request + 1)


def hybrid_bytes_per_token(layer_token_bytes: int, num_layers: int, sliding_layers: int, window: int,
                           max_model_len: int, max_num_batched_tokens: int, vllm: tuple[int, int] = (0, 30)) -> int:
    """Effective KV bytes per token of a max_model_len request (per rank) for a model with
    `sliding_layers` of `num_layers` sliding over `window` tokens; `layer_token_bytes`: one
    layer's K and V of one token on one rank."""
    layout = SlidingLayout(layer_token_bytes, num_layers, sliding_layers, window, max_num_batched_tokens, vllm)
    return effective_bytes_per_token(layout, max_model_len)


class PoolLayout(Protocol):
    """A KV layout whose requests cost more per token when shorter (sliding windows, Mamba state)."""

    def request_bytes(self, length: int) -> int: ...


def effective_bytes_per_token(layout: PoolLayout, length: int) -> int:
    """Bytes per token of a request of `length` tokens in `layout`, its null block included."""
    return cdiv(layout.request_bytes(length), length)


def longest_request(kv_bytes: int, layout: PoolLayout) -> int:
    """The longest request `kv_bytes` holds (vLLM's own estimate searches the same way:
    kv_cache_utils.py _estimate_max_model_len_from_groups)."""
    low, high = 0, 1 << 31
    while low < high:
        mid = (low + high + 1) // 2
        if layout.request_bytes(mid) <= kv_bytes:
            low = mid
        else:
            high = mid - 1
    return low

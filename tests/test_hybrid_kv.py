"""Sliding-window layers in vLLM's hybrid KV pool (solver/memory/hybrid_kv.py), against vLLM's
own arithmetic and one public start-up log."""

from __future__ import annotations

import pytest

from omni_autoconf.memory.hybrid_kv import hybrid_bytes_per_token
from omni_autoconf.vllm.facts import GiB


def _vllm_concurrency(available: int, layer: int, full: int, sliding: int, window: int, length: int, batch: int):
    """vLLM 0.30's figures written out independently: groups of G layers (the smaller count,
    or the larger within 1.5x), blocks of G pages from one pool, cdiv(L, 16) blocks per full
    group and cdiv(min(W - 1 + 2 x batch, L), 16) + 1 per sliding group
    (v1/core/kv_cache_utils.py, v1/kv_cache_interface.py)."""
    lo, hi = sorted((full, sliding))
    g = hi if hi < 1.5 * lo else lo
    groups_full, groups_sliding = -(-full // g), -(-sliding // g)
    blocks = available // (g * layer * 16)
    per_request = groups_full * -(-length // 16) + groups_sliding * (-(-min(window - 1 + 2 * batch, length) // 16) + 1)
    return blocks, per_request


@pytest.mark.parametrize("length, batch", [(131072, 8192), (32768, 8192), (8192, 8192), (4096, 2048), (2048, 512)])
def test_a_gemma3_27b_shaped_model_is_never_promised_more_than_vllm_gives(length, batch):
    """62 layers (10 full, 52 sliding over 1024), 16 KV heads of 128, bf16, 20 GiB of KV:
    16,384 blocks; at 131,072 tokens vLLM prints "Maximum concurrency ... 1.11x"."""
    layer = 2 * 16 * 128 * 2
    available = 20 * GiB
    bpt = hybrid_bytes_per_token(layer, 62, 52, 1024, length, batch)
    ours = available / (bpt * length)
    blocks, per_request = _vllm_concurrency(available, layer, 10, 52, 1024, length, batch)
    assert blocks == 16384
    vllm = blocks / per_request
    assert ours <= vllm and ours >= (blocks - 2) / (per_request + 1)  # one null block apart, never above
    if length == 131072:
        assert round(vllm, 2) == 1.11
    # at a short length the sliding groups take no fewer blocks than full ones, and the padded
    # groups more memory: counting every layer as full attention would promise more
    if length <= batch:
        assert bpt > 62 * layer


def test_all_sliding_layers_are_one_group_bounded_by_the_window():
    layer = 2 * 8 * 128 * 2  # Mistral-7B-v0.1: 32 layers, 8 KV heads, window 4096
    short = hybrid_bytes_per_token(layer, 32, 32, 4096, 4096, 2048)
    long = hybrid_bytes_per_token(layer, 32, 32, 4096, 32768, 2048)
    assert short > 32 * layer            # the extra block per request, and the null block
    assert long * 32768 < 32 * layer * 32768 / 3  # a long request holds only its window and in-flight tokens


def test_gemma3_1b_log_holds_no_more_than_vllm_printed():
    """vLLM 0.13 on google/gemma-3-1b-it (26 layers: 4 full, 22 sliding over 512; one KV head
    of 256; max_model_len 2048, batch 8192): "Available KV cache memory: 25.39 GiB",
    950,864 tokens (the accuracy set's entry 27, a public comparison of HF/vLLM on that model).
    At 2048 tokens every group holds the whole request, so the printed figure (blocks over 7
    groups, times 16) is the most it can hold."""
    bpt = hybrid_bytes_per_token(2 * 1 * 256 * 2, 26, 22, 512, 2048, 8192)
    tokens = 25.39 * GiB / bpt
    assert 0.98 * 950_864 <= tokens <= 950_864


def test_before_vllm_018_groups_are_made_with_the_125_rule():
    """7 full + 9 sliding layers: vLLM 0.18+ makes one group of 9 each (9 < 1.5 x 7), 0.14/0.16
    groups of 7 (9 >= 1.25 x 7): one full and two sliding groups, more blocks per request
    (vllm 0.16.0 v1/core/kv_cache_utils.py:1036, 0.18.1 :1043)."""
    layer = 2 * 8 * 128 * 2
    new = hybrid_bytes_per_token(layer, 16, 9, 4096, 8192, 8192, (0, 30))
    old = hybrid_bytes_per_token(layer, 16, 9, 4096, 8192, 8192, (0, 16))
    blocks_new, per_new = _vllm_concurrency(20 * GiB, layer, 7, 9, 4096, 8192, 8192)
    assert old > new
    group = 7  # the old rule, written out: blocks of 7 pages, 1 full group and 2 sliding groups
    per_old = 512 + 2 * (-(-min(4095 + 16384, 8192) // 16) + 1)
    assert 20 * GiB / (old * 8192) <= (20 * GiB // (group * layer * 16)) / per_old


def test_the_longest_request_is_searched_as_vllm_searches_it():
    from omni_autoconf.memory.hybrid_kv import SlidingLayout, longest_request

    layer = 2 * 16 * 128 * 2
    layout = SlidingLayout(layer, 62, 52, 1024, 8192, (0, 30))
    for gib in (8, 12, 16):
        length = longest_request(gib * GiB, layout)
        blocks, per_request = _vllm_concurrency(gib * GiB, layer, 10, 52, 1024, length, 8192)
        assert per_request + 1 <= blocks  # vLLM 0.30's check: one request fits beside the null block
        assert length < gib * GiB / (hybrid_bytes_per_token(layer, 62, 52, 1024, 131072, 8192) )

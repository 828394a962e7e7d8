"""Mamba2 layers beside attention layers: the KV a request takes in vLLM's hybrid pool.

vLLM 0.26-0.30 keeps each Mamba2 layer's state of a sequence (conv window and SSM state,
mamba_utils.py mamba2_state_shape) in the same pool of blocks as the attention KV. After
the model loads it raises the attention block to the smallest multiple of 16 tokens whose
page holds one state (16: the FlashAttention and FlashInfer kernels' smallest block and the
default block size; FlashAttention 4, forced on a B200 at head_dim 256, would align to 128) and pads the state page to that size (platforms/interface.py
_align_hybrid_block_size, "Setting attention block size to N tokens"). Attention and
Mamba layers then form groups of `G` layers (hybrid_kv.group_size) sharing blocks of G
pages (kv_cache_utils.py _get_kv_cache_groups_uniform_page_size). A request of L tokens
takes cdiv(L, block) blocks in each attention group and, in each Mamba group, one block
without prefix caching (mamba_cache_mode "none") or two with it ("align", vLLM's mode when
prefix caching is on; v1/kv_cache_interface.py MambaSpec.max_memory_usage_bytes). vLLM's
"Maximum concurrency" is the pool's blocks over that sum (get_max_concurrency_for_kv_cache_config),
and block 0 is the null block its start-up check keeps back. As for sliding windows, the
planner folds this into bytes per token of a max_model_len request, the null block charged
to every request (never above what vLLM gives).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..inputs.catalog_parts import DTYPE_BYTES, StateLayers
from .hybrid_kv import cdiv, group_size

# The attention block's alignment for a hybrid model: max(the backend's smallest kernel
# block, cache_config.block_size) = max(16, 16) with FlashAttention or FlashInfer and the
# default block size (vllm 0.30.0 platforms/interface.py _align_hybrid_block_size;
# v1/attention/backends/flash_attn.py get_supported_kernel_block_sizes: MultipleOf(16)).
KERNEL_BLOCK_ALIGNMENT = 16
# State blocks one Mamba group holds per request: mamba_cache_mode "none" (prefix caching
# off) and "align" (on), without speculative decoding (kv_cache_interface.py MambaSpec).
STATE_BLOCKS = {False: 1, True: 2}


def _groups(state: StateLayers, tp: int) -> int:
    """B and C groups a rank holds: a single group is replicated to every rank (mamba_utils.py
    extra_groups_for_head_shards; vLLM refuses other n_groups the TP degree does not divide)."""
    return state.n_groups if state.n_groups % tp == 0 else tp


def _elem(dtype: str, auto: int) -> int:
    """Bytes of a Mamba cache dtype (MambaDType); auto: `auto`."""
    return int(DTYPE_BYTES[dtype]) if dtype != "auto" else auto


def state_page_bytes(state: StateLayers, tp: int, model_elem: int, dtypes: tuple[str, str] = ("auto", "auto")) -> int:
    """One Mamba2 layer's state of one sequence on one rank: the conv state of
    (d_inner + 2 x n_groups x state) / TP channels x (conv_kernel - 1) and the SSM state of
    heads / TP x head_dim x state (_groups). `dtypes`: a file's mamba_cache_dtype and
    mamba_ssm_cache_dtype; auto is the model dtype for the conv state, and for the SSM state
    the catalog's (the model's config hook), else the conv state's (mamba_utils.py _mamba_state_dtype)."""
    conv = (state.num_heads * state.head_dim + 2 * _groups(state, tp) * state.state_size) // tp * (state.conv_kernel - 1)
    ssm = state.num_heads // tp * state.head_dim * state.state_size
    conv_elem = _elem(dtypes[0], model_elem)
    return conv * conv_elem + ssm * _elem(dtypes[1] if dtypes[1] != "auto" else state.ssm_dtype, conv_elem)


@dataclass(frozen=True)
class StatePool:
    """A hybrid stage's pool on one rank: attention layers of `attn_token_bytes` per token
    each (K and V) and Mamba layers of `state_bytes` each, per sequence."""

    attn_token_bytes: int
    attn_layers: int
    state_bytes: int
    state_layers: int
    prefix_caching: bool
    vllm: tuple[int, int] = (0, 30)

    @property
    def block_tokens(self) -> int:
        """The attention block vLLM sets: the smallest aligned page that holds one state."""
        align = KERNEL_BLOCK_ALIGNMENT
        return align * cdiv(self.state_bytes, align * self.attn_token_bytes)

    @property
    def group(self) -> int:
        return group_size(self.attn_layers, self.state_layers, self.vllm)

    @property
    def block_bytes(self) -> int:
        """One block of the pool: a page (block_tokens of one attention layer) per group layer."""
        return self.group * self.block_tokens * self.attn_token_bytes

    def blocks_per_request(self, length: int) -> int:
        g = self.group
        return (cdiv(self.attn_layers, g) * cdiv(length, self.block_tokens)
                + cdiv(self.state_layers, g) * STATE_BLOCKS[self.prefix_caching])

    def request_bytes(self, length: int) -> int:
        """Bytes of one request of `length` tokens, its null block included."""
        return self.block_bytes * (self.blocks_per_request(length) + 1)


def state_pool(state: StateLayers, attn_layers: int, attn_token_bytes: int, tp: int, model_elem: int,
               prefix_caching: bool, vllm: tuple[int, int], dtypes: tuple[str, str] = ("auto", "auto")) -> StatePool:
    return StatePool(attn_token_bytes, attn_layers, state_page_bytes(state, tp, model_elem, dtypes), state.layers,
                     prefix_caching, vllm)


def mamba_peak_per_token(state: StateLayers, tp: int, elem: int) -> float:
    """Bytes per token of a Mamba2 mixer's temporaries in the profile run, per rank: the input
    projection (z, x, B, C and dt: 2 x d_inner + 2 x n_groups x state + heads), the conv output,
    the scan output and its gated norm, in the model dtype, plus the chunked scan's fp32
    state of every chunk (heads x head_dim x state per chunk_size tokens). Eager lifetimes, all
    live at once: an estimate that errs high (vllm 0.30.0 model_executor/layers/mamba/mamba_mixer2.py);
    Gated DeltaNet layers get the same formula, an estimate of their chunked kernels' temporaries."""
    inner = state.num_heads * state.head_dim
    groups = _groups(state, tp)
    projection = 2 * inner + 2 * groups * state.state_size + state.num_heads
    conv_out = inner + 2 * groups * state.state_size
    per_token = (projection + conv_out + 2 * inner) / tp * elem
    chunk_states = state.num_heads / tp * state.head_dim * state.state_size * 4 / state.chunk_size
    return per_token + chunk_states

"""The profile run: the activation peak vLLM measures before it sizes the KV cache.

Derived from the code that runs it (vLLM 0.14.1-0.30.0 v1/worker/gpu_model_runner.py
profile_run, _dummy_run, _dummy_sampler_run; vLLM-Omni's runners), term by term:

    E   the multimodal encoder pass on the largest dummy item (the thinker's video)
    D   the decoder dummy run on max_num_batched_tokens tokens: per-layer temporaries
        and, for MoE, the fused-MoE workspace (persistent: kept after profiling)
    S   the sampler dummy run on min(max_num_seqs, tokens) rows of logits (sampler_bytes)
    L   a model that takes its head over every token and keeps a copy (MiMo-Audio)
    W   workspaces the run allocates first and keeps (cuBLAS; estimate, high)
    peak = max(E, D + encoder output kept (+ L), workspace + hidden + S)
    what vLLM measures: peak + W (ProfileTerms.measured)

Tensor lifetimes are those of eager PyTorch (torch.compile may fuse some away), so every
term errs high. Pure functions of a stage spec, a TP degree, knobs and a version.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..inputs.catalog import DTYPE_BYTES, StageSpec, VisionTower
from ..vllm import facts as F
from .mamba_pool import mamba_peak_per_token


@dataclass(frozen=True)
class ProfileTerms:
    """The profile-run peak of one rank and what it is made of (bytes)."""

    encoder_patches: int  # patches of the dummy multimodal item (0: none profiled)
    encoder: int  # E: encoder pass
    encoder_output: int  # kept through the decoder dummy run
    decoder: int  # D: decoder temporaries, without the MoE workspace
    moe_workspace: int  # fused-MoE workspace, persistent after profiling
    sampler: int  # S
    peak: int  # max of the three phases
    persistent: int  # the part of the peak still allocated after profiling
    workspaces: int = F.PROFILE_WORKSPACE_BYTES  # W: allocated by the run and kept (cuBLAS), beside every phase

    @property
    def measured(self) -> int:
        """The torch peak increase vLLM logs: the phases' peak and the workspaces."""
        return self.peak + self.workspaces


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The Qwen-VL processors' resize (transformers qwen2_vl image_processing smart_resize)."""
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def dummy_video_patches(vt: VisionTower, max_model_len: int) -> int:
    """Patches of the dummy video vLLM profiles for a Qwen-VL style tower.

    vLLM sizes the dummy for the image processor's max_pixels and takes as many frames as
    fit max_model_len (at most F.MAX_VIDEO_FRAMES, frames padded to the temporal patch);
    the HF processor then resizes each frame to the video limit it declares."""
    unit = vt.patch_size * vt.spatial_merge_size
    tokens_per_group = vt.image_max_pixels // (unit * unit)
    frames = 0
    for f in range(1, F.MAX_VIDEO_FRAMES + 1):
        if math.ceil(f / vt.temporal_patch_size) * tokens_per_group <= max_model_len:
            frames = f
    frames = max(frames, vt.temporal_patch_size)
    groups = math.ceil(frames / vt.temporal_patch_size)
    side = math.isqrt(tokens_per_group) * unit
    h, w = smart_resize(side, side, unit, vt.video_min_pixels, vt.video_max_pixels)
    return groups * (h // vt.patch_size) * (w // vt.patch_size)


def encoder_peak(vt: VisionTower, patches: int, tp: int) -> int:
    """E(N): the attention phase of the last block, with every deepstack state kept.

    Per patch: the fp32 pixel row and its bf16 copy (3 x T_p x p^2 values each), the
    position embedding, the kept deepstack states, the block input and norm, the QKV
    projection with its rotated copies and the attention output (8 widths / TP), the
    projection output, and rotary tables and softmax statistics (~200 B)."""
    row = 3 * vt.temporal_patch_size * vt.patch_size ** 2
    widths = 4 + vt.deepstack_layers + 8 / tp
    return int(patches * (6 * row + 2 * vt.hidden_size * widths + F.ENCODER_MISC_BYTES_PER_PATCH))


def encoder_output_bytes(vt: VisionTower, patches: int) -> int:
    """The encoder output kept in the encoder cache: one row per merged token, as wide as
    the main output plus every deepstack level, in bf16."""
    merged = patches // (vt.spatial_merge_size ** 2)
    return merged * vt.out_hidden_size * (1 + vt.deepstack_layers) * 2


def moe_workspace(stage: StageSpec, tp: int, tokens: int, vllm: tuple[int, int]) -> int:
    """The fused-MoE workspace: two buffers of (M, top_k, max(2I/TP, H)) in the model
    dtype (vLLM 0.30.0 model_executor/layers/fused_moe/experts/triton_moe.py:230-231),
    shared by all layers and kept after profiling. M is the whole batch from vLLM 0.18;
    0.14/0.16 chunk it at VLLM_FUSED_MOE_CHUNK_SIZE."""
    t = stage.transformer
    if t.mlp != "moe":
        return 0
    m = tokens if vllm >= (0, 18) else min(tokens, F.FUSED_MOE_CHUNK_TOKENS)
    elem = DTYPE_BYTES[stage.dtype]
    return int(2 * m * t.num_experts_per_tok * max(2 * t.intermediate_size / tp, t.hidden_size) * elem)


def decoder_peak(stage: StageSpec, tp: int, tokens: int) -> int:
    """Per-layer temporaries of the decoder dummy run (without the MoE workspace).

    Two copies of the hidden state (residual and normed input) and the QKV projection per
    rank; the q/k norm outputs where the model has them (Qwen3); for MoE layers the
    attention output and its projection, which stay live beside the router (vLLM 0.30
    qwen3_moe.py); then the dense MLP's gate+up and activation (3I/TP) or the shared
    expert's. For dense models this is 3.5% above the two logged Llama-3.1-8B profile
    runs; for MoE it is the eager upper bound of every attention temporary. Attention
    scores take nothing: the profile run builds no attention metadata. A hybrid's Mamba
    layers: their mixer's temporaries where they are the larger (mamba_pool.py)."""
    t = stage.transformer
    elem = DTYPE_BYTES[stage.dtype]
    q = t.num_heads * t.head_dim / tp
    kv = max(1, t.num_kv_heads // tp) * t.head_dim
    per_token = 2 * t.hidden_size + (q + 2 * kv)
    if t.qk_norm:
        per_token += q + kv
    if t.mlp == "dense":
        per_token += 3 * t.intermediate_size / tp
    else:
        per_token += q + t.hidden_size + 3 * t.shared_expert_intermediate_size / tp
    per_token *= elem
    if t.state_layers is not None:  # a hybrid's Mamba layers: the larger of the two kinds
        per_token = max(per_token, 2 * t.hidden_size * elem + mamba_peak_per_token(t.state_layers, tp, elem))
    return int(tokens * per_token)


def profile_terms(stage: StageSpec, tp: int, max_model_len: int, max_num_seqs: int, max_num_batched_tokens: int,
                  version, flashinfer_sampler: bool | None = None) -> ProfileTerms:
    """The profile-run peak of a stage with a vLLM decoder, per rank."""
    t = stage.transformer
    tokens = max_num_batched_tokens
    elem = DTYPE_BYTES[stage.dtype]
    patches = enc = enc_out = 0
    vt = stage.vision_tower
    if vt is not None and (vt.only_if is None or getattr(version, vt.only_if)):
        patches = dummy_video_patches(vt, max_model_len)
        enc = encoder_peak(vt, patches, tp)
        enc_out = encoder_output_bytes(vt, patches)
    elif stage.encoder_profile is not None and (stage.encoder_profile.only_if is None
                                                or getattr(version, stage.encoder_profile.only_if)):
        ep = stage.encoder_profile  # an estimate where the tower is not yet derived (Qwen2.5-Omni)
        budget, items = ep.budget_tokens, 1
        if ep.item_budget_tokens:  # vllm 0.30.0 multimodal/encoder_budget.py _get_max_items
            per_prompt = max(1, min(ep.items_per_prompt, max_model_len // ep.item_budget_tokens))
            items = max(1, min(max(tokens, ep.item_budget_tokens) // ep.item_budget_tokens, max_num_seqs * per_prompt))
            budget = items * ep.item_tokens
        patches = budget * ep.patches_per_token
        enc = int(patches * (ep.intermediate_size + 2 * ep.hidden_size) * elem)
        if ep.score_heads:  # scores and their softmax, per item: heads x positions^2
            positions = patches // items
            enc += int(2 * items * ep.score_heads * positions * positions * elem)
        enc_out = int(budget * t.hidden_size * elem)
    dec = decoder_peak(stage, tp, tokens)
    work = moe_workspace(stage, tp, tokens, version.vllm)
    rows = min(max_num_seqs, tokens)
    sampler = sampler_bytes(rows, t.vocab_size, t.hidden_size, elem, version.vllm, flashinfer_sampler)
    # the decoder's output, all tokens (profile_run keeps `hidden_states` through the sampler run)
    hidden = int(tokens * t.hidden_size * elem)
    # a model whose forward takes the head over every token and clones it (logits_every_token),
    # counted on top of the decoder's temporaries, which are freed before it runs: high
    logits = int(2 * tokens * t.vocab_size * elem) if stage.logits_every_token else 0
    peak = max(enc, dec + work + enc_out + logits, work + hidden + sampler)
    return ProfileTerms(patches, enc, enc_out, dec, work, sampler, peak, work)


def sampler_bytes(rows: int, vocab: int, hidden: int, elem: float, vllm: tuple[int, int],
                  flashinfer: bool | None = None) -> int:
    """S: what the sampler dummy run holds at its peak (vllm/v1/worker/gpu_model_runner.py
    _dummy_sampler_run, 0.10.1-0.30.0): the sampled rows' hidden states and their random
    replacement (`torch.rand_like`), the logits compute_logits returns in the model dtype
    (model_executor/layers/logits_processor.py; under TP gathered whole), their fp32 copy
    (v1/sample/sampler.py, none when the model runs in fp32), then what the top-k/top-p path of
    that version adds per logit (facts.py SAMPLER_*: the Triton or FlashInfer fast path, or
    PyTorch's sort) and the Triton kernel's cached buffer. `flashinfer`: True where vLLM is known
    to have chosen FlashInfer's sampler (facts.FLASHINFER_SAMPLER_IF_INSTALLED_UNTIL); otherwise
    the path that version takes without the optional flashinfer package."""
    triton = not flashinfer and vllm >= F.TRITON_TOPK_FROM and (
        rows >= F.TRITON_TOPK_MIN_ROWS or vllm >= F.TRITON_TOPK_ALL_ROWS_FROM)
    if flashinfer or triton:
        per_logit = F.SAMPLER_FAST_BYTES_PER_LOGIT
    elif rows >= F.SAMPLER_SORT_SMALL_BATCH_ROWS:
        per_logit = F.SAMPLER_SORT_BYTES_PER_LOGIT
    else:
        per_logit = F.SAMPLER_SORT_SMALL_BATCH_BYTES_PER_LOGIT
    per_logit += elem + (0 if elem >= 4 else 4)
    buffer = min(rows, F.TRITON_TOPK_BUFFER_ROWS) * vocab * 4 if triton else 0
    return int(rows * vocab * per_logit + buffer + 2 * rows * hidden * elem)

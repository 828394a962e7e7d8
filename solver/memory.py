"""The memory model: what one stage needs on each of its GPUs, per TP rank, in bytes.

Pure functions of (stage spec, TP degree, knobs, vLLM-Omni version); no solver, no I/O.
The terms follow ../shared/reference/memory-facts.md:

    requested(s, g)  = ceil(total(g) x util(s))                      (§2)
    inside(s, t)     = weights + activation + non_torch + graph_pool  (§2, §3, §7)
    kv(s, g)         = requested(s, g) - inside(s, t)                 (§2)
    outside(s, t)    = cuda_context + nccl + graph_reserve            (§2, §3, §4)

`inside` is what vLLM subtracts from the requested budget before sizing the KV cache;
`outside` is memory the process holds on the device beyond its fraction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from . import vllm_facts as F
from .catalog import DTYPE_BYTES, PipelineSpec, StageSpec
from .errors import InputError
from .vllm_facts import OmniVersion

KvCacheDtype = Literal["auto", "fp8"]


@dataclass(frozen=True)
class StageKnobs:
    """The memory knobs of one stage, resolved (user value, else catalog default)."""

    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enforce_eager: bool
    kv_cache_dtype: KvCacheDtype = "auto"


@dataclass(frozen=True)
class StageMemory:
    """One stage at one TP degree: bytes per rank (identical on every rank)."""

    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    graph_pool_bytes: int
    context_bytes: int
    nccl_bytes: int
    graph_reserve_bytes: int
    kv_bytes_per_token: int  # 0 for stages without a KV cache

    @property
    def inside_bytes(self) -> int:
        """Non-KV memory counted inside the fraction (vLLM's non_kv)."""
        return self.weights_bytes + self.activation_bytes + self.non_torch_bytes + self.graph_pool_bytes

    @property
    def outside_bytes(self) -> int:
        """Memory the process holds on the GPU beyond its fraction."""
        return self.context_bytes + self.nccl_bytes + self.graph_reserve_bytes

    @property
    def overhead_bytes(self) -> int:
        """Everything that is neither weights, activations nor KV cache."""
        return self.non_torch_bytes + self.graph_pool_bytes + self.outside_bytes


def _applies(only_if: str | None, version: OmniVersion) -> bool:
    return only_if is None or bool(getattr(version, only_if))


def weights_per_rank(stage: StageSpec, tp: int, version: OmniVersion) -> int:
    """Bytes of weights one TP rank loads: sharded blocks / tp, replicated blocks whole (§6)."""
    total = 0.0
    for c in stage.components:
        if not _applies(c.only_if, version):
            continue
        nbytes = c.params * DTYPE_BYTES[c.dtype or stage.dtype]
        total += nbytes / tp if c.sharding == "tp" else nbytes
    return int(total)


def kv_bytes_per_token(stage: StageSpec, tp: int, kv_cache_dtype: KvCacheDtype = "auto") -> int:
    """KV bytes per token on one rank (§5): heads are replicated when KV heads < TP."""
    if not stage.has_kv_cache:
        return 0
    t = stage.transformer
    kv_heads_per_rank = max(1, t.num_kv_heads // tp)
    elem = 1 if kv_cache_dtype == "fp8" else int(DTYPE_BYTES[stage.dtype])
    return t.num_layers * 2 * kv_heads_per_rank * t.head_dim * elem


def activation_peak(stage: StageSpec, tp: int, knobs: StageKnobs, version: OmniVersion) -> int:
    """Torch activation peak of the profile run on one rank (§7).

    The decoder pass pushes max_num_batched_tokens tokens through one layer at a time:
    MLP (or fused-MoE) intermediates, the QKV projection and a few hidden-state copies;
    then the sampler computes [min(max_num_seqs, tokens), vocab] fp32 logits. A
    multimodal stage first encodes its largest item; the encoder's activations are gone
    by the decoder pass but its output (the encoder cache) stays.
    """
    t = stage.transformer
    elem = DTYPE_BYTES[stage.dtype]
    tokens = knobs.max_num_batched_tokens
    if stage.generation_profile is not None:
        gp = stage.generation_profile
        return int(min(tokens, gp.tokens_cap) * gp.bytes_per_token)

    qkv = (t.num_heads + 2 * t.num_kv_heads) * t.head_dim / tp
    per_token = qkv + F.ACTIVATION_HIDDEN_COPIES * t.hidden_size
    decoder = tokens * per_token * elem
    if t.mlp == "dense":
        decoder += tokens * 3 * t.intermediate_size / tp * elem
    else:
        moe_tokens = min(tokens, F.FUSED_MOE_CHUNK_TOKENS)
        decoder += moe_tokens * t.num_experts_per_tok * (3 * t.intermediate_size / tp + t.hidden_size) * elem
        decoder += tokens * 3 * t.shared_expert_intermediate_size / tp * elem
    sampler = min(knobs.max_num_seqs, tokens) * t.vocab_size * F.SAMPLER_LOGIT_BYTES

    encoder = encoder_cache = 0.0
    ep = stage.encoder_profile
    if ep is not None and _applies(ep.only_if, version):
        positions = ep.budget_tokens * ep.patches_per_token
        encoder = positions * (ep.intermediate_size + 2 * ep.hidden_size) * elem
        encoder_cache = ep.budget_tokens * t.hidden_size * elem
    return int(max(decoder + sampler, encoder) + encoder_cache)


def stage_memory(stage: StageSpec, tp: int, knobs: StageKnobs, version: OmniVersion) -> StageMemory:
    """All memory terms of `stage` at TP degree `tp`, per rank."""
    graphs = not knobs.enforce_eager
    return StageMemory(
        weights_bytes=weights_per_rank(stage, tp, version),
        activation_bytes=activation_peak(stage, tp, knobs, version),
        non_torch_bytes=F.NON_TORCH_BYTES,
        graph_pool_bytes=F.GRAPH_POOL_ESTIMATE_BYTES if graphs and version.graphs_inside_budget else 0,
        context_bytes=F.CUDA_CONTEXT_BYTES,
        nccl_bytes=F.NCCL_BYTES_PER_RANK if tp > 1 and version.snapshot_after_nccl else 0,
        graph_reserve_bytes=F.GRAPH_RESERVE_BYTES if graphs else 0,
        kv_bytes_per_token=kv_bytes_per_token(stage, tp, knobs.kv_cache_dtype),
    )


def requested_bytes(total_bytes: int, util_steps: int, resolution: int) -> int:
    """vLLM's request: ceil(total x gpu_memory_utilization), util = steps / resolution (§2)."""
    return -(-total_bytes * util_steps // resolution)


def kv_tokens(kv_bytes: int, bytes_per_token: int) -> int:
    """Tokens the KV cache holds: whole blocks of BLOCK_SIZE_TOKENS (§5)."""
    if bytes_per_token <= 0 or kv_bytes <= 0:
        return 0
    block = bytes_per_token * F.BLOCK_SIZE_TOKENS
    return (kv_bytes // block) * F.BLOCK_SIZE_TOKENS


def tokens_needed(max_model_len: int) -> int:
    """Tokens of KV one request of max_model_len occupies, rounded up to whole blocks."""
    b = F.BLOCK_SIZE_TOKENS
    return -(-max_model_len // b) * b


def resolve_knobs(
    pipeline: PipelineSpec,
    schema: str,
    version: OmniVersion,
    *,
    max_model_len: dict[str, int] | None = None,
    max_num_seqs: dict[str, int] | None = None,
    max_num_batched_tokens: dict[str, int] | None = None,
    enforce_eager: dict[str, bool] | None = None,
    kv_cache_dtype: KvCacheDtype = "auto",
    check: bool = True,
) -> dict[str, StageKnobs]:
    """Per-stage knobs: the user's value where given (key: stage name), else the defaults.

    Defaults follow the bundled configs of the target schema and the model's
    max_position (vLLM's default max_model_len). Values the model cannot take (a
    max_model_len beyond its positions, more sequences than it can batch) are input errors.
    """
    out: dict[str, StageKnobs] = {}
    for stage in pipeline.stages:
        d = stage.defaults[schema]
        mml = (max_model_len or {}).get(stage.name, stage.transformer.max_position)
        if check and stage.has_kv_cache and mml > stage.transformer.max_position:
            raise InputError(
                f"--max-model-len {mml} for {stage.name} exceeds the model's maximum "
                f"position {stage.transformer.max_position}"
            )
        seqs = (max_num_seqs or {}).get(stage.name, d.max_num_seqs)
        if check and stage.max_num_seqs_limit is not None and seqs > stage.max_num_seqs_limit:
            raise InputError(
                f"--max-num-seqs {stage.name}={seqs}: {pipeline.name}'s {stage.name} batches at most "
                f"{stage.max_num_seqs_limit} request(s) ({stage.max_num_seqs_limit_source})"
            )
        out[stage.name] = StageKnobs(
            max_model_len=mml,
            max_num_seqs=seqs,
            max_num_batched_tokens=(max_num_batched_tokens or {}).get(stage.name, d.max_num_batched_tokens),
            enforce_eager=(enforce_eager or {}).get(stage.name, d.enforce_eager),
            kv_cache_dtype=kv_cache_dtype,
        )
    return out

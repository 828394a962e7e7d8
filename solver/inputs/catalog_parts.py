"""The parts of a catalog stage: its parameter blocks, decoder geometry, profile inputs,
TP evidence and version overlays (catalog.py assembles them into stages and pipelines).
Every part is strict (unknown keys are errors) and frozen."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

VERSIONS_PATTERN = r"^\d+\.\d+(-(\d+\.\d+)?)?$"  # "0.14-0.24", "0.26-", "0.30"

DTYPE_BYTES: dict[str, float] = {
    # bf16/fp16 2 bytes (torch dtype itemsize); fp8 1 (+ small scales); int4 ~0.52 at group 128
    # (4 bits + a 16-bit scale per 128 weights: 0.5 + 2/128 bytes).
    "bfloat16": 2.0,
    "float16": 2.0,
    "float32": 4.0,
    "fp8": 1.0,
    "int4": 0.52,
    "bytes": 1.0,  # a component counted in stored bytes (read from a checkpoint's headers)
}

# The keys the plan decides for every stage: a catalog field must not set one (the
# renderers would never let it win, and a catalog that tries is a mistake).
PLANNED_KEYS = ("devices", "tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "max_num_seqs",
                "max_num_batched_tokens", "enforce_eager", "kv_cache_dtype", "max_batch_size", "kv_cache_memory_bytes",
                "num_replicas")

SOURCE = "Where the numbers come from: keys of the file's `sources`, or the file, log or page itself."

# Flags of OmniVersion a component or profile may depend on (see vllm_facts.OmniVersion).
VersionFlag = Literal["talker_builds_encoders"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Component(Strict):
    """A block of parameters a stage loads."""

    name: str = Field(description="What it is: llm, audio_encoder, vision_encoder, ...")
    params: int = Field(gt=0, description="Parameter count.")
    sharding: Literal["tp", "replicated"] = Field(
        description="tp: split over the TP ranks (linear layers, experts, vocab); "
        "replicated: every rank holds all of it (norms, routers, encoders)."
    )
    dtype: str | None = Field(default=None, description="Overrides the stage dtype for this block.")
    split_versions: str | None = Field(
        default=None, pattern=VERSIONS_PATTERN,
        description="A replicated block that these vLLM-Omni versions split over the TP ranks instead.",
    )
    split_divides: int | None = Field(
        default=None, gt=0, description="...and only when TP divides this (its attention heads); else replicated."
    )
    only_if: VersionFlag | None = Field(
        default=None, description="Loaded only in vLLM-Omni versions where this flag holds."
    )
    tensor_prefix: str | None = Field(
        default=None, description="The checkpoint tensors of this block (e.g. thinker.audio_tower.)."
    )
    cast_at_load: bool = Field(
        default=False, description="Its float tensors are loaded in the block's dtype, whatever they are stored in "
        "(the Qwen3-TTS codec, stored in fp32, runs in bf16).")
    in_checkpoint: bool = Field(
        default=True, description="False: memory built at load, not read from the checkpoint (a buffer, graph "
        "tensors, a logged residual); a checkpoint's exact weights keep it as it is.")
    source: str = Field(min_length=1, description="Where the count comes from.")


class StateLayers(Strict):
    """Mamba2 mixer layers of a hybrid decoder: each holds a fixed state per sequence (a
    short-convolution window and the SSM state) instead of K and V per token; mamba_pool.py
    sizes them as vLLM's hybrid pool does. Shapes as vLLM 0.30 builds them
    (model_executor/layers/mamba/mamba_utils.py mamba2_state_shape)."""

    layers: int = Field(gt=0, description="Mamba2 mixer layers.")
    num_heads: int = Field(gt=0, description="mamba_num_heads (split over TP).")
    head_dim: int = Field(gt=0, description="mamba_head_dim; num_heads x head_dim is the mixer's inner width.")
    state_size: int = Field(gt=0, description="ssm_state_size.")
    n_groups: int = Field(gt=0, description="n_groups of B and C (padded to the TP degree when it does not divide).")
    conv_kernel: int = Field(gt=1, description="conv_kernel: the conv state keeps conv_kernel - 1 columns.")
    chunk_size: int = Field(gt=0, description="The chunked scan's chunk (its per-chunk states are profile temporaries).")
    ssm_dtype: Literal["float32", "auto"] = Field(
        description="vLLM's mamba_ssm_cache_dtype for this model after its config hook (auto: the conv "
        "state's dtype, the model's); vllm 0.30.0 model_executor/models/config.py NemotronHForCausalLMConfig.")
    source: str = Field(min_length=1, description=SOURCE)


class Transformer(Strict):
    """Geometry of the stage's decoder (for KV bytes and the profile-run activations)."""

    num_layers: int = Field(gt=0, description="Layers with attention (a hybrid's other layers: state_layers).")
    hidden_size: int = Field(gt=0, description="The decoder's width.")
    num_heads: int = Field(gt=0, description="Attention (query) heads; every TP degree must divide it.")
    num_kv_heads: int = Field(gt=0, description="KV heads (GQA), split over TP down to one per rank.")
    head_dim: int = Field(gt=0, description="Explicit head_dim of the config (Qwen3: 128 != hidden/heads).")
    vocab_size: int = Field(gt=0, description="Logits per row: the sampler's profile-run peak.")
    max_position: int = Field(gt=0, description="max_position_embeddings: vLLM's default max_model_len.")
    mlp: Literal["dense", "moe"] = Field(description="moe: a fused-MoE workspace and the MoE layer's temporaries.")
    intermediate_size: int = Field(gt=0, description="Dense MLP width, or per-expert width for MoE.")
    num_experts_per_tok: int = Field(default=0, ge=0, description="MoE top-k (at least 1 for moe).")
    shared_expert_intermediate_size: int = Field(
        default=0, ge=0, description="The MoE layer's shared expert width (0: none).")
    qk_norm: bool = Field(default=False, description="RMSNorm on q and k (Qwen3): two more temporaries.")
    deepstack_levels: int = Field(
        default=0, ge=0, description="Deepstack input buffers of max_num_batched_tokens x hidden allocated at load."
    )
    kv_latent_dim: int = Field(
        default=0, ge=0,
        description="MLA: values of the one latent cached per token and layer (kv_lora_rank + qk_rope_head_dim; "
        "DeepSeek-V2/V3: 576), the same on every TP rank. 0: K and V per head.",
    )
    sliding_window: int = Field(default=0, ge=0, description="Tokens a sliding-window layer attends to.")
    sliding_layers: int = Field(default=0, ge=0, description="How many layers slide (hybrid_kv.py sizes their KV).")
    state_layers: StateLayers | None = Field(
        default=None, description="A hybrid's Mamba2 layers, beside num_layers attention layers.")
    source: str = Field(min_length=1, description=SOURCE)

    @model_validator(mode="after")
    def _moe_fields(self) -> "Transformer":
        if self.sliding_layers > self.num_layers or (self.sliding_layers > 0) != (self.sliding_window > 0):
            raise ValueError("sliding_layers (at most num_layers) and sliding_window go together")
        if self.sliding_layers and self.kv_latent_dim:
            raise ValueError("sliding-window layers with an MLA latent are not modelled")
        if self.state_layers is not None and (self.sliding_layers or self.kv_latent_dim):
            raise ValueError("Mamba layers beside sliding-window or MLA layers are not modelled")
        if self.mlp == "moe" and self.num_experts_per_tok < 1:
            raise ValueError("num_experts_per_tok must be >= 1 for an MoE MLP")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        return self


class EncoderProfile(Strict):
    """The multimodal item the profile run encodes before the decoder pass."""

    budget_tokens: int = Field(gt=0, description="Encoder cache budget, in decoder tokens.")
    patches_per_token: int = Field(gt=0, description="Encoder positions per decoder token (spatial merge^2).")
    hidden_size: int = Field(gt=0, description="The encoder's width.")
    intermediate_size: int = Field(gt=0, description="The encoder's MLP width.")
    item_budget_tokens: int = Field(
        default=0, ge=0, description="Set: the profile encodes max(max_num_batched_tokens, this) // this items "
        "(vllm/multimodal/encoder_budget.py), each of item_tokens decoder tokens; budget_tokens is then unused.")
    item_tokens: int = Field(default=0, ge=0, description="Decoder tokens of one item (with item_budget_tokens).")
    items_per_prompt: int = Field(
        default=999, ge=1, description="The file's limit_mm_per_prompt for the profiled modality (vLLM's default 999): "
        "at most max_num_seqs x min(this, max_model_len // item_budget_tokens) items are profiled "
        "(vllm/multimodal/encoder_budget.py _get_max_items).")
    score_heads: int = Field(
        default=0, ge=0, description="Set: each item's attention scores (heads x positions^2, and their softmax) "
        "are materialised, as SDPA's math path does with a float mask.")
    only_if: VersionFlag | None = Field(default=None, description="Profiled only in versions where this flag holds.")
    source: str = Field(min_length=1, description=SOURCE)

    @model_validator(mode="after")
    def _items(self) -> "EncoderProfile":
        if (self.item_budget_tokens > 0) != (self.item_tokens > 0):
            raise ValueError("item_budget_tokens and item_tokens go together")
        return self


class VisionTower(Strict):
    """A Qwen-VL style vision encoder and the limits its processors put on the dummy video
    the profile run encodes (memory/profile_run.py derives the peak from these)."""

    depth: int = Field(gt=0, description="Vision blocks.")
    hidden_size: int = Field(gt=0, description="The blocks' width.")
    intermediate_size: int = Field(gt=0, description="The blocks' MLP width.")
    num_heads: int = Field(gt=0, description="Attention heads of a block.")
    patch_size: int = Field(gt=0, description="Spatial patch side, in pixels.")
    temporal_patch_size: int = Field(gt=0, description="Frames per patch.")
    spatial_merge_size: int = Field(gt=0, description="Patches merged per side into one decoder token.")
    deepstack_layers: int = Field(ge=0, description="Block outputs kept for deepstack (their count).")
    out_hidden_size: int = Field(gt=0, description="Width of each merger output (the decoder's hidden size).")
    image_max_pixels: int = Field(gt=0, description="Image processor max_pixels: what vLLM sizes the dummy for.")
    video_max_pixels: int = Field(gt=0, description="The HF processor's per-frame video limit.")
    video_min_pixels: int = Field(gt=0, description="The HF processor's per-frame video floor.")
    only_if: VersionFlag | None = Field(default=None, description="Profiled only in versions where this flag holds.")
    source: str = Field(min_length=1, description=SOURCE)


class GenerationProfile(Strict):
    """Profile-run activations of a generation stage (no vLLM decoder, e.g. a vocoder).

    The profile run feeds max_num_batched_tokens tokens, i.e. tokens / tokens_per_frame
    frames; the stage decodes at most chunk_frames of them at once, unless it streams
    (async_chunk) and `whole_batch_when_streaming`, in which case it decodes them all."""

    tokens_per_frame: int = Field(default=1, gt=0, description="Input tokens per decoded frame (codebooks).")
    chunk_frames: int = Field(gt=0, description="Frames decoded at once when chunking.")
    bytes_per_frame: int = Field(gt=0, description="Activation bytes per frame at the peak.")
    whole_batch_when_streaming: bool = Field(
        default=False, description="Streaming (async_chunk), it decodes every frame of the batch at once.")
    frames_from_batch: bool = Field(
        default=True, description="False: the peak decode is chunk_frames whatever max_num_batched_tokens is "
        "(a serving decode sized by the connector's chunks, not by the batch).")
    state_bytes_per_seq: int = Field(
        default=0, ge=0,
        description="Per-request decoder state held for every one of max_num_seqs rows (model-local KV).",
    )
    frames_per_seq: int = Field(
        default=0, ge=0, description="Set: a step decodes at most this many frames per request, so at most "
        "max_num_seqs x this (a streaming window: left context plus chunk).")
    source: str = Field(min_length=1, description=SOURCE)


class ServingOutside(Strict):
    """Memory a stage's process takes while serving beyond what its fraction accounts for
    (an encoder run on request inputs that no profile run sees); held on each of its GPUs."""

    bytes: int = Field(gt=0, description="What it takes on each GPU (the whole stage's with split_over_tp).")
    bytes_per_seq: int = Field(default=0, ge=0, description="More for each of max_num_seqs (batched decodes).")
    split_over_tp: bool = Field(default=False, description="The figures are the whole stage's at TP 1 and each rank "
                                "holds its share (a copy of the rank's KV).")
    assumes: str = Field(min_length=1, description="The request it is sized for, e.g. a 30 s reference clip.")
    source: str = Field(min_length=1, description=SOURCE)



class DiffusionProfile(Strict):
    """What a diffusion stage holds beyond its weights at its largest request. Nothing in
    vLLM-Omni bounds it: a dense diffusion stage reads no gpu_memory_utilization and checks
    no free memory at start-up (vllm_omni 0.30.0 diffusion/worker/diffusion_worker.py reads
    it only in paged_scheduler mode), so the plan holds room for all of it outside any KV."""

    peak_bytes: int = Field(gt=0, description="Beyond weights: activations, context KV copies, decode, slack.")
    bytes_per_seq: int = Field(
        default=0, ge=0, description="More for each of max_num_seqs (requests batched into one forward).")
    pool_fraction_of_free: float = Field(
        default=0.0, ge=0.0, le=1.0, description="An engine that allocates a KV pool at load (the AR-diffusion "
        "engine's gpu_memory_fraction): this fraction of the memory free once the weights are in, at least "
        "pool_floor_bytes; it refuses to start when the floor does not fit.")
    pool_floor_bytes: int = Field(default=0, ge=0, description="The pool's least (one session), part of peak_bytes.")
    resolution: str = Field(min_length=1, description="The request it is sized for, e.g. 1024x1024 with CFG.")
    source: str = Field(min_length=1, description=SOURCE)

    @model_validator(mode="after")
    def _pool(self) -> "DiffusionProfile":
        if (self.pool_fraction_of_free > 0) != (self.pool_floor_bytes > 0) or self.pool_floor_bytes > self.peak_bytes:
            raise ValueError("pool_fraction_of_free and pool_floor_bytes go together, the floor within peak_bytes")
        return self


class BatchRule(Strict):
    """What a stage's max_num_batched_tokens must be beyond vLLM's own rules."""

    minimum: int = Field(gt=0, description="The least max_num_batched_tokens.")
    multiple_of: int = Field(default=1, gt=0, description="max_num_batched_tokens must be a multiple of this.")
    source: str = Field(min_length=1, description=SOURCE)


class TpEvidence(Strict):
    """An upstream config or test that runs a stage at a TP degree, in some versions."""

    tp: int = Field(ge=1, description="The TP degree (one of the stage's tp_degrees).")
    versions: str = Field(pattern=VERSIONS_PATTERN, description='vLLM-Omni versions, e.g. "0.14-0.30" or "0.20-".')
    source: str = Field(min_length=1, description="The file (wheel or repository path) and what it sets.")


class LegacyOverlay(Strict):
    """Legacy (stage_args) fields that only some vLLM-Omni versions' bundled files set."""

    versions: str = Field(pattern=VERSIONS_PATTERN, description="The vLLM-Omni versions it applies to.")
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="engine_args keys set over the stage's legacy_engine_args.")
    source: str = Field(min_length=1, description=SOURCE)


class DeployTopOverlay(Strict):
    """Top-level deploy keys that only some vLLM-Omni versions take (e.g. which registry
    key `pipeline:` names), with what a user must know when that version runs the file."""

    versions: str = Field(pattern=VERSIONS_PATTERN, description="The vLLM-Omni versions it applies to.")
    fields: dict[str, Any] = Field(min_length=1, description="Top-level deploy keys; they win over deploy_top.")
    note: str | None = Field(default=None, description="Said in the plan's header for these versions.")
    source: str = Field(min_length=1, description=SOURCE)


class MemoryDefaults(Strict):
    """Values of the memory knobs when neither the user nor the plan sets them."""

    max_num_seqs: int = Field(gt=0, description="As the bundled file sets it, else vLLM's default.")
    max_num_batched_tokens: int = Field(gt=0, description="As the bundled file sets it, else vLLM's default.")
    enforce_eager: bool = Field(description="As the bundled file sets it (false: CUDA graphs are captured).")
    max_model_len: int | None = Field(default=None, gt=0, description="Else the model's max_position (vLLM's default).")

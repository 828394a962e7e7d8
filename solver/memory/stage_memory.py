"""The memory model: what one stage needs on each of its GPUs, per TP rank, in bytes.

Pure functions of (stage spec, TP degree, knobs, vLLM-Omni version); no solver, no I/O.

    requested  = ceil(total x util)
    inside     = what vLLM-Omni subtracts from `requested` before sizing the KV cache
    kv         = requested - inside
    outside    = what the process holds on the GPU beyond `requested`

How `inside` is measured depends on the version (vllm_omni/worker/base.py
determine_available_memory): vLLM-Omni 0.14 and 0.30 subtract the profile run's
weights + torch peak + non-torch growth ("profile"); 0.16-0.28 subtract the process's
NVML memory after profiling when NVML sees the process, else the same profile figures
("either"). Then the CUDA context sits inside and the transient part of the peak
outside; both readings are taken at their worse. No version subtracts CUDA-graph memory:
graphs are captured after the KV cache exists, outside the fraction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..errors import InputError
from ..inputs.catalog import DTYPE_BYTES, PipelineSpec, StageSpec
from ..vllm import facts as F
from ..vllm.facts import OmniVersion, in_range
from ..vllm.quantization import FP8_AT_LOAD_STREAMED_FROM, QUANT_OVERRIDES, QUANT_SCALE_BYTES_PER_WEIGHT
from .hybrid_kv import PoolLayout, SlidingLayout, effective_bytes_per_token
from .mamba_pool import state_pool
from .profile_run import profile_terms

KvCacheDtype = Literal["auto", "fp8"]


@dataclass(frozen=True)
class StageKnobs:
    """The memory knobs of one stage, resolved (user value, else catalog default)."""

    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enforce_eager: bool
    kv_cache_dtype: KvCacheDtype = "auto"
    async_chunk: bool = False  # the pipeline streams between stages
    # vLLM's hybrid KV cache manager: on, off (disable_hybrid_kv_cache_manager), or None: not
    # known (a kv_transfer_config, whose connector may turn it off), the worse of the two counted
    hybrid_kv: bool | None = True
    prefix_caching: bool = True  # vLLM V1's default; a hybrid Mamba stage then keeps two state blocks
    mamba_dtypes: tuple[str, str] = ("auto", "auto")  # a file's mamba_cache_dtype, mamba_ssm_cache_dtype
    kv_skip_layers: int = 0  # with fp8 KV: layers kv_cache_dtype_skip_layers keeps in the model dtype
    dtype: str | None = None  # `--dtype` / the stage's `dtype` as vLLM reads it (None: auto, the checkpoint's)
    quantization: str | None = None  # `--quantization` / the stage's `quantization` (None: the checkpoint's)
    # FlashInfer's top-k/top-p sampler: True where a log shows vLLM chose it ("Using FlashInfer for
    # top-p & top-k sampling."), False where it shows the PyTorch fallback; None: that version's
    # default without the optional flashinfer package (profile_run.sampler_bytes)
    flashinfer_sampler: bool | None = None


@dataclass(frozen=True)
class StageMemory:
    """One stage at one TP degree: bytes per rank (identical on every rank)."""

    weights_bytes: int  # "Model loading took": weights and the buffers built with them
    activation_bytes: int  # the profile run's torch peak
    persistent_bytes: int  # the part of the peak still allocated after profiling
    non_torch_bytes: int
    context_bytes: int
    nccl_bytes: int
    runner_bytes: int  # input buffers the model runner allocates after the snapshot
    graph_reserve_bytes: int
    kv_bytes_per_token: int  # 0 for stages without a KV cache
    accounting: str = "profile"  # "profile" or "either" (see the module docstring)
    load_buffer_bytes: int = 0  # the part of weights_bytes that is buffers, not checkpoint tensors
    state_bytes: int = 0  # per-request state allocated while serving (no load figure includes it)
    # sliding-window or Mamba layers in vLLM's hybrid pool (a request's bytes by its length,
    # for hybrid_kv.longest_request); None: every token costs kv_bytes_per_token
    kv_layout: PoolLayout | None = None
    serving_outside_bytes: int = 0  # taken while serving, beyond the fraction (catalog serving_outside)
    pool_fraction: float = 0.0  # a diffusion engine's load-time KV pool: this share of what is free after load ...
    pool_floor_bytes: int = 0  # ... at least this, which activation_bytes includes

    @property
    def inside_bytes(self) -> int:
        """Non-KV memory vLLM-Omni subtracts from the request (the worse reading)."""
        base = self.weights_bytes + self.non_torch_bytes + self.state_bytes
        if self.accounting == "either":
            scoped = self.persistent_bytes + self.context_bytes + self.nccl_bytes + self.runner_bytes
            return base + max(self.activation_bytes, scoped)
        return base + self.activation_bytes

    @property
    def outside_bytes(self) -> int:
        """Memory the process holds on the GPU beyond its request (the worse reading)."""
        before = self.context_bytes + self.nccl_bytes + self.runner_bytes
        late = self.graph_reserve_bytes + self.serving_outside_bytes
        if self.accounting == "either":
            return late + max(before, self.activation_bytes - self.persistent_bytes)
        return late + before

    @property
    def started_outside_bytes(self) -> int:
        """What a started process holds beyond its request in the start-up model: context,
        NCCL, graphs, and the runner's buffers where the KV measurement cannot see them (the
        "either" reading counts them inside already). Serving-time memory comes later."""
        runner = self.runner_bytes if self.accounting == "profile" else 0
        return self.context_bytes + self.nccl_bytes + self.graph_reserve_bytes + runner

    @property
    def overhead_bytes(self) -> int:
        """Everything that is neither weights, activations nor KV cache (state included)."""
        return self.inside_bytes - self.weights_bytes - self.activation_bytes + self.outside_bytes


def _applies(only_if: str | None, version: OmniVersion) -> bool:
    return only_if is None or bool(getattr(version, only_if))


def weights_per_rank(stage: StageSpec, tp: int, version: OmniVersion) -> int:
    """Bytes of weights one TP rank loads: sharded blocks / tp, replicated blocks whole (§6)."""
    total = 0.0
    for c in stage.components:
        if not _applies(c.only_if, version):
            continue
        nbytes = c.params * DTYPE_BYTES[c.dtype or stage.dtype]
        split = c.sharding == "tp" or (
            c.split_versions is not None and in_range(version.name, c.split_versions)
            and (c.split_divides is None or c.split_divides % tp == 0)
        )
        total += nbytes / tp if split else nbytes
    return int(total)


def _layer_token_bytes(stage: StageSpec, tp: int, kv_cache_dtype: KvCacheDtype) -> int:
    t = stage.transformer
    elem = 1 if kv_cache_dtype == "fp8" else int(DTYPE_BYTES[stage.dtype])
    return 2 * max(1, t.num_kv_heads // tp) * t.head_dim * elem


def kv_layout(stage: StageSpec, tp: int, knobs: StageKnobs, vllm: tuple[int, int] = (0, 30)) -> PoolLayout | None:
    """The layout vLLM sizes in its hybrid pool: Mamba layers beside attention
    (mamba_pool.py), or sliding-window layers (hybrid_kv.py); None when every token costs
    the same (no such layers, or the hybrid manager off for a model that also has full
    layers: all sized as full)."""
    t = stage.transformer
    if not stage.has_kv_cache or t.kv_latent_dim:
        return None
    layer = _layer_token_bytes(stage, tp, knobs.kv_cache_dtype)
    if t.state_layers is not None:
        return state_pool(t.state_layers, t.num_layers, layer, tp, int(DTYPE_BYTES[stage.dtype]),
                          knobs.prefix_caching, vllm, knobs.mamba_dtypes)
    if not t.sliding_layers or (knobs.hybrid_kv is False and t.sliding_layers < t.num_layers):
        return None
    return SlidingLayout(layer, t.num_layers, t.sliding_layers, t.sliding_window, knobs.max_num_batched_tokens, vllm)


def kv_bytes_per_token(stage: StageSpec, tp: int, kv_cache_dtype: KvCacheDtype = "auto",
                       knobs: StageKnobs | None = None, vllm: tuple[int, int] = (0, 30)) -> int:
    """KV bytes per token on one rank: K and V of the rank's KV heads per layer (heads are
    replicated when there are fewer KV heads than ranks), or for MLA one latent per layer
    that every rank holds whole (vLLM's MLAAttentionSpec, vllm/v1/kv_cache_interface.py).
    With sliding-window or Mamba layers, the effective figure of a request of
    knobs.max_model_len (kv_layout); without knobs, every attention layer counted as full."""
    if not stage.has_kv_cache:
        return 0
    t = stage.transformer
    elem = 1 if kv_cache_dtype == "fp8" else int(DTYPE_BYTES[stage.dtype])
    # kv_cache_dtype_skip_layers: those layers keep the model dtype beside the fp8 ones (vllm 0.30.0
    # model_executor/layers/attention/attention.py), their pages unified with the others', so a
    # token costs the sum of its layers' K and V
    skip = min(knobs.kv_skip_layers, t.num_layers) if knobs is not None and kv_cache_dtype == "fp8" else 0
    if t.kv_latent_dim:
        return (t.num_layers - skip) * t.kv_latent_dim * elem + skip * t.kv_latent_dim * int(DTYPE_BYTES[stage.dtype])
    full = ((t.num_layers - skip) * _layer_token_bytes(stage, tp, kv_cache_dtype)
            + skip * _layer_token_bytes(stage, tp, "auto"))
    layout = kv_layout(stage, tp, knobs, vllm) if knobs is not None else None
    if skip and layout is not None:
        raise InputError(f"{stage.name}: kv_cache_dtype_skip_layers beside sliding-window or Mamba layers is not modelled")
    if layout is None:
        return full
    hybrid = effective_bytes_per_token(layout, knobs.max_model_len)
    return max(hybrid, full) if knobs.hybrid_kv is None else hybrid


def activation_peak(stage: StageSpec, tp: int, knobs: StageKnobs, version: OmniVersion) -> tuple[int, int]:
    """(peak, persistent) of the profile run on one rank.

    A stage with a vLLM decoder: profile.profile_terms. A generation stage (a vocoder):
    its frames decoded at once times the bytes per frame; nothing persists."""
    if stage.diffusion_profile is not None:
        dp = stage.diffusion_profile
        return dp.peak_bytes + dp.bytes_per_seq * knobs.max_num_seqs, 0
    if stage.generation_profile is not None:
        gp = stage.generation_profile
        frames = max(1, knobs.max_num_batched_tokens // gp.tokens_per_frame)
        if not gp.frames_from_batch:
            frames = gp.chunk_frames
        elif not (knobs.async_chunk and gp.whole_batch_when_streaming):
            frames = min(frames, gp.chunk_frames)
        if gp.frames_per_seq:
            frames = min(frames, knobs.max_num_seqs * gp.frames_per_seq)
        return frames * gp.bytes_per_frame, 0
    terms = profile_terms(stage, tp, knobs.max_model_len, knobs.max_num_seqs, knobs.max_num_batched_tokens, version,
                          flashinfer_sampler=knobs.flashinfer_sampler)
    return terms.measured, terms.persistent + terms.workspaces


def with_model_dtype(stage: StageSpec, dtype: str | None) -> StageSpec:
    """The stage loaded in vLLM dtype `dtype` (a VLLM_DTYPES name; None or auto: as it is): its
    weights and activations in that dtype, and its KV cache too unless kv_cache_dtype says
    otherwise; components with a dtype of their own keep it. A quantized checkpoint's weights
    are not a float dtype: another dtype for it is refused, not guessed."""
    if dtype is None or F.VLLM_DTYPES.get(dtype) in (None, stage.dtype):
        if dtype is not None and dtype not in F.VLLM_DTYPES:
            raise InputError(f"{stage.name}: dtype {dtype!r} is not one vLLM accepts ({', '.join(F.VLLM_DTYPES)})")
        return stage
    if stage.dtype not in ("bfloat16", "float16", "float32") or not stage.bounded_by_fraction:
        raise InputError(f"{stage.name}: dtype {dtype} for a {stage.dtype} {stage.role} stage is not modelled "
                         "(a quantized or diffusion stage keeps its own dtype here)")
    return stage.model_copy(update={"dtype": F.VLLM_DTYPES[dtype]})


def with_quantization(stage: StageSpec, method: str | None, vllm: tuple[int, int] | None = None) -> StageSpec:
    """The stage as vLLM loads it with `quantization` = `method` (None: the checkpoint's own).

    On a quantized checkpoint vLLM takes only its own method or its Marlin kernel
    (vllm.quantization.QUANT_OVERRIDES). On an unquantized one, "fp8" quantizes every linear layer
    and routed expert at load (vllm 0.30.0 model_executor/layers/quantization/online/fp8.py; one
    fp32 scale per tensor, charged here at QUANT_SCALE_BYTES_PER_WEIGHT: high); embeddings, lm_head
    and norms stay in the model dtype. That needs the linear layers known apart (`linear_layers`:
    a one-stage LLM read from its config.json or safetensors), and, to plan (`vllm` given), a vLLM
    that quantizes each layer as it loads (FP8_AT_LOAD_STREAMED_FROM). Anything else is refused
    with its name, never guessed."""
    if method is None:
        return stage
    method = method.strip().lower()
    if stage.quantization is not None:
        if method == stage.quantization or method in QUANT_OVERRIDES.get(stage.quantization, ()):
            return stage
        raise InputError(f"{stage.name}: quantization {method!r} does not match the checkpoint's "
                         f"{stage.quantization!r} (vLLM refuses to start)")
    if method != "fp8":
        raise InputError(f"{stage.name}: quantization {method!r} on an unquantized checkpoint is not modelled "
                         "(fp8 is: it quantizes the linear layers at load)")
    linear = [c for c in stage.components if c.name in ("linear", "experts")]
    if not stage.linear_layers or stage.role != "autoregressive" or not linear or any(c.dtype for c in linear):
        raise InputError(f"{stage.name}: quantization fp8 is modelled for a one-stage LLM read from its config.json "
                         "or safetensors (a Hub id or a directory), where its linear layers are known apart")
    if vllm is not None and vllm < FP8_AT_LOAD_STREAMED_FROM:
        raise InputError(f"{stage.name}: quantization fp8 at load on vLLM {vllm[0]}.{vllm[1]} is not modelled: "
                         "before 0.16 vLLM holds the whole bf16 model before quantizing it")
    per_weight = 1 + QUANT_SCALE_BYTES_PER_WEIGHT
    components = [c.model_copy(update={"params": max(1, int(c.params * per_weight)), "dtype": "bytes",
                                       "source": f"{c.source}; fp8 at load (vLLM quantization=fp8)"})
                  if c in linear else c for c in stage.components]
    return stage.model_copy(update={"components": components, "quantization": "fp8"})


def stage_memory(stage: StageSpec, tp: int, knobs: StageKnobs, version: OmniVersion,
                 sequence_parallel: int = 1) -> StageMemory:
    """All memory terms of `stage` at TP degree `tp`, per rank. `sequence_parallel`: a diffusion
    stage's sequence-parallel ranks per TP rank, which split no weight but join its NCCL groups."""
    stage = with_quantization(with_model_dtype(stage, knobs.dtype), knobs.quantization)
    graphs = not knobs.enforce_eager
    elem = DTYPE_BYTES[stage.dtype]
    hidden = stage.transformer.hidden_size
    deepstack = stage.transformer.deepstack_levels * knobs.max_num_batched_tokens * hidden * 2
    gp = stage.generation_profile
    state = gp.state_bytes_per_seq * knobs.max_num_seqs if gp is not None else 0
    peak, persistent = activation_peak(stage, tp, knobs, version)
    return StageMemory(
        weights_bytes=weights_per_rank(stage, tp, version) + deepstack,
        activation_bytes=peak,
        persistent_bytes=persistent,
        non_torch_bytes=F.NON_TORCH_BYTES_TP if tp * sequence_parallel > 1 else F.NON_TORCH_BYTES,
        context_bytes=F.CUDA_CONTEXT_BYTES,
        nccl_bytes=F.NCCL_BYTES_PER_RANK if tp * sequence_parallel > 1 and version.snapshot_after_nccl else 0,
        runner_bytes=int(knobs.max_num_batched_tokens * (stage.runner_hidden_size or hidden) * elem),
        graph_reserve_bytes=F.GRAPH_RESERVE_BYTES if graphs else 0,
        kv_bytes_per_token=kv_bytes_per_token(stage, tp, knobs.kv_cache_dtype, knobs, version.vllm),
        kv_layout=kv_layout(stage, tp, knobs, version.vllm),
        # A stage without KV cache sizes nothing from the measurement: its fraction is only
        # the start-up gate, and what it holds is its profile peak either way.
        accounting=version.kv_accounting if stage.has_kv_cache else "profile",
        load_buffer_bytes=deepstack,
        state_bytes=state,
        serving_outside_bytes=_serving_outside(stage, tp, knobs.max_num_seqs),
        pool_fraction=stage.diffusion_profile.pool_fraction_of_free if stage.diffusion_profile else 0.0,
        pool_floor_bytes=stage.diffusion_profile.pool_floor_bytes if stage.diffusion_profile else 0,
    )


def _serving_outside(stage: StageSpec, tp: int, max_num_seqs: int) -> int:
    """What the stage takes while serving beyond its fraction, per rank (catalog serving_outside)."""
    so = stage.serving_outside
    if so is None:
        return 0
    total = so.bytes + so.bytes_per_seq * max_num_seqs
    return -(-total // tp) if so.split_over_tp else total


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
    dtype: dict[str, str] | None = None,
    quantization: dict[str, str] | None = None,
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
        mml = (max_model_len or {}).get(stage.name, stage.default_max_model_len(schema))
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
            dtype=(dtype or {}).get(stage.name),
            quantization=(quantization or {}).get(stage.name),
            async_chunk=pipeline.async_chunk(schema),
            prefix_caching=pipeline.prefix_caching(stage, schema),
        )
    return out

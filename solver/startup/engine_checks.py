"""vLLM's own validation of a stage's engine config, run before any weights load.

Each stage builds a vLLM engine config from its engine args; a value that vLLM refuses
fails that stage at start-up, after the stages before it have loaded (minutes of work
lost). The planner refuses to write such a stage, and `check` reports it as
`engine-config-invalid` with vLLM's message. Sources: the vLLM wheels X.Y that vLLM-Omni
X.Y runs on (vllm-omni code comments "align with v0.14.0", "vllm 0.20 rebase", "vLLM
0.26: ...", "upstream v0.28"), read file by file; line numbers are for the 0.30.0 wheel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..inputs.gpus import refuses_bf16
from ..vllm.facts import OmniVersion, in_range

if TYPE_CHECKING:
    from ..inputs.catalog import PipelineSpec, StageSpec
    from ..memory.stage_memory import StageKnobs

# vllm/config/cache.py CacheDType (0.30.0: line 39), the kv_cache_dtype strings vLLM
# accepts, by the version that added them. "fp16", "half" and "int8" never were.
_KV_CACHE_DTYPES_SINCE = (
    ("0.14", ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")),
    ("0.18", ("float16",)),
    ("0.20", ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
              "int8_per_token_head", "fp8_per_token_head", "nvfp4")),
    ("0.26", ("int4_per_token_head",)),
    ("0.28", ("nvfp4_4over6",)),
    ("0.30", ("nvfp4_ds_mla",)),
)


def kv_cache_dtypes(version: OmniVersion) -> tuple[str, ...]:
    """The kv_cache_dtype values vLLM X.Y accepts (versions before 0.14 as 0.14)."""
    out: list[str] = []
    for since, names in _KV_CACHE_DTYPES_SINCE:
        if since == "0.14" or in_range(version.name, f"{since}-"):
            out.extend(names)
    return tuple(out)


def engine_config_errors(
    *,
    max_model_len: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    chunked_prefill: bool,
    kv_cache_dtype: str,
    version: OmniVersion,
) -> list[str]:
    """vLLM's messages for the scheduler and cache checks this stage would fail.

    `max_model_len` is the value vLLM resolves: the stage's own, else the length derived
    from the model config."""
    errors = []
    # vllm/config/scheduler.py verify_max_model_len (0.30.0: line 302; the same text in
    # 0.14.1-0.30.0), raised while SchedulerConfig is built.
    if not chunked_prefill and max_num_batched_tokens < max_model_len:
        errors.append(
            f"max_num_batched_tokens ({max_num_batched_tokens}) is smaller than max_model_len ({max_model_len}). "
            "This effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM "
            "reject longer sequences. Please increase max_num_batched_tokens or decrease max_model_len."
        )
    if max_num_batched_tokens < max_num_seqs:
        if in_range(version.name, "0.24-"):
            # vllm-omni 0.24.0-0.30.0 OmniStageSchedulerConfig.__post_init__ checks first
            # (0.30.0 wheel, vllm_omni/config/omni_config.py:607).
            errors.append(f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs ({max_num_seqs})")
        else:  # vllm/config/scheduler.py (0.30.0: line 312), 0.14.1-0.30.0
            errors.append(
                f"max_num_batched_tokens ({max_num_batched_tokens}) must be greater than or equal to "
                f"max_num_seqs ({max_num_seqs})."
            )
    allowed = kv_cache_dtypes(version)
    if kv_cache_dtype not in allowed:
        shown = ", ".join(repr(d) for d in allowed)
        errors.append(f"kv_cache_dtype: Input should be {shown} [type=literal_error, input_value={kv_cache_dtype!r}]")
    return errors


def stage_knob_errors(pipeline: PipelineSpec, st: StageSpec, k: StageKnobs, schema: str,
                      version: OmniVersion) -> list[str]:
    """Why vLLM or the model would refuse these knobs for this stage (empty: accepted)."""
    errors = []
    if st.has_kv_cache and k.max_model_len > st.transformer.max_position:
        errors.append(f"max_model_len {k.max_model_len} exceeds the model's maximum position {st.transformer.max_position}")
    if st.max_num_seqs_limit is not None and k.max_num_seqs > st.max_num_seqs_limit:
        errors.append(f"{pipeline.name}'s {st.name} batches at most {st.max_num_seqs_limit} request(s) "
                      f"({st.max_num_seqs_limit_source})")
    for rule in (st.batch_rule_error(k.max_num_batched_tokens), st.rows_rule_error(k.max_num_seqs)):
        if rule is not None:
            errors.append(rule)
    errors += engine_config_errors(
        max_model_len=k.max_model_len, max_num_seqs=k.max_num_seqs, max_num_batched_tokens=k.max_num_batched_tokens,
        chunked_prefill=pipeline.chunked_prefill(st, schema), kv_cache_dtype="auto" if k.kv_cache_dtype == "auto" else "fp8",
        version=version)
    return errors


# vllm/platforms/cuda.py check_if_supports_dtype (0.30.0: line 668; the same text in
# 0.14.1-0.30.0), raised while the worker starts.
BF16_MESSAGE = ("Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your {gpu} GPU has "
                "compute capability below 8.0. You can use float16 instead by explicitly setting the `dtype` flag")


def bf16_refusal(pipeline: "PipelineSpec", gpus, schema: str) -> str | None:
    """Why no plan can be written: a stage whose file must say dtype bfloat16 (as its bundled
    one does) and GPUs vLLM runs no bfloat16 on; None when there is no such pair."""
    old = sorted({g.name for g in gpus if refuses_bf16(g)})
    for st in pipeline.stages if old else ():
        if pipeline.written_dtype(st, schema) == "bfloat16":
            return (f"{st.name}: {pipeline.name} runs it with dtype bfloat16, as its bundled file does, and vLLM "
                    f"refuses bfloat16 on {', '.join(old)} (compute capability below 8.0); plan it on other GPUs")
    return None

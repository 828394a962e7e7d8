"""Every constant that models vLLM / vLLM-Omni behaviour, in one place.

Each constant names its source and the version range it holds for. Sources:
- vllm X / vLLM X.Y wheel: the vllm==X wheel from PyPI, read file by file (no import)
- wheel X / vllm_omni X: the vllm-omni X wheel from PyPI, read file by file (no import)
- GitHub pull requests and issues, by URL; public start-up logs by the URL of the issue
  that prints them (tests/data/accuracy.jsonl records the source of each log it holds)

Version-dependent behaviour is a property of `OmniVersion`, selected by `--omni-version`.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30
MiB = 1 << 20


def gib_text(nbytes: float) -> str:
    """Bytes as GiB with 2 decimals, the way vLLM prints them (vllm/utils/mem_utils.py
    format_gib): every GiB figure the tool prints goes through here, so a total reads the
    same in `gpus`, plans and `check`."""
    return f"{nbytes / GiB:.2f}"

# --- start-up and budget -----------------------------------------------------------

# KV cache block size in tokens; vLLM allocates whole blocks. (vllm 0.14.1-0.16.0 wheels:
# vllm/platforms/cuda.py sets cache_config.block_size = 16; 0.18.1-0.30.0: vllm/config/cache.py
# DEFAULT_BLOCK_SIZE = 16)
BLOCK_SIZE_TOKENS = 16

# Tokens in flight that a sliding-window layer keeps beyond its window, in batches of
# max_num_batched_tokens: max_concurrent_batches, 2 with async scheduling (on by default)
# and the V1 runner at pipeline parallel 1 (vllm 0.30.0 config/vllm.py max_in_flight_tokens,
# used by v1/kv_cache_interface.py SlidingWindowSpec from 0.26). vLLM up to 0.24 counted one
# batch: 2 errs high (more blocks per request) there.
SLIDING_WINDOW_IN_FLIGHT_BATCHES = 2

# CUDA context + cuBLAS handles of one process on one GPU, outside the fraction because
# the snapshot is taken after they exist (vllm 0.14.1-0.30.0 wheels, vllm/v1/worker/
# gpu_worker.py init_device). ~0.3-0.6 GiB per process is an estimate (no public source
# found); we take the high end so a plan never counts on the lucky case. (vLLM 0.9-0.33)
CUDA_CONTEXT_BYTES = 600 * MiB

# NCCL communicator buffers of one TP rank, outside the fraction from vLLM 0.11 (snapshot
# after NCCL init: https://github.com/vllm-project/vllm/pull/25359; vllm 0.14.1-0.30.0
# wheels, vllm/v1/worker/gpu_worker.py init_device). No public per-rank figure: an
# estimate, to be replaced by the calibration issue.
NCCL_BYTES_PER_RANK = 256 * MiB

# Non-torch memory that grows after the snapshot and so counts inside the fraction. Public
# start-up logs (tests/data/accuracy.jsonl) print, at TP=1: 0.35 GiB (V0, RTX 3090), 0.26
# (vLLM 0.31, A100), 0.21 (0.10.2, L40S), 0.13-0.14 (0.11, H100), 0.06 (0.26, RTX 4080);
# at TP=2: 0.25 (V0, RTX 4090), 0.54-0.55 (0.11, H100: NCCL and custom all-reduce buffers
# created at the first collective). We take the largest of each, rounded up.
NON_TORCH_BYTES = 360 * MiB
NON_TORCH_BYTES_TP = 600 * MiB

# vLLM-Omni admission rule (wheel 0.30, vllm_omni/engine/stage_admission.py):
# _DEFAULT_EXTERNAL_RESERVE_BYTES and _DEFAULT_SAFETY_MARGIN_BYTES, 1 GiB each, per device.
ADMISSION_EXTERNAL_RESERVE_BYTES = 1 * GiB
ADMISSION_SAFETY_MARGIN_BYTES = 1 * GiB

# Graph memory outside the fraction, per stage with CUDA graphs (0 when enforce_eager).
# vLLM-Omni 0.30 admission reserves _DEFAULT_GRAPH_RESERVE_BYTES = 2 GiB per such stage
# (vllm_omni/engine/stage_admission.py). No vLLM-Omni version subtracts graph memory from
# the KV budget: its workers' determine_available_memory (vllm_omni/worker/base.py,
# 0.16-0.30; 0.14 inherits vLLM 0.14.1's) never call profile_cudagraph_memory, so graphs,
# captured after the KV cache, always need room outside the fraction: the thinker's 19
# decode sizes, the talker's MTP graphs, code2wav's 11 inner graphs (vllm_omni 0.30.0
# qwen3_tts/cuda_graph_decoder_wrapper.py compute_capture_sizes) and the sampler warm-up.
# Public logs show "took 0.31 GiB" and "took 0.96 GiB"; 2 GiB covers them.
GRAPH_RESERVE_BYTES = 2 * GiB

# --- profile run (activation peak; profile.py) -------------------------------------

# The sampler dummy run on min(max_num_seqs, max_num_batched_tokens) rows of vocabulary-sized
# logits (v1/worker/gpu_model_runner.py _dummy_sampler_run, every version 0.10.1-0.30.0; dummy
# temperature 0.5, top_p 0.9, top_k vocab-1, so top-k/top-p always runs). What coexists at its
# peak, per logit (memory/profile_run.py sampler_bytes adds the model-dtype logits themselves
# from compute_logits and their fp32 copy, v1/sample/sampler.py `logits.to(torch.float32)`, a
# no-op for an fp32 model):
# - the fast paths: the Triton top-k/top-p kernel works in place (v1/sample/ops/
#   topk_topp_triton.py, from vLLM 0.18.1, for >= 8 rows; every row count from 0.30.0), then
#   softmax probs and the exponential noise `q` (topk_topp_sampler.py forward_native and
#   random_sample), two fp32 tensors; FlashInfer's top_k_top_p_sampling_from_logits (the default
#   on CUDA from vLLM 0.22.0, envs.py VLLM_USE_FLASHINFER_SAMPLER=True) holds its masked logits
#   and probs, two fp32 tensors as well (flashinfer 0.7.4 sampling.py). Model runner V2
#   (v1/worker/gpu/model_runner.py) holds less, so this V1 figure is kept for it (an upper bound):
#   its profile_run samples hidden_states[logits_indices] of the dummy batch, min(max_num_seqs,
#   max_num_batched_tokens) rows (_dummy_run `num_reqs = min(num_tokens, self.max_num_reqs)`,
#   input_batch.py InputBatch.make_dummy `logits_indices = query_start_loc[1:] - 1`; vllm 0.22.0,
#   0.26.0, 0.30.0, 0.31.0 wheels), not every token; its dummy rows keep the SamplingStates
#   defaults (top_k = vocab, top_p = 1.0, sample/states.py), so no top-k/top-p runs, and
#   gumbel_sample keeps (rows, blocks) buffers only; the fp32 copy is unconditional in 0.22.0
#   (sample/sampler.py) and skipped in 0.30.0/0.31.0 unless a row needs processing
#   (`needs_logits_processing`, all False for dummy rows): at most 2 + 4 B a logit. V2 is the
#   default for all generate models from vLLM 0.30 (config/vllm.py use_v2_model_runner; opt-in
#   VLLM_USE_V2_MODEL_RUNNER=1 in 0.18-0.20; 0.22-0.28 only DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES,
#   non-MoE/non-quantized in 0.22). vLLM-Omni 0.30's AR and generation stages run V1
#   (vllm_omni/worker/gpu_model_runner.py OmniGPUModelRunner subclasses
#   vllm.v1.worker.gpu_model_runner.GPUModelRunner) unless a deploy file sets `model_runner: v2`
#   (only deploy/qwen3_tts*.yaml, on CUDA; vllm_omni/worker/gpu_ar_worker.py). The one V2 log
#   (accuracy entry 14, vLLM 0.31.0) prints 1.44 GiB of "peak activation", ~0.7 GiB above these
#   terms: from 0.21 that figure includes vLLM's CUDA-graph estimate (CUDAGRAPH_ESTIMATE_IN_KV_FROM).
SAMPLER_FAST_BYTES_PER_LOGIT = 8
# - the PyTorch sort path (apply_top_k_top_p_pytorch; the only path of vLLM 0.14.1-0.16.0, whose
#   FlashInfer sampler is opt-in, and of 0.10-0.12 where FlashInfer is not installed; below 8 rows
#   in 0.18.1-0.28.0): logits.sort() writes fp32 values (4) and int64 indices (8); PyTorch's stable
#   segmented sort adds int64 reverse indices (8) and CUB's alternate key/value buffers (4 + 8)
#   for >= 128 rows (aten/src/ATen/native/cuda/SortStable.cu segmented_sort_pairs), or two int2
#   index/segment arrays (16), a keys-out buffer (4) and the alternate buffers (12) below 128 rows
#   (segmented_sort_pairs_by_full_sort). The later top-k/top-p masks (1 + 4 + 1) are smaller.
SAMPLER_SORT_BYTES_PER_LOGIT = 32
SAMPLER_SORT_SMALL_BATCH_BYTES_PER_LOGIT = 44
SAMPLER_SORT_SMALL_BATCH_ROWS = 128
# The Triton kernel's per-program buffer, kept in a module cache: min(next_power_of_2(rows),
# SMs) rows of fp32 logits (topk_topp_triton.py apply_top_k_top_p_triton). 160 rows bounds
# every NVIDIA datacenter part (H100/H200 132 SMs, B200 148, A100 108): errs high.
TRITON_TOPK_FROM = (0, 18)  # 0.16.0 has no topk_topp_triton.py, 0.18.1 has it
TRITON_TOPK_ALL_ROWS_FROM = (0, 30)
TRITON_TOPK_MIN_ROWS = 8
TRITON_TOPK_BUFFER_ROWS = 160
# V1 up to 0.11 samples with FlashInfer whenever the optional flashinfer-python is installed
# (topk_topp_sampler.py: VLLM_USE_FLASHINFER_SAMPLER unset counts as on; 0.10.1.1 and 0.11.0 wheels),
# 0.12-0.21 only on opt-in (the 0.12.0 wheel); its log says which. Not stated: the sort path (high).
FLASHINFER_SAMPLER_IF_INSTALLED_UNTIL = (0, 11)
# Plain vLLM from 0.21 subtracts its own CUDA-graph estimate from the KV budget (gpu_worker.py
# determine_available_memory, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS default 1: "default since
# v0.21.0", vllm 0.28.0/0.30.0 wheels); vLLM-Omni's workers never do (GRAPH_RESERVE_BYTES above).
CUDAGRAPH_ESTIMATE_IN_KV_FROM = (0, 21)
# Workspaces first allocated by the profile run and kept: cuBLAS and cuBLASLt workspaces, which
# PyTorch takes from its caching allocator on the first GEMM of a stream (32 MiB each on Hopper),
# and small sampler caches. Estimate, high: the one Llama-3.1-8B start-up at 1024 rows on vLLM
# 0.19 (torch peak 1.89 GiB, issue 19) leaves ~0.06 GiB beyond the derived terms; 128 MiB covers it.
PROFILE_WORKSPACE_BYTES = 128 * MiB

# Rotary cos/sin tables and flash-attention softmax statistics of a vision-encoder block,
# per patch (36 rotary dims in bf16 and h x fp32 LSE at TP=1: ~144 + 64 B). Estimate, high.
ENCODER_MISC_BYTES_PER_PATCH = 200

# vLLM caps the dummy video at 14 frames (model_executor/models/qwen2_vl.py
# _MAX_FRAMES_PER_VIDEO, 0.14.1-0.30.0).
MAX_VIDEO_FRAMES = 14

# Fused-MoE activation chunking in vLLM 0.14/0.16 (vllm/envs.py VLLM_FUSED_MOE_CHUNK_SIZE
# default 16 * 1024, with VLLM_ENABLE_FUSED_MOE_ACTIVATION_CHUNKING on); from 0.18 the
# workspace spans the whole batch (model_executor/layers/fused_moe/modular_kernel.py).
FUSED_MOE_CHUNK_TOKENS = 16 * 1024

# --- defaults vLLM applies when a field is absent --------------------------------

# gpu_memory_utilization when a stage leaves it out: vllm/config/cache.py CacheConfig
# default 0.9 in the vLLM 0.14.1-0.18.1 wheels, 0.92 from 0.20.2 (0.30.0: line 103).
def default_gpu_memory_utilization(vllm: tuple[int, int]) -> float:
    return 0.92 if vllm >= (0, 20) else 0.9


# A diffusion stage's max_num_seqs when its file sets none: OmniDiffusionConfig's default
# (vllm_omni 0.30.0 diffusion/data.py:1106), not vLLM's engine default.
DIFFUSION_DEFAULT_MAX_NUM_SEQS = 1


# max_num_batched_tokens / max_num_seqs when unset: vllm/engine/arg_utils.py
# get_batch_defaults and _set_default_max_num_seqs_and_batched_tokens_args (0.30.0 wheel:
# lines 2701 and 2904; the same table in 0.14.1-0.30.0). vLLM-Omni passes the usage
# context LLM_CLASS from 0.18 (vllm_omni/engine/stage_init_utils.py) and the API-server
# context in 0.14/0.16 serving (vllm_omni/entrypoints/omni_stage.py).
def default_batch(vllm: tuple[int, int], gpu_name: str, gpu_total_bytes: int, max_model_len: int,
                  chunked_prefill: bool, max_num_seqs: int | None, max_num_batched_tokens: int | None,
                  usage: str | None = None) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) as vLLM resolves them: its defaults for the usage
    context (vllm_batch_defaults; None: a vLLM-Omni stage's, the API server's before vLLM 0.18 and
    the LLM class's from then), then the scheduler's limits."""
    if usage is None:
        usage = "api_server" if vllm < (0, 18) else "llm"
    tokens, seqs = vllm_batch_defaults(vllm, gpu_name, gpu_total_bytes, usage)
    mns = max_num_seqs if max_num_seqs is not None else seqs
    mnbt = max_num_batched_tokens
    if mnbt is None:
        mnbt = tokens
        if not chunked_prefill:
            mnbt = max(max_model_len, mnbt)
        mnbt = min(mns * max_model_len, mnbt)
    if max_num_seqs is None:
        mns = min(mns, mnbt)
    return mns, mnbt


@dataclass(frozen=True)
class OmniVersion:
    """What differs between vLLM-Omni releases, as far as memory and output go."""

    name: str
    # The vLLM release it runs on. vLLM-Omni X.Y is built against vLLM X.Y (the project's
    # release naming); this drives the vLLM-side facts below.
    vllm: tuple[int, int]
    # Output schema: "deploy" (stages:, vLLM-Omni 0.26+ per the project brief) or
    # "stage-args" (legacy stage_args). The wheels bundle deploy/*.yaml from 0.20 on.
    schema: str
    # Up to 0.20 the Qwen3-Omni talker also built the thinker's audio and vision encoders
    # and profiled a video input (wheel 0.20 qwen3_omni_moe_talker.py creates
    # self.audio_tower; wheel 0.22 does not and sets skip_mm_profiling for talker and
    # code2wav). The 0.12-0.16 talker logs "Model loading took 8.4897 GiB"
    # (https://github.com/vllm-project/vllm-omni/issues/276).
    talker_builds_encoders: bool
    # From 0.24 vLLM-Omni caps the request to free memory instead of refusing to start
    # (wheel 0.24 adds vllm_omni/worker/memory_utils.py request_memory_tolerant).
    caps_to_free_memory: bool
    # The opt-in parallel_stage_init admission check exists (wheel 0.30 adds
    # vllm_omni/engine/stage_admission.py).
    has_admission_check: bool
    # False: plain vLLM's own worker (the accuracy benchmark's start-ups), never vLLM-Omni's.
    omni_worker: bool = True

    @property
    def kv_accounting(self) -> str:
        """How the worker measures what it subtracts before sizing the KV cache (memory.py):
        "either" for 0.16-0.28, whose OmniGPUWorkerBase uses the process's NVML memory after
        profiling when NVML sees the process and the profile figures otherwise
        (vllm_omni/worker/base.py determine_available_memory); "profile" for 0.14 (vLLM
        0.14.1's worker) and 0.30 (device-level profiling)."""
        return "either" if self.omni_worker and (0, 16) <= self.vllm <= (0, 28) else "profile"

    def reads(self, schema: str) -> bool:
        """Whether this version's loader reads `schema` ("deploy" or "stage-args")."""
        return in_range(self.name, SCHEMA_VERSIONS[schema])

    @property
    def deploy_reads_engine_extras(self) -> bool:
        """A deploy stage's `engine_extras:` mapping reaches the engine from 0.24; in 0.20
        and 0.22 it is a reserved key that _parse_stage_deploy drops (0.22.0 wheel,
        vllm_omni/config/stage_config.py _STAGE_NON_ENGINE_KEYS)."""
        return self.vllm >= (0, 24)

    @property
    def legacy_worker_type(self) -> bool:
        """Legacy engine_args name the worker as `worker_type: ar|generation` (every bundled
        legacy file of 0.14-0.18) rather than a `worker_cls` path (0.12)."""
        return self.vllm >= (0, 14)

    @property
    def has_replicas(self) -> bool:
        """Per-stage replicas: `num_replicas` (deploy) and legacy `runtime.num_replicas` are
        read from 0.20 (0.20.0 wheel, vllm_omni/config/stage_config.py StageDeployConfig;
        engine/stage_init_utils.py compute_replica_layout); 0.14-0.18 have no such key."""
        return self.vllm >= (0, 20)

    @property
    def replica_template_devices(self) -> bool:
        """`devices` of a replicated stage may also be a TP-sized template of offsets, not
        only the pool of replicas x TP ids: from 0.22 (0.22.0 wheel,
        vllm_omni/engine/stage_init_utils.py split_devices_for_replicas)."""
        return self.vllm >= (0, 22)

    @property
    def replicas_without_devices(self) -> bool:
        """A stage with num_replicas > 1 and no `devices` starts (every replica on the
        launcher's visible GPUs) from 0.28; before, split_devices_for_replicas returns one
        slot and the replica loop fails with an IndexError (0.26.0 wheel,
        vllm_omni/engine/stage_init_utils.py; 0.28.0 returns [None] * num_replicas)."""
        return self.vllm >= (0, 28)

    @property
    def replica_split_wording(self) -> str:
        """How split_devices_for_replicas words a wrong device count: "tp" (0.22-0.26:
        "template, dp-independent" / tensor_parallel_size) or "per-replica" (0.28+:
        devices_per_replica). 0.20 has its own pool-only message."""
        return "tp" if self.vllm < (0, 28) else "per-replica"

    @property
    def multi_host(self) -> bool:
        """Stages on several hosts with the deploy file's connectors: from 0.26. 0.22 and
        0.24 headless stages pass async_chunk=False to get_stage_connector_spec and so
        ignore the connectors (0.24.0 wheel, vllm_omni/entrypoints/cli/serve.py
        run_headless); 0.20's single-stage mode runs no LLM replicas; 0.18 has no headless
        mode."""
        return self.vllm >= (0, 26)

    @property
    def snapshot_after_nccl(self) -> bool:
        """From vLLM 0.11 the start-up snapshot is taken after NCCL init
        (https://github.com/vllm-project/vllm/pull/25359; vllm 0.14.1-0.30.0 wheels,
        vllm/v1/worker/gpu_worker.py init_device)."""
        return self.vllm >= (0, 11)


def version_key(name: str) -> tuple[int, int]:
    major, minor = (int(p) for p in name.split(".")[:2])
    return major, minor


def range_text(versions: str) -> str:
    """A version range in words: "0.14 to 0.24", "0.26 and later", "0.30"."""
    low, sep, high = versions.partition("-")
    return f"{low} to {high}" if high else (f"{low} and later" if sep else low)


def in_range(name: str, versions: str) -> bool:
    """Whether version `name` ("0.24") lies in `versions` ("0.14-0.30", "0.20-", "0.12")."""
    low, sep, high = versions.partition("-")
    key = version_key(name)
    if not sep:
        return key == version_key(low)
    return version_key(low) <= key and (not high or key <= version_key(high))


# Which vLLM-Omni versions read which schema (read from the vllm-omni wheels on PyPI):
# - legacy `stage_args`: read through 0.26 (0.26.0 wheel, vllm_omni/entrypoints/utils.py
#   load_stage_configs_from_yaml); from 0.28 load_deploy_config raises "Deploy config ...
#   uses the removed `stage_args` schema" (0.28.0 wheel, vllm_omni/config/stage_config.py
#   load_deploy_config) and --stage-configs-path is gone from `vllm serve --omni`.
# - deploy `stages:`: from 0.20 (0.20.0 wheel adds vllm_omni/deploy/ and
#   stage_config.py load_deploy_config with --deploy-config).
SCHEMA_VERSIONS = {"stage-args": "0.12-0.26", "deploy": "0.20-"}


def _v(name: str, **kw) -> "OmniVersion":
    major, minor = version_key(name)
    schema = "deploy" if (major, minor) >= (0, 26) else "stage-args"
    return OmniVersion(name=name, vllm=(major, minor), schema=schema, **kw)


OMNI_VERSIONS: dict[str, OmniVersion] = {
    v.name: v
    for v in (
        _v("0.12", talker_builds_encoders=True, caps_to_free_memory=False, has_admission_check=False),
        _v("0.14", talker_builds_encoders=True, caps_to_free_memory=False, has_admission_check=False),
        _v("0.16", talker_builds_encoders=True, caps_to_free_memory=False, has_admission_check=False),
        _v("0.18", talker_builds_encoders=True, caps_to_free_memory=False, has_admission_check=False),
        _v("0.20", talker_builds_encoders=True, caps_to_free_memory=False, has_admission_check=False),
        _v("0.22", talker_builds_encoders=False, caps_to_free_memory=False, has_admission_check=False),
        _v("0.24", talker_builds_encoders=False, caps_to_free_memory=True, has_admission_check=False),
        _v("0.26", talker_builds_encoders=False, caps_to_free_memory=True, has_admission_check=False),
        _v("0.28", talker_builds_encoders=False, caps_to_free_memory=True, has_admission_check=False),
        _v("0.30", talker_builds_encoders=False, caps_to_free_memory=True, has_admission_check=True),
    )
}
NEWEST_OMNI_VERSION = "0.30"


def omni_version(name: str) -> OmniVersion:
    """Look up a known vLLM-Omni version: a release X.Y ("0.30", "v0.30"), or one of its
    patch releases ("0.30.7", "v0.30.0", "0.30.0rc1", "0.30.2.post1", PEP 440's forms), which
    plans as X.Y on purpose: the facts here are kept per X.Y, read from the X.Y wheels, and a
    patch release is taken to keep them (docs/versions.md; the request records the version
    given). Anything else ("0.30.x", "0.30.7.1.2") is refused, not cut to X.Y."""
    import re

    found = re.fullmatch(r"[vV]?(\d+)\.(\d+)(?:\.\d+(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?)?", name.strip())
    key = f"{found.group(1)}.{found.group(2)}" if found else None
    if key not in OMNI_VERSIONS:
        from ..errors import InputError

        what = "unknown vLLM-Omni version" if found else "not a vLLM-Omni version (X.Y or X.Y.Z)"
        raise InputError(f"{what} {name!r}; known: {', '.join(OMNI_VERSIONS)} (a patch release X.Y.Z plans as X.Y)")
    return OMNI_VERSIONS[key]


# The last vLLM whose "GPU KV cache size: N tokens" is num_blocks // len(kv_cache_groups) x block_size
# (vllm 0.10.1.1-0.19.0 v1/core/kv_cache_utils.py: 0.13.0 _report_kv_cache_config, 0.19.0 likewise);
# from 0.20 (0.20.2 kv_cache_utils.py) it prints int(max_concurrency x max_model_len) instead.
POOL_TOKENS_PRINTED_UNTIL = (0, 19)


# vLLM's own max_num_batched_tokens / max_num_seqs defaults, per usage context and GPU (vllm/engine/
# arg_utils.py EngineArgs.get_batch_defaults; read in the 0.10.1.1, 0.11.0, 0.13.0, 0.14.1, 0.16.0, 0.18.1,
# 0.20.2, 0.22.0, 0.24.0, 0.26.0, 0.28.0, 0.30.0 and 0.31.0 wheels, the same table in each but for the
# >= 160 GiB tier that 0.28.0 adds): device total >= 160 GiB (0.28+): 16384 / 1024 for both; >= 70 GiB
# and "a100" not in the device name: LLM class 16384 / 1024, API server 8192 / 1024; otherwise LLM class
# 8192 / 256, API server 2048 / 256. V1 entries older than 0.10.1.1 take that table too (not read).
VLLM_BATCH_DEFAULTS = {  # tier -> usage context -> (max_num_batched_tokens, max_num_seqs)
    "160": {"llm": (16384, 1024), "api_server": (16384, 1024)},
    "70": {"llm": (16384, 1024), "api_server": (8192, 1024)},
    "other": {"llm": (8192, 256), "api_server": (2048, 256)},
}
LARGE_TIER_FROM = (0, 28)


def vllm_batch_defaults(vllm: tuple[int, int], gpu_name: str, total: int, usage: str | None) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) plain vLLM defaults to (VLLM_BATCH_DEFAULTS); usage None:
    the LLM class's, the larger batch (a larger profile peak, less KV predicted: errs pessimistic)."""
    gib = total / GiB
    if gib >= 160 and vllm >= LARGE_TIER_FROM:
        tier = "160"
    elif gib >= 70 and "a100" not in gpu_name.lower():
        tier = "70"
    else:
        tier = "other"
    return VLLM_BATCH_DEFAULTS[tier][usage or "llm"]


# `--dtype` / a stage's `dtype`: the names vLLM accepts and the torch dtype each loads the model in
# (vllm 0.30.0 wheel, vllm/config/model.py _STR_DTYPE_TO_TORCH_DTYPE; the same table from 0.10);
# "auto" keeps the checkpoint's own dtype (float32 checkpoints load as bfloat16).
VLLM_DTYPES = {"auto": None, "half": "float16", "float16": "float16", "float": "float32", "float32": "float32",
               "bfloat16": "bfloat16"}


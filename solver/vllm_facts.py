"""Every constant that models vLLM / vLLM-Omni behaviour, in one place.

Each constant names its source and the version range it holds for. Sources:
- memory-facts: ../shared/reference/memory-facts.md (vLLM 0.8.5-0.33, vLLM-Omni 0.12-0.30)
- calibration: ../shared/reference/calibration-logs.jsonl (public start-up logs)
- wheel X: the vllm-omni X wheel from PyPI, read file by file (no import)

Version-dependent behaviour is a property of `OmniVersion`, selected by `--omni-version`.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30
MiB = 1 << 20

# --- start-up and budget -----------------------------------------------------------

# KV cache block size in tokens; vLLM allocates whole blocks. (memory-facts §2, §5; vLLM 0.8-0.33)
BLOCK_SIZE_TOKENS = 16

# CUDA context + cuBLAS handles of one process on one GPU, outside the fraction because
# the snapshot is taken after they exist. memory-facts §2 gives ~0.3-0.6 GiB; we take the
# high end so a plan never counts on the lucky case. (vLLM 0.9-0.33)
CUDA_CONTEXT_BYTES = 600 * MiB

# NCCL communicator buffers of one TP rank, outside the fraction from vLLM 0.11 (snapshot
# after NCCL init, memory-facts §2: "more with NCCL when TP > 1"). No public figure in the
# references: an estimate, to be replaced by the calibration issue.
NCCL_BYTES_PER_RANK = 256 * MiB

# Non-torch memory that grows after the snapshot and so counts inside the fraction:
# calibration logs print non_torch_memory=0.35 GiB (RTX 3090, TP=1) and 0.25 GiB
# (RTX 4090, TP=2). We take 0.40 GiB, above both. (vLLM 0.6-0.20 log format)
NON_TORCH_BYTES = 410 * MiB

# vLLM-Omni admission rule (wheel 0.30, vllm_omni/engine/stage_admission.py):
# _DEFAULT_EXTERNAL_RESERVE_BYTES and _DEFAULT_SAFETY_MARGIN_BYTES, 1 GiB each, per device.
ADMISSION_EXTERNAL_RESERVE_BYTES = 1 * GiB
ADMISSION_SAFETY_MARGIN_BYTES = 1 * GiB

# Graph memory outside the fraction, per stage with CUDA graphs (0 when enforce_eager).
# vLLM-Omni 0.30 admission reserves _DEFAULT_GRAPH_RESERVE_BYTES = 2 GiB per such stage
# (stage_admission.py). We use it for every version: up to vLLM 0.20 graphs are captured
# after KV allocation, outside the fraction; from 0.21 the pool is inside but graphs a
# model captures for itself (Qwen3-Omni talker MTP) still need free memory on top
# (memory-facts §3).
GRAPH_RESERVE_BYTES = 2 * GiB

# The CUDA-graph pool vLLM >= 0.21 estimates and subtracts from the budget before KV
# allocation (memory-facts §3). Public logs show "took 0.31 GiB", "took 0.96 GiB" and
# "Estimated CUDA graph memory: 1.10 GiB total"; we take the largest, 1.10 GiB.
GRAPH_POOL_ESTIMATE_BYTES = int(1.10 * GiB)

# --- profile run (activation peak) ------------------------------------------------

# vLLM V1 samples fp32 logits of [min(max_num_seqs, tokens), vocab] in the profile run
# (memory-facts §7). 4 bytes per logit.
SAMPLER_LOGIT_BYTES = 4

# Copies of the hidden state alive at the peak of one decoder layer besides the MLP
# intermediates (residual, normed input). Fitted to the Llama-3.1-8B logs in calibration
# (peak_torch - weights = 2.07 GiB at 20,000 tokens, 2.99 GiB at 29,000 tokens): with 2
# copies the model is 7-10% above both (conservative). (vLLM 0.6.4-0.6.6 log format)
ACTIVATION_HIDDEN_COPIES = 2

# Fused-MoE kernels process at most this many tokens at once, so MoE intermediates stop
# growing past it. vllm/envs.py VLLM_FUSED_MOE_CHUNK_SIZE default 16 * 1024.
FUSED_MOE_CHUNK_TOKENS = 16 * 1024

# --- defaults vLLM applies when a field is absent --------------------------------

# StageDeployConfig / EngineArgs default (vLLM V1): max_num_batched_tokens 32768 for the
# bundled omni configs ("every stage here uses vLLM's default max_num_batched_tokens=32768",
# vllm-omni-0.30/deploy/qwen2_5_omni.yaml header).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 32768
# vLLM's default gpu_memory_utilization when a config leaves it out: 0.9 (vLLM <= 0.11),
# 0.92 (vLLM 0.33) (memory-facts §2). Where it changed in between is not in the references;
# versions before 0.33 use 0.9.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_GPU_MEMORY_UTILIZATION_033 = 0.92
# vLLM V1 EngineArgs default max_num_seqs on GPUs (vLLM 0.8-0.33).
DEFAULT_MAX_NUM_SEQS = 256


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
    # code2wav). memory-facts §6 logs 8.49 GiB for the talker on 0.12-0.16.
    talker_builds_encoders: bool
    # From 0.24 vLLM-Omni caps the request to free memory instead of refusing to start
    # (wheel 0.24 adds vllm_omni/worker/memory_utils.py request_memory_tolerant).
    caps_to_free_memory: bool
    # The opt-in parallel_stage_init admission check exists (wheel 0.30 adds
    # vllm_omni/engine/stage_admission.py).
    has_admission_check: bool

    @property
    def graphs_inside_budget(self) -> bool:
        """vLLM >= 0.21 estimates the CUDA-graph pool inside the fraction (memory-facts §3)."""
        return self.vllm >= (0, 21)

    @property
    def snapshot_after_nccl(self) -> bool:
        """From vLLM 0.11 the start-up snapshot is taken after NCCL init (memory-facts §2)."""
        return self.vllm >= (0, 11)


def _v(name: str, **kw) -> OmniVersion:
    major, minor = (int(p) for p in name.split("."))
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
    """Look up a known vLLM-Omni version ("0.30", "v0.30.0" and "0.30.1" all mean 0.30)."""
    key = name.strip().lstrip("vV")
    parts = key.split(".")
    if len(parts) >= 2:
        key = f"{parts[0]}.{parts[1]}"
    if key not in OMNI_VERSIONS:
        from .errors import InputError

        raise InputError(
            f"unknown vLLM-Omni version {name!r}; known: {', '.join(OMNI_VERSIONS)}"
        )
    return OMNI_VERSIONS[key]

"""The GPUs of this machine, read through NVML (`--gpus local`).

NVML reports the nvidia-smi total, which is larger than what CUDA reports (and what vLLM
multiplies by gpu_memory_utilization): CUDA total = nvidia-smi total - driver reserve.
So a GPU NVML names is planned with the catalog's CUDA figure; an unknown part, or one
whose memory disagrees with the catalog (a public nvidia-smi log shows an "H800" with
143771 MiB; see the H800 entry of data/gpus.yaml), with
the NVML total less the largest driver reserve seen on NVIDIA parts.

Fails with NvmlUnavailable (one line, exit 2) when there is no driver or no GPU.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import InputError, NvmlUnavailable
from ..vllm.facts import GiB
from .gpus import Gpu, lookup_gpu

# nvidia-smi total - CUDA total over the catalog's pairs (data/gpus.yaml: H100 81559 MiB vs 79.11
# GiB, 0.54 GiB; A100-40GB 40960 MiB vs 39.38-39.50 GiB, 0.50-0.62 GiB): 0.75 GiB errs on the low side.
NVML_TO_CUDA_RESERVE_BYTES = int(0.75 * GiB)
# A catalog figure is trusted while NVML's total exceeds it by at most this much.
CATALOG_MATCH_SLACK_BYTES = 2 * GiB


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _visible(count: int) -> list[int]:
    """Physical indices in CUDA order: CUDA_VISIBLE_DEVICES when it lists indices."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None or not env.strip():
        return list(range(count))
    try:
        indices = [int(p) for p in env.split(",") if p.strip()]
    except ValueError:
        raise InputError(f"CUDA_VISIBLE_DEVICES={env!r} uses UUIDs; list the GPUs with --gpus instead") from None
    bad = [i for i in indices if not 0 <= i < count]
    if bad:
        raise InputError(f"CUDA_VISIBLE_DEVICES names GPU(s) {bad}, but NVML sees {count}")
    return indices


def read_local_gpus(nvml: Any = None) -> list[Gpu]:
    """The visible GPUs, as the same `Gpu` records the catalog produces."""
    if nvml is None:
        try:
            import pynvml as nvml  # nvidia-ml-py
        except ImportError as exc:  # pragma: no cover - it is a dependency
            raise NvmlUnavailable(f"the NVML bindings are not installed ({exc})") from None
    try:
        nvml.nvmlInit()
    except Exception as exc:
        raise NvmlUnavailable(
            f"cannot read local GPUs: NVML is unavailable ({exc}); name them instead, e.g. --gpus 2xH100-80GB"
        ) from None
    try:
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            raise NvmlUnavailable("NVML sees no GPU on this machine; name them instead, e.g. --gpus 2xH100-80GB")
        gpus = []
        for physical in _visible(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(physical)
            name = _text(nvml.nvmlDeviceGetName(handle))
            nvml_total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
            gpus.append(_as_gpu(len(gpus), name, nvml_total))
        return gpus
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _as_gpu(index: int, name: str, nvml_total: int) -> Gpu:
    fallback = Gpu(index=index, name=name, total_bytes=nvml_total - NVML_TO_CUDA_RESERVE_BYTES)
    try:
        spec = lookup_gpu(name)
    except InputError:
        return fallback
    if not spec.capacity_bytes <= nvml_total <= spec.capacity_bytes + CATALOG_MATCH_SLACK_BYTES:
        return fallback
    return Gpu(index=index, name=spec.name, total_bytes=spec.capacity_bytes)

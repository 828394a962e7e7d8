"""Reading vLLM / vLLM-Omni start-up logs: the figures each stage printed.

Formats (vLLM 0.14.1-0.31 and earlier V0; line numbers in the vLLM 0.30.0 wheel):
  Model loading took X GiB [memory] and S seconds        gpu_model_runner.py:5417 (V0: "Loading model weights took X GB")
  Available KV cache memory: X GiB [(process-scoped)...]  gpu_worker.py:641, vllm_omni worker/base.py
  GPU KV cache size: N tokens[, Maximum concurrency ...]  kv_cache_utils.py:2396 (two lines before 0.28)
  Maximum concurrency for L tokens per request: Cx
  Free memory on device (F/T GiB) on startup. Desired GPU memory utilization is (u, R GiB).
    Actual usage is W GiB for weight, A GiB for peak activation, N GiB for non-torch memory,
    and G GiB for CUDAGraph memory.                      gpu_worker.py:836 (0.26; INFO from 0.26)
    (0.28+: "C GiB for consumed memory (weights + non-torch), A GiB for peak activation, and G GiB for CUDAGraph memory")
  Graph capturing finished in S secs, took G GiB          gpu_model_runner.py:6930
  V0: Memory profiling results: total_gpu_memory=T initial_memory_usage=... peak_torch_memory=P
      non_torch_memory=N kv_cache_size=K gpu_memory_utilization=u

A line is tied to a stage by its tag ("[Stage-N]" in vLLM-Omni 0.14/0.16,
"StageEngineCoreProc_stageN_replicaR" from 0.22); untagged worker lines (0.18+) follow the
order of start-up: each "Model loading took" after a stage's KV lines begins the next
stage. Lines that match no format are counted, never fatal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_NUM = r"(-?[\d,]+(?:\.\d+)?)"
_PATTERNS = {
    "model_loading_gib": re.compile(r"(?:Model loading took|Loading model weights took) " + _NUM + r" G"),
    "available_kv_gib": re.compile(r"Available KV cache memory: " + _NUM + r" GiB"),
    "kv_cache_tokens": re.compile(r"KV cache size: " + _NUM + r" tokens"),
    "max_concurrency": re.compile(r"Maximum concurrency for " + _NUM + r" tokens per request: " + _NUM + r"x"),
    "summary": re.compile(r"Free memory on device \(" + _NUM + r"/" + _NUM + r" GiB\) on startup\. Desired GPU memory "
                          r"utilization is \(" + _NUM + r", " + _NUM + r" GiB\)\. Actual usage is (.*)"),
    "graph_gib": re.compile(r"Graph capturing finished in " + _NUM + r" secs, took " + _NUM + r" GiB"),
    "v0": re.compile(r"Memory profiling results: total_gpu_memory=" + _NUM + r"GiB .*peak_torch_memory=" + _NUM
                     + r"GiB .*non_torch_memory=" + _NUM + r"GiB kv_cache_size=" + _NUM + r"GiB gpu_memory_utilization="
                     + _NUM),
}
_STAGE_TAGS = (re.compile(r"\[Stage-(\d+)\]"), re.compile(r"StageEngineCoreProc_stage(\d+)_replica\d+"))


def _f(text: str) -> float:
    return float(text.replace(",", ""))


@dataclass
class StageFigures:
    """What one stage printed (None: not in the log). Byte figures in GiB as printed."""

    stage: int
    model_loading_gib: float | None = None
    available_kv_gib: float | None = None
    kv_cache_tokens: int | None = None
    max_model_len: int | None = None
    max_concurrency: float | None = None
    total_gib: float | None = None
    utilization: float | None = None
    requested_gib: float | None = None
    weights_gib: float | None = None  # from the summary line (0.26) or the loading line
    consumed_gib: float | None = None  # 0.28+: weights + non-torch
    activation_gib: float | None = None
    non_torch_gib: float | None = None
    graph_gib: float | None = None
    lines: list[int] = field(default_factory=list)


@dataclass
class ParsedLog:
    stages: dict[int, StageFigures]
    lines_read: int
    lines_used: int

    @property
    def lines_unparsed(self) -> int:
        return self.lines_read - self.lines_used


def parse_log(text: str) -> ParsedLog:
    stages: dict[int, StageFigures] = {}
    current = 0
    seen_kv = False
    used = 0
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        tagged = None
        for tag in _STAGE_TAGS:
            m = tag.search(line)
            if m:
                tagged = int(m.group(1))
        hits = {k: p.search(line) for k, p in _PATTERNS.items()}
        hits = {k: m for k, m in hits.items() if m}
        if not hits:
            continue
        if tagged is not None:
            stage = tagged
        else:
            if "model_loading_gib" in hits and seen_kv:  # an untagged new process: the next stage
                current += 1
                seen_kv = False
            stage = current
        fig = stages.setdefault(stage, StageFigures(stage))
        _record(fig, hits)
        if "available_kv_gib" in hits or "kv_cache_tokens" in hits:
            seen_kv = True
        fig.lines.append(n)
        used += 1
    return ParsedLog(stages, len(lines), used)


def _record(fig: StageFigures, hits: dict) -> None:
    if "model_loading_gib" in hits:
        fig.model_loading_gib = _f(hits["model_loading_gib"].group(1))
    if "available_kv_gib" in hits:
        value = _f(hits["available_kv_gib"].group(1))
        # ranks print their own figure: the smallest one is what the stage holds
        fig.available_kv_gib = value if fig.available_kv_gib is None else min(fig.available_kv_gib, value)
    if "kv_cache_tokens" in hits:
        tokens = int(_f(hits["kv_cache_tokens"].group(1)))
        fig.kv_cache_tokens = tokens if fig.kv_cache_tokens is None else min(fig.kv_cache_tokens, tokens)
    if "max_concurrency" in hits:
        m = hits["max_concurrency"]
        fig.max_model_len, fig.max_concurrency = int(_f(m.group(1))), _f(m.group(2))
    if "summary" in hits:
        m = hits["summary"]
        fig.total_gib, fig.utilization, fig.requested_gib = _f(m.group(2)), _f(m.group(3)), _f(m.group(4))
        rest = m.group(5)
        for key, pattern in (("weights_gib", r"([\d.]+) GiB for weight"),
                             ("consumed_gib", r"([\d.]+) GiB for consumed memory"),
                             ("activation_gib", r"([\d.]+) GiB for peak activation"),
                             ("non_torch_gib", r"([\d.]+) GiB for non-torch"),
                             ("graph_gib", r"([\d.]+) GiB for CUDAGraph")):
            found = re.search(pattern, rest)
            if found:
                setattr(fig, key, float(found.group(1)))
    if "graph_gib" in hits:
        fig.graph_gib = _f(hits["graph_gib"].group(2))
    if "v0" in hits:
        m = hits["v0"]
        fig.total_gib, fig.utilization = _f(m.group(1)), _f(m.group(5))
        fig.non_torch_gib, fig.available_kv_gib = _f(m.group(3)), _f(m.group(4))
        fig.requested_gib = fig.total_gib * fig.utilization
        if fig.model_loading_gib is not None:
            fig.activation_gib = _f(m.group(2)) - fig.model_loading_gib


# The settings a start-up log states (for `bench entry`): vLLM's "non-default args: {...}"
# (arg_utils, 0.10+), the engine line "Initializing a V1 LLM engine (vX) with config: ..."
# (V0: "Initializing an LLM engine (vX) ..."), the API server's version line or banner, and
# "Chunked prefill is enabled with max_num_batched_tokens=N". Later lines win; a setting no
# line states is left out (unknown).
_ARG_KEYS = ("model", "max_model_len", "tensor_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization",
             "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype", "enforce_eager", "quantization", "dtype")
_ENGINE = re.compile(r"Initializing an? (V1 )?LLM engine \(v([^)]+)\) with config: (.*)")
_ENGINE_KEYS = {"model": "model", "dtype": "dtype", "max_seq_len": "max_model_len",
                "tensor_parallel_size": "tensor_parallel_size", "pipeline_parallel_size": "pipeline_parallel_size",
                "quantization": "quantization", "enforce_eager": "enforce_eager", "kv_cache_dtype": "kv_cache_dtype"}
_VERSION = (re.compile(r"vLLM API server version (\d+\.\d+[\w.+]*)"), re.compile(r"█\s+version (\d+\.\d+[\w.+]*)"))
_CHUNKED = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)")
# vLLM's CUDA-graph memory estimate (v1/worker/gpu_model_runner.py profile_cudagraph_memory, 0.19+),
# which plain vLLM subtracts from the KV budget from 0.21 (vllm.facts.CUDAGRAPH_ESTIMATE_IN_KV_FROM)
CUDAGRAPH_ESTIMATE = re.compile(r"Estimated CUDA graph memory: (\d+(?:\.\d+)?) GiB")
CUDAGRAPH_APPLIED = re.compile(r"CUDA graph memory profiling is enabled")
CUDAGRAPH_UTIL = re.compile(r"--gpu-memory-utilization=(\d+(?:\.\d+)?) is equivalent to --gpu-memory-utilization="
                            r"(\d+(?:\.\d+)?)")
# Which top-k/top-p sampler V1 chose (vllm 0.10.1.1-0.12.0 v1/sample/ops/topk_topp_sampler.py): "flashinfer"
# or "pytorch"; the profile run's sampler peak depends on it (memory/profile_run.py sampler_bytes).
SAMPLER_LINES = ((re.compile(r"Using FlashInfer for top-p & top-k sampling"), "flashinfer"),
                 (re.compile(r"Falling back to the PyTorch-native implementation of top-p & top-k"), "pytorch"))


def _value(text: str):
    text = text.strip().strip("'\"")
    if text in ("None", "null"):
        return None
    if text in ("True", "False"):
        return text == "True"
    if text.startswith("torch."):
        text = text[len("torch."):]
    try:
        return int(text) if re.fullmatch(r"-?\d+", text) else float(text) if re.fullmatch(r"-?\d+\.\d*", text) else text
    except ValueError:
        return text


def parse_settings(text: str) -> tuple[dict, list[int]]:
    """(entry fields the log states, the numbers of the lines they come from)."""
    found: dict = {}
    used: list[int] = []
    for n, line in enumerate(text.splitlines(), 1):
        hit = False
        if "non-default args:" in line:
            for key, raw in re.findall(r"'(\w+)': ('[^']*'|[^,{}\[\]]+)", line.split("non-default args:", 1)[1]):
                if key in _ARG_KEYS:
                    found[key], hit = _value(raw), True
        m = _ENGINE.search(line)
        if m:
            found["engine"] = "V1" if m.group(1) else "V0"
            found["vllm_version"] = m.group(2)
            for key, raw in re.findall(r"(\w+)=('[^']*'|[^,]+)", m.group(3)):
                if key in _ENGINE_KEYS:
                    found[_ENGINE_KEYS[key]] = _value(raw)
            hit = True
        for pattern in _VERSION:
            v = pattern.search(line)
            if v:
                found["vllm_version"], hit = v.group(1), True
        c = _CHUNKED.search(line)
        if c:
            found["max_num_batched_tokens"], hit = int(c.group(1)), True
        for pattern, sampler in SAMPLER_LINES:
            if pattern.search(line):
                found["sampler"], hit = sampler, True
        g = CUDAGRAPH_ESTIMATE.search(line)
        if g:
            found["cudagraph_estimate_gib"], hit = float(g.group(1)), True
        if hit:
            used.append(n)
    return found, used

"""Profile entries from `vllm bench serve --omni --save-result` JSON files.

The format, read from vLLM-Omni 0.30.0's wheel: vLLM's `main_async` (vllm/benchmarks/serve.py)
writes `date`, `backend`, `model_id`, `num_prompts`, `request_rate` ("inf" or a number),
`burstiness`, `max_concurrency`, then merges the benchmark's result, which vLLM-Omni's
`benchmark` (vllm_omni/benchmarks/patch/patch.py) builds: `completed`, `failed`,
`request_throughput`, `total_input_tokens`, `total_output_tokens`, `total_audio_duration_s`,
`audio_throughput` (names from vllm_omni/benchmarks/metrics/definitions.py), the
`mean_/median_/pNN_` statistics of each selected percentile metric (`audio_ttfp_ms`,
`audio_rtf` without a unit, `e2el_ms`, ...), `stage_durations_mean/p50/p99` (pipeline
profiler timings) and, per request, `request_stage_metrics` (per stage `num_tokens_out`,
`audio_frames`, `audio_duration_s`). The per-stage throughput `--print-stage` prints is not
saved (StageBenchmarkMetrics is "for printing only"), so a stage-level entry comes from a run
the user names as one stage's (`--stage`): the other stages given spare replicas.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from .perf_profile import PIPELINE_UNIT, Entry, Layout, Point, Profile, Source, StagePlacement, Workload
from .yamlio import parse_json, read_text


def _number(data: dict, key: str) -> float | None:
    value = data.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def read_result(path: str | Path) -> dict:
    """One result file, checked to be vLLM-Omni's; InputError (one line) otherwise."""
    where = str(path)
    data = parse_json(read_text(path), where)
    if not isinstance(data, dict):
        raise InputError(f"{where}: not a `vllm bench serve --save-result` file (expected a JSON object)")
    for key in ("request_throughput", "completed", "model_id"):
        if key not in data:
            raise InputError(f"{where}: not a `vllm bench serve --save-result` file (no {key})")
    if "audio_throughput" not in data:
        raise InputError(f"{where}: not a vLLM-Omni (`vllm bench serve --omni`) result: no audio_throughput")
    if _number(data, "request_throughput") is None or not isinstance(data.get("completed"), int):
        raise InputError(f"{where}: request_throughput and completed must be numbers")
    if data["completed"] < 1 or data["request_throughput"] <= 0:
        raise InputError(f"{where}: no request completed; nothing to import")
    return data


def _stage_means(data: dict, field: str) -> dict[str, float]:
    """Per stage key, the mean of a request_stage_metrics field over the requests that have it."""
    sums: dict[str, list[float]] = {}
    for per_request in data.get("request_stage_metrics") or []:
        if not isinstance(per_request, dict):
            continue
        for stage, metrics in per_request.items():
            if isinstance(metrics, dict) and _number(metrics, field) is not None:
                sums.setdefault(str(stage), []).append(float(metrics[field]))
    return {stage: sum(v) / len(v) for stage, v in sorted(sums.items())}


def point_of(data: dict) -> Point:
    rate = data.get("request_rate")
    audio = _number(data, "audio_throughput")
    return Point(
        concurrency=data.get("max_concurrency") if isinstance(data.get("max_concurrency"), int) else None,
        offered_rate=float(rate) if isinstance(rate, (int, float)) and rate > 0 else None,
        requests_per_s=float(data["request_throughput"]),
        audio_seconds_per_s=audio if audio else None,
        ttfp_p50_ms=_number(data, "median_audio_ttfp_ms"),
        ttfp_p99_ms=_number(data, "p99_audio_ttfp_ms"),
        ttfp_mean_ms=_number(data, "mean_audio_ttfp_ms"),
        rtf_p50=_number(data, "median_audio_rtf"),
        rtf_mean=_number(data, "mean_audio_rtf"),
    )


def workload_of(results: list[dict], dataset: str) -> Workload:
    """Means over the files; per-stage statistics (request_stage_metrics) where the totals lack them."""
    n = sum(d["completed"] for d in results)

    def mean_total(key: str) -> float | None:
        values = [_number(d, key) for d in results]
        return round(sum(values) / n, 3) if all(v is not None for v in values) and sum(values) > 0 else None

    out_tokens = mean_total("total_output_tokens")
    audio = mean_total("total_audio_duration_s")
    stages_tokens = [_stage_means(d, "num_tokens_out") for d in results]
    stages_audio = [_stage_means(d, "audio_duration_s") for d in results]
    if out_tokens is None and all(stages_tokens):  # a speech endpoint: the first stage's tokens
        first = sorted(stages_tokens[0])[0]
        out_tokens = round(sum(s.get(first, 0.0) for s in stages_tokens) / len(stages_tokens), 3)
    if audio is None and all(stages_audio):  # the last stage's audio
        last = sorted(stages_audio[0])[-1]
        audio = round(sum(s.get(last, 0.0) for s in stages_audio) / len(stages_audio), 3) or None
    return Workload(dataset=dataset, input_tokens=mean_total("total_input_tokens"), output_tokens=out_tokens,
                    audio_seconds_per_request=audio)


def build_entry(paths: list[str], results: list[dict], *, pipeline: str, stages: list[str], gpu: str,
                unit: str = PIPELINE_UNIT, tp: int = 1, max_num_seqs: int | None = None,
                devices: dict[str, tuple[int, ...]] | None = None, replicas: dict[str, int] | None = None,
                omni_version: str = "unknown", dataset: str = "unknown") -> Entry:
    """One entry from the result files of one sweep (one unit, layout and workload)."""
    devices = devices or {}
    replicas = replicas or {}
    placed = {s: StagePlacement(replicas=replicas.get(s, 1), devices=devices.get(s, (0,)),
                                tp=tp if s == unit else 1) for s in stages}
    layout = Layout(gpus=len({d for p in placed.values() for d in p.devices}), stages=placed)
    first = results[0]
    backend = first.get("backend") or first.get("endpoint_type") or "?"
    sweep = sorted({str(d.get("max_concurrency")) for d in results})
    command = (f"vllm bench serve --omni --backend {backend} --model {first['model_id']} "
               f"--max-concurrency {'|'.join(sweep)} --save-result")
    dates = sorted(str(d.get("date", "")) for d in results)
    labels = ("measured", "end-to-end" if unit == PIPELINE_UNIT else "stage-level", "workload-specific")
    points = sorted((point_of(d) for d in results), key=lambda p: (p.concurrency or 0, p.offered_rate or 0))
    return Entry(pipeline=pipeline, unit=unit, gpu=gpu, tp=tp, max_num_seqs=max_num_seqs, layout=layout,
                 workload=workload_of(results, dataset), points=tuple(points), labels=labels,
                 source=Source(command=command, omni_version=omni_version, date=dates[-1] or "unknown",
                               note="imported by omni-autoconf profile import from "
                                    + ", ".join(Path(p).name for p in paths)))


def profile_of(entries: list[Entry], description: str) -> Profile:
    return Profile(description=description, entries=tuple(entries))

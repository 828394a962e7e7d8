"""Performance profiles: measured request rates of a pipeline or a stage, for --target-rate.

A profile is a YAML file (docs/rate-planning.md) of entries. An entry is one unit (the
whole pipeline as it was laid out, or one stage's replica) on one GPU type, TP degree,
max_num_seqs, layout and workload, with the operating points a benchmark sweep measured:
at each, the rate it sustained and the latencies it had. The highest sustainable rate at a
latency target is the largest rate among the points that meet it. Every entry names its
source (command, vLLM-Omni version, date, URL or commit). Nothing here plans: the planner
(planning/rate.py) reads `capacity`.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..errors import InputError
from .yamlio import parse_mapping, read_text

PIPELINE_UNIT = "pipeline"  # Entry.unit for the whole pipeline measured as one unit
LABELS = ("measured", "derived", "end-to-end", "stage-level", "workload-specific", "illustrative")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Strict):
    """Where an entry's figures come from."""

    command: str = Field(description="The benchmark command (or test file) that produced the figures.")
    omni_version: str = Field(description="The vLLM-Omni version served, X.Y or X.Y.Z, or 'unknown'.")
    date: str = Field(description="When it was measured or read (ISO date, or the benchmark's YYYYMMDD-HHMMSS).")
    url: str | None = Field(None, description="A public URL of the figures, or null.")
    commit: str | None = Field(None, description="The commit of the repository that holds them, or null.")
    note: str | None = Field(None, description="How the figures were read or derived, in words.")

    @model_validator(mode="after")
    def _where(self) -> Source:
        if not self.url and not self.commit and not self.note:
            raise ValueError("a source needs a url, a commit or a note")
        return self


class StagePlacement(_Strict):
    """One stage in the measured layout."""

    replicas: int = Field(1, ge=1, le=1024, description="num_replicas of the stage in the measured layout.")
    devices: tuple[int, ...] = Field(description="The GPU indices the stage's replicas used (its pool).")
    tp: int = Field(1, ge=1, le=64, description="tensor_parallel_size of each replica.")


class Layout(_Strict):
    """How the unit was laid out when measured."""

    gpus: int = Field(ge=1, le=1024, description="GPUs the unit used.")
    stages: dict[str, StagePlacement] = Field(description="Stage name -> its placement in the measured layout.")

    @property
    def shares_gpus(self) -> bool:
        """Whether two stages ran on one GPU in the measured layout."""
        held = [d for p in self.stages.values() for d in set(p.devices)]
        return len(held) != len(set(held))


class Workload(_Strict):
    """The requests the figures hold for; other requests are extrapolation."""

    dataset: str = Field(description="The benchmark's dataset (e.g. seed-tts, random).")
    task: str | None = Field(None, description="The task or voice mode (e.g. voice_clone), or null.")
    input_tokens: float | None = Field(None, ge=0, description="Mean input tokens per request, or null.")
    output_tokens: float | None = Field(None, ge=0, description="Mean output text tokens per request, or null.")
    audio_seconds_per_request: float | None = Field(
        None, gt=0, description="Mean seconds of audio per request: turns audio seconds/s into requests/s.")
    audio_seconds_assumed: bool = Field(
        False, description="True where audio_seconds_per_request is an assumption, not a measurement.")


class Point(_Strict):
    """One measured operating point: what the unit sustained at one load."""

    concurrency: int | None = Field(None, ge=1, description="The benchmark's --max-concurrency, or null.")
    offered_rate: float | None = Field(None, gt=0, description="The benchmark's --request-rate (req/s), or null: inf.")
    requests_per_s: float | None = Field(None, gt=0, description="Completed requests per second (request_throughput).")
    audio_seconds_per_s: float | None = Field(None, gt=0, description="Seconds of audio per second (audio_throughput).")
    ttfp_p50_ms: float | None = Field(None, ge=0, description="Median time to the first audio packet, ms.")
    ttfp_p99_ms: float | None = Field(None, ge=0, description="99th percentile time to the first audio packet, ms.")
    ttfp_mean_ms: float | None = Field(None, ge=0, description="Mean time to the first audio packet, ms.")
    rtf_p50: float | None = Field(None, ge=0, description="Median real-time factor (generation time / audio length).")
    rtf_mean: float | None = Field(None, ge=0, description="Mean real-time factor.")

    @model_validator(mode="after")
    def _has_rate(self) -> Point:
        if self.requests_per_s is None and self.audio_seconds_per_s is None:
            raise ValueError("a point needs requests_per_s or audio_seconds_per_s")
        return self


class Entry(_Strict):
    """One unit's measurements."""

    pipeline: str = Field(description="The catalog pipeline (omni-autoconf models), e.g. qwen3-tts-1.7b.")
    unit: str = Field(description="'pipeline' (the whole layout as one unit) or a stage name (one replica of it).")
    gpu: str = Field(description="The GPU type, a catalog name (omni-autoconf gpus), e.g. H100-80GB.")
    tp: int = Field(1, ge=1, le=64, description="tensor_parallel_size of the unit (a stage), or 1 for a pipeline.")
    max_num_seqs: int | None = Field(None, ge=1, description="max_num_seqs of the unit's stage(s), or null: bundled.")
    layout: Layout
    workload: Workload
    points: tuple[Point, ...] = Field(min_length=1, description="The measured operating points, any order.")
    labels: tuple[str, ...] = Field(description=f"What the figures are: some of {', '.join(LABELS)}.")
    source: Source

    @model_validator(mode="after")
    def _consistent(self) -> Entry:
        unknown = [label for label in self.labels if label not in LABELS]
        if unknown:
            raise ValueError(f"unknown label {unknown[0]!r} (known: {', '.join(LABELS)})")
        if self.unit != PIPELINE_UNIT and self.unit not in self.layout.stages:
            raise ValueError(f"unit {self.unit!r} is not a stage of its layout")
        if any(p.requests_per_s is None for p in self.points) and self.workload.audio_seconds_per_request is None:
            raise ValueError("points without requests_per_s need workload.audio_seconds_per_request")
        return self

    def requests_per_s(self, point: Point) -> float:
        if point.requests_per_s is not None:
            return point.requests_per_s
        return point.audio_seconds_per_s / self.workload.audio_seconds_per_request

    def capacity(self, ttfp_p50_ms: float | None = None, rtf: float | None = None) -> tuple[float, Point] | None:
        """The highest rate (requests/s) among the points that meet the targets, and its point;
        None when none does. A point that lacks a targeted latency does not meet it. With no
        RTF target, a point whose RTF was measured (median, else mean) must keep up with playback
        (RTF <= 1)."""
        def meets(p: Point) -> bool:
            if ttfp_p50_ms is not None and (p.ttfp_p50_ms is None or p.ttfp_p50_ms > ttfp_p50_ms):
                return False
            if rtf is not None:
                return p.rtf_p50 is not None and p.rtf_p50 <= rtf
            measured = p.rtf_p50 if p.rtf_p50 is not None else p.rtf_mean
            return measured is None or measured <= 1.0

        ok = [p for p in self.points if meets(p)]
        if not ok:
            return None
        best = max(ok, key=lambda p: (self.requests_per_s(p), -(p.concurrency or 0)))
        return self.requests_per_s(best), best


class Profile(_Strict):
    """A performance profile file."""

    profile_version: int = Field(1, description="The format's version: 1.")
    description: str = Field("", description="What the file holds, in words.")
    entries: tuple[Entry, ...] = Field(min_length=1)

    def for_pipeline(self, name: str) -> list[Entry]:
        return [e for e in self.entries if e.pipeline == name]


def parse_profile(data: object, where: str) -> Profile:
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        at = ".".join(str(p) for p in err["loc"])
        raise InputError(f"{where}: {at + ': ' if at else ''}{err['msg']}") from None


def load_profile(path: str | Path) -> Profile:
    """A profile file, validated; one line (InputError) naming the file otherwise."""
    return parse_profile(parse_mapping(read_text(path), str(path)), str(path))


def shipped_profiles() -> dict[str, Path]:
    """The example profiles shipped in data/profiles/, by file stem (a pipeline name)."""
    folder = resources.files("omni_autoconf.data") / "profiles"
    return {Path(str(f)).stem: Path(str(f)) for f in sorted(folder.iterdir(), key=lambda f: f.name)
            if f.name.endswith(".yaml")}


def dump_profile(profile: Profile) -> str:
    """A profile as YAML, keys in field order, no nulls (stable byte for byte)."""
    import yaml

    data = profile.model_dump(mode="json", exclude_none=True)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=False, width=100)

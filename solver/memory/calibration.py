"""Calibration: corrections to the memory model measured from a real start-up log.

`calibrate` reads a log (logparse.py) together with the config it started (so each stage's
settings are known), and compares what each stage printed with what the model predicts
for those settings: the weights as a ratio, the profile peak as a difference, non-torch
memory and CUDA-graph memory as measured. A calibration file applies them with
`--calibration FILE`; the plan's header says so. Corrections go both ways: a log that
shows more activation than predicted lowers the KV a plan counts on, one that shows less
raises it, as the measurement demands.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from ..errors import InputError
from ..inputs.yamlio import parse_mapping, read_text
from ..vllm.facts import GiB
from .stage_memory import StageMemory


@dataclass(frozen=True)
class StageCorrection:
    tensor_parallel_size: int
    weights_scale: float | None = None  # measured / predicted weights at that TP
    activation_delta_bytes: int | None = None  # measured - predicted profile peak
    non_torch_bytes: int | None = None  # as measured
    graph_bytes: int | None = None  # CUDA-graph memory as measured
    evidence: str = ""


@dataclass(frozen=True)
class Calibration:
    path: str
    model: str
    gpu: str
    omni_version: str
    stages: dict[str, StageCorrection]

    def apply(self, stage: str, memory: StageMemory, tensor_parallel_size: int | None = None) -> StageMemory:
        """`memory` with this calibration's corrections for `stage` (unchanged if none).

        At the TP degree they were measured at, every correction applies. At another
        degree a measurement says less (per-rank terms change with TP), so only the
        corrections that raise what the stage needs apply: never optimistic."""
        c = self.stages.get(stage)
        if c is None:
            return memory
        exact = tensor_parallel_size in (None, c.tensor_parallel_size)

        def pick(predicted: int, corrected: int) -> int:
            return corrected if exact else max(predicted, corrected)

        out = memory
        if c.weights_scale is not None:
            out = replace(out, weights_bytes=pick(out.weights_bytes, int(out.weights_bytes * c.weights_scale)))
        if c.activation_delta_bytes is not None:
            corrected = max(out.persistent_bytes, out.activation_bytes + c.activation_delta_bytes)
            out = replace(out, activation_bytes=pick(out.activation_bytes, corrected))
        if c.non_torch_bytes is not None:
            out = replace(out, non_torch_bytes=pick(out.non_torch_bytes, c.non_torch_bytes))
        if c.graph_bytes is not None and out.graph_reserve_bytes:
            # vLLM-Omni's admission still reserves its 2 GiB: never plan for less.
            out = replace(out, graph_reserve_bytes=max(out.graph_reserve_bytes, c.graph_bytes))
        return out

    def describe(self) -> str:
        return (f"calibrated with {Path(self.path).name} ({self.model}, measured on {self.gpu}, vLLM-Omni "
                f"{self.omni_version}; stages {', '.join(sorted(self.stages))})")


def to_yaml(cal: Calibration, header: str) -> str:
    doc = {"model": cal.model, "gpu": cal.gpu, "omni_version": cal.omni_version, "stages": {
        name: {k: v for k, v in vars(c).items() if v is not None} for name, c in sorted(cal.stages.items())}}
    return "".join(f"# {line}\n" for line in header.splitlines()) + yaml.safe_dump(doc, sort_keys=False, width=100)


# What a correction may be: beyond these the log is of another model, TP or GPU, or the
# file was edited by hand. The exact weights of the bench entries are within 1.9% of the
# logs (docs/accuracy.md), so a factor of 2 either way is no calibration of this model.
WEIGHTS_SCALE_RANGE = (0.5, 2.0)
MAX_TERM_BYTES = 64 * GiB  # one process's activation delta, non-torch or graph memory
MAX_CALIBRATION_TP = 64


def validate(cal: Calibration, stage_names: list[str] | None = None) -> Calibration:
    """Refuse (InputError) a calibration whose figures cannot be a measurement."""
    from math import isfinite

    from ..vllm.facts import omni_version

    where = cal.path
    try:
        omni_version(cal.omni_version)
    except InputError:
        raise InputError(f"{where}: omni_version {cal.omni_version!r} is no vLLM-Omni version this tool knows") from None
    for name, c in cal.stages.items():
        if stage_names is not None and name not in stage_names:
            raise InputError(f"{where}: stage {name!r} is not a stage of {cal.model} ({', '.join(stage_names)})")
        if not 1 <= c.tensor_parallel_size <= MAX_CALIBRATION_TP:
            raise InputError(f"{where}: {name}: tensor_parallel_size {c.tensor_parallel_size} is not 1 to "
                             f"{MAX_CALIBRATION_TP}")
        if c.weights_scale is not None:
            low, high = WEIGHTS_SCALE_RANGE
            if not (isfinite(c.weights_scale) and low <= c.weights_scale <= high):
                raise InputError(
                    f"{where}: {name}: the log shows {c.weights_scale:g} times the predicted weights (allowed {low:g} "
                    f"to {high:g}): a log of another model, TP degree or dtype than the config says")
        for field, value, lowest in (("activation_delta_bytes", c.activation_delta_bytes, -MAX_TERM_BYTES),
                                     ("non_torch_bytes", c.non_torch_bytes, 0), ("graph_bytes", c.graph_bytes, 0)):
            if value is not None and not lowest <= value <= MAX_TERM_BYTES:
                raise InputError(f"{where}: {name}: {field} {value} is outside {lowest} to {MAX_TERM_BYTES} "
                                 f"({MAX_TERM_BYTES // GiB} GiB): not a measurement")
    return cal


def _number(value, kind):
    """int() or float() of a YAML scalar, refusing booleans, NaN and infinities."""
    from math import isfinite

    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{value!r} is not a number")
    out = kind(value)
    if isinstance(out, float) and not isfinite(out):
        raise ValueError(f"{value!r} is not a finite number")
    return out


def load(path: str, stage_names: list[str] | None = None) -> Calibration:
    raw = parse_mapping(read_text(path), path)
    try:
        stages = {}
        raw_stages = raw.get("stages") or {}
        if not isinstance(raw_stages, dict):
            raise TypeError("stages is not a mapping")
        for name, c in raw_stages.items():
            if not isinstance(c, dict):
                raise TypeError(f"stage {name} is not a mapping")

            def opt(key, kind):
                return None if c.get(key) is None else _number(c[key], kind)

            stages[str(name)] = StageCorrection(
                tensor_parallel_size=_number(c["tensor_parallel_size"], int),
                weights_scale=opt("weights_scale", float),
                activation_delta_bytes=opt("activation_delta_bytes", int),
                non_torch_bytes=opt("non_torch_bytes", int),
                graph_bytes=opt("graph_bytes", int),
                evidence=str(c.get("evidence", "")),
            )
        cal = Calibration(path, str(raw["model"]), str(raw["gpu"]), str(raw["omni_version"]), stages)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise InputError(f"{path}: not a calibration file written by `omni-autoconf calibrate` ({exc})") from None
    return validate(cal, stage_names)


def fit(parsed, settings, memories: dict[str, StageMemory], model: str, gpu: str, version: str, path: str) -> Calibration:
    """Corrections for every stage the log has figures for. `settings` are the check's
    resolved settings of the config that started (configcheck.ResolvedSetting), and
    `memories` the model's prediction per stage name at those settings."""
    stages = {}
    for rs in settings:
        fig = parsed.stages.get(rs.spec.stage_id)
        if fig is None:
            continue
        m = memories[rs.spec.name]
        evidence = [f"log lines {fig.lines[0]}-{fig.lines[-1]}"]
        weights = fig.weights_gib if fig.weights_gib is not None else fig.model_loading_gib
        scale = None
        if weights is not None and m.weights_bytes:
            scale = round(weights * GiB / m.weights_bytes, 4)
            evidence.append(f"weights {weights} GiB (predicted {m.weights_bytes / GiB:.2f})")
        non_torch = None if fig.non_torch_gib is None else int(fig.non_torch_gib * GiB)
        if non_torch is None and fig.consumed_gib is not None and fig.model_loading_gib is not None:
            non_torch = max(0, int((fig.consumed_gib - fig.model_loading_gib) * GiB))  # 0.28+: weights + non-torch
        activation = fig.activation_gib
        if activation is None and fig.available_kv_gib is not None and weights is not None:
            # requested - available = weights + peak + non-torch (vLLM-Omni 0.30's formula)
            requested = fig.requested_gib if fig.requested_gib is not None else None
            if requested is not None:
                nt = (non_torch if non_torch is not None else m.non_torch_bytes) / GiB
                activation = requested - fig.available_kv_gib - weights - nt
                evidence.append(f"peak derived as requested {requested} - available {fig.available_kv_gib} - weights"
                                " - non-torch")
        delta = None
        if activation is not None:
            delta = int(activation * GiB) - m.activation_bytes
            evidence.append(f"peak activation {activation:.2f} GiB (predicted {m.activation_bytes / GiB:.2f})")
        graph = None if fig.graph_gib is None else int(fig.graph_gib * GiB)
        if not any(v is not None for v in (scale, delta, non_torch, graph)):
            continue
        stages[rs.spec.name] = StageCorrection(rs.tensor_parallel_size, scale, delta, non_torch, graph, "; ".join(evidence))
    if not stages:
        raise InputError("the log has no figure of any stage of the config (Model loading took, Available KV cache "
                         "memory, the memory summary, Graph capturing finished)")
    return validate(Calibration(path, model, gpu, version, stages))

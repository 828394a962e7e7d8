"""The accuracy set: its entries (one observed vLLM start-up each, read from JSON lines or the
set shipped with the package), the result of predicting one, and the statistics over many (mean
absolute and signed % error per figure, optimistic counts, the held-out part). Predicting an
entry is accuracy.py's."""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from ..inputs.yamlio import parse_json
from ..vllm.facts import OMNI_VERSIONS, GiB

FIGURES = ("model_loading_gib", "available_kv_gib", "kv_cache_tokens", "kv_bytes_per_token")
# The documented bound (docs/accuracy.md): available KV within max(1 GiB, 10%) of what vLLM printed.
KV_BOUND_GIB, KV_BOUND_FRACTION = 1.0, 0.10
WEIGHTS_BOUND_FRACTION = 0.03
# issue 19's acceptance: no prediction more than max(0.5 GiB, 3%) optimistic. Optimistic is
# more KV (GiB or tokens) than vLLM gave, or fewer weight or KV bytes per token than it used.
OPTIMISTIC_GIB, OPTIMISTIC_FRACTION = 0.5, 0.03
_OPTIMISTIC_SIGN = {"model_loading_gib": -1, "available_kv_gib": 1, "kv_cache_tokens": 1, "kv_bytes_per_token": -1}
SHIPPED = "accuracy.jsonl"  # in omni_autoconf.data
# The newest vLLM release a supported vLLM-Omni version runs on
NEWEST_PLANNED_VLLM = max(v.vllm for v in OMNI_VERSIONS.values())
SHIPPED_CONFIGS = "accuracy-configs.json"  # Hub id -> config.json, for entries that name one


@dataclass
class EntryResult:
    index: int
    source: str
    model: str
    status: str  # "modelled" or "skipped"
    reason: str = ""
    predicted: dict[str, float | None] = field(default_factory=dict)
    observed: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    bounded: bool = False  # a V1 entry with its whole configuration: the two-sided bound applies
    held_out: bool = False  # a start-up the memory model was not tuned on
    # a vLLM release some supported vLLM-Omni version runs (the planner's scope); newer ones are
    # compared and reported, but are no evidence for or against a plan's margin
    planned_vllm: bool = True

    def outside_bound(self) -> bool:
        err = self.error("available_kv_gib")
        if err is None or not self.bounded:
            return False
        return abs(err) > max(KV_BOUND_GIB, KV_BOUND_FRACTION * abs(self.observed["available_kv_gib"]))

    def error(self, figure: str) -> float | None:
        p, o = self.predicted.get(figure), self.observed.get(figure)
        return None if p is None or o is None else p - o

    def optimistic(self) -> bool:
        """More KV predicted than vLLM allocated, beyond the bound."""
        err = self.error("available_kv_gib")
        if err is None:
            return False
        return err > max(KV_BOUND_GIB, KV_BOUND_FRACTION * abs(self.observed["available_kv_gib"]))

    def relative_error(self, figure: str) -> float | None:
        err, obs = self.error(figure), self.observed.get(figure)
        return None if err is None or not obs else err / abs(obs)

    def optimistic_in(self, figure: str) -> bool:
        """This figure more than max(0.5 GiB, 3%) on the optimistic side of what vLLM printed
        (tokens: 0.5 GiB at the logged bytes per token; bytes per token: 3%)."""
        err, obs = self.error(figure), self.observed.get(figure)
        if err is None or obs is None:
            return False
        slack = OPTIMISTIC_FRACTION * abs(obs)
        if figure.endswith("_gib"):
            slack = max(slack, OPTIMISTIC_GIB)
        elif figure == "kv_cache_tokens" and self.observed.get("kv_bytes_per_token"):
            slack = max(slack, OPTIMISTIC_GIB * GiB / self.observed["kv_bytes_per_token"])
        return _OPTIMISTIC_SIGN[figure] * err > slack

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "source": self.source, "model": self.model, "status": self.status,
                               "held_out": self.held_out}
        if self.reason:
            out["reason"] = self.reason
        if self.status == "modelled":
            out["predicted"] = self.predicted
            out["observed"] = self.observed
            out["error"] = {f: (None if self.error(f) is None else round(self.error(f), 4)) for f in FIGURES}
            out["optimistic"] = self.optimistic()
            out["optimistic_figures"] = [f for f in FIGURES if self.optimistic_in(f)]
            out["bounded"] = self.bounded
            out["notes"] = self.notes
        return out


class Skip(Exception):
    """An entry the model cannot predict; the message says why."""


def _number(value: Any) -> float | None:
    """A figure as the log printed it: 0.9, "default (0.9)", "12.13 (PP stage 0) / ..."."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    m = re.search(r"-?\d+(?:\.\d+)?", str(value).replace(",", ""))
    return float(m.group()) if m else None


def _most_optimistic(results: list[EntryResult]) -> float | None:
    errors = [r.error("available_kv_gib") for r in results if r.error("available_kv_gib") is not None]
    return max(errors) if errors else None


def figure_stats(results: list[EntryResult], figure: str) -> dict[str, Any]:
    """One figure over the modelled entries that have it: count, median and max absolute error,
    mean absolute and signed mean relative error (percent of what vLLM printed) and the count of
    predictions more than max(0.5 GiB, 3%) optimistic."""
    have = [r for r in results if r.status == "modelled" and r.error(figure) is not None]
    errors = [abs(r.error(figure)) for r in have]
    relative = [r.relative_error(figure) for r in have if r.relative_error(figure) is not None]
    return {"count": len(errors),
            "median_abs_error": round(statistics.median(errors), 4) if errors else None,
            "max_abs_error": round(max(errors), 4) if errors else None,
            "max_relative_error": round(max(abs(x) for x in relative), 4) if relative else None,
            "mean_abs_pct_error": round(100 * statistics.fmean(abs(x) for x in relative), 2) if relative else None,
            "signed_mean_pct_error": round(100 * statistics.fmean(relative), 2) if relative else None,
            "optimistic": sum(r.optimistic_in(figure) for r in have)}


def summary(results: list[EntryResult]) -> dict[str, Any]:
    modelled = [r for r in results if r.status == "modelled"]
    out: dict[str, Any] = {"entries": len(results), "modelled": len(modelled),
                           "skipped": len(results) - len(modelled)}
    out.update({figure: figure_stats(results, figure) for figure in FIGURES})
    out["optimistic"] = sum(r.optimistic() for r in modelled)
    out["bounded"] = sum(r.bounded for r in modelled)
    out["outside_bound"] = sum(r.outside_bound() for r in modelled)
    out["most_optimistic_kv_gib"] = _most_optimistic(modelled)
    # what the default --buffer must cover: start-ups of the vLLM releases plans are made for
    out["most_optimistic_kv_gib_planned"] = _most_optimistic([r for r in modelled if r.planned_vllm])
    held = [r for r in results if r.held_out]
    out["held_out"] = {"entries": len(held), "modelled": sum(r.status == "modelled" for r in held),
                       **{figure: figure_stats(held, figure) for figure in FIGURES}}
    return out


def read_entries(text: str, where: str) -> list[dict]:
    """JSON lines; a line that is not a JSON object is an input error naming the line."""
    entries = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        value = parse_json(line, f"{where}: line {n}")
        if not isinstance(value, dict):
            raise InputError(f"{where}: line {n}: expected a JSON object")
        entries.append(value)
    return entries


def _data_text(name: str) -> str:
    from importlib.resources import files

    return files("omni_autoconf.data").joinpath(name).read_text(encoding="utf-8")


def shipped_text() -> str:
    """The shipped set's JSON lines, as installed with the package."""
    return _data_text(SHIPPED)


_CONFIGS: dict[str, dict] = {}


def shipped_configs() -> dict[str, dict]:
    """The config.json files the shipped set's entries name by Hub id (`config_ref`)."""
    if not _CONFIGS:
        data = json.loads(_data_text(SHIPPED_CONFIGS))
        _CONFIGS.update({k: v for k, v in data.items() if isinstance(v, dict) and not k.startswith("_")})
    return _CONFIGS

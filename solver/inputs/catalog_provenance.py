"""How each memory term of a catalog pipeline is known, from the `source` it cites.

A term is a component's weights, a stage's decoder geometry (KV bytes, activations), or one of its
profiles (vision tower, encoder, generation, diffusion, serving outside the fraction). Its source
is *estimated* when it says so ("estimate", "assumed", "not confirmed"), *measured* when it or the
`sources` entry it cites is a start-up log or a profiler reading, and *derived* otherwise (a
config.json, a checkpoint's tensor sizes, the code of a wheel). `omni-autoconf models` prints the
counts per pipeline.
"""

from __future__ import annotations

import re
from collections import Counter

KINDS = ("measured", "derived", "estimated")
# a figure read off a start-up log or a profiler: "took 8.49 GiB", "logged 3.8655", "start-up logs"
_MEASURED = re.compile(r"took [0-9.]+ ?Gi?B|\blogged\b[^;]*\d|start-up logs?|\bmeasured\b|profiler|nvidia-smi", re.I)
# an estimate says so, or rests on an assumption or a figure not confirmed
_ESTIMATED = re.compile(r"estimate|assum|not confirmed|not measured|unmeasured", re.I)


def term_sources(spec) -> list[str]:
    """The `source` of every memory term of a pipeline, stage by stage."""
    out: list[str] = []
    for stage in spec.stages:
        out += [c.source for c in stage.components]
        out.append(stage.transformer.source)
        for part in (stage.vision_tower, stage.encoder_profile, stage.generation_profile, stage.diffusion_profile,
                     stage.serving_outside):
            if part is not None:
                out.append(part.source)
    return out


def classify(source: str, sources: dict[str, str]) -> str:
    """"measured", "derived" or "estimated" for one term's source text. Where the figure comes
    from is its first clause (before ";"): "config.json ...; agrees with the logged ..." is derived
    and checked, not measured."""
    if _ESTIMATED.search(source):
        return "estimated"
    primary = source.split(";")[0]
    cited = [text for key, text in sources.items() if re.search(rf"\b{re.escape(key)}\b", primary)]
    if any(_MEASURED.search(text) for text in [primary, *cited]):
        return "measured"
    return "derived"


def provenance(spec) -> dict[str, int]:
    """Counts of the pipeline's memory terms by how they are known (every kind present, 0 allowed)."""
    counts = Counter(classify(s, spec.sources) for s in term_sources(spec))
    return {kind: counts.get(kind, 0) for kind in KINDS}

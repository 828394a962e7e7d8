"""A rate plan's words (--target-rate): header lines, the summary table's rows, the JSON key.

Only a plan made for a target rate has them (Plan.rate); every other plan's bytes stay as
they were.
"""

from __future__ import annotations

from typing import Any


def header_lines(plan) -> list[str]:
    rate = plan.rate
    if rate is None:
        return []
    t = rate.target
    targets = "".join([f", TTFP p50 <= {t.ttfp_p50_ms:g} ms" if t.ttfp_p50_ms is not None else "",
                       f", RTF <= {t.rtf:g}" if t.rtf is not None else ""])
    verdict = "serves it" if rate.serves else "does NOT serve it"
    lines = [f"Rate: target {t.rate:g} requests/s{targets}, profile {t.profile_name}: this plan {verdict}; "
             f"GPUs: {rate.search}."]
    if rate.extrapolated:
        lines.append("EXTRAPOLATED: the profile was measured elsewhere: " + "; ".join(rate.extrapolated) + ".")
    for s in rate.stages:
        lines.append(f"  {s.stage}: {s.replicas} replica(s) (at least {s.min_replicas}) x "
                     f"{s.per_replica:.3g} requests/s = {s.capacity:.3g}; utilisation "
                     f"{100 * s.utilisation(t.rate):.0f}%")
    lines += [f"Assumes {a}." for a in rate.assumptions]
    return lines


def json_key(plan) -> dict[str, Any]:
    return {} if plan.rate is None else {"rate": plan.rate.as_dict()}


def text_table(rows: list[tuple[str, ...]]) -> str:
    """summary.text_table's layout (not imported: summary imports render, which imports this)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def table(plan) -> str:
    rate = plan.rate
    if rate is None:
        return ""
    t = rate.target
    rows = [("stage", "replicas", "min", "req/s each", "capacity", "utilisation")]
    for s in rate.stages:
        rows.append((s.stage, str(s.replicas), str(s.min_replicas), f"{s.per_replica:.3g}", f"{s.capacity:.3g}",
                     f"{100 * s.utilisation(t.rate):.0f}%"))
    extra = "; EXTRAPOLATED" if rate.extrapolated else ""
    return (text_table(rows) + f"rate: target {t.rate:g} requests/s: {'served' if rate.serves else 'NOT served'}; "
            f"{rate.search}{extra}\n")

"""`--format svg`: the per-GPU memory map as a picture, one stacked bar per GPU, hosts grouped.

Each bar is the GPU's total: per stage its weights, activations and KV cache (per rank, as the
memory model counts them), the rest of what the stages request (`other`: CUDA graphs, runner
buffers, non-torch memory inside the fractions), what sits outside the fractions (CUDA
contexts, NCCL, the API process), the margin the tool keeps, and what is left free. Plain SVG
written with the standard library's xml.etree: a plotting library (matplotlib) would add a large
optional dependency and non-byte-stable output (it embeds versions and ids) for boxes and text.
`render_check_svg(report)` draws a check report the same way.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from ..inputs.gpus import local_index, node_names
from ..vllm.facts import gib_text

COLOURS = {"weights": "#4c72b0", "activations": "#dd8452", "KV cache": "#55a868", "other": "#8172b3",
           "outside": "#937860", "margin": "#c44e52", "free": "#e5e5e5"}
WIDTH, BAR_W, LEFT, ROW, BAR_H = 960, 720, 220, 58, 22


@dataclass(frozen=True)
class _Bar:
    gpu: object  # inputs.gpus.Gpu
    title: str
    segments: tuple[tuple[str, str, int], ...]  # (stage or "", kind, bytes)
    caption: str


def _bar(gpus, outcome, stages) -> _Bar:
    """stages: (name, fraction, weights, activations, kv) of each stage with a rank here."""
    g = outcome.gpu
    segments, inside = [], 0
    for name, _, weights, activations, kv in stages:
        for kind, size in (("weights", weights), ("activations", activations), ("KV cache", kv)):
            if size > 0:
                segments.append((name, kind, size))
                inside += size
    segments.append(("", "other", max(0, outcome.requested_bytes - inside)))
    segments += [("", "outside", outcome.outside_bytes), ("", "margin", outcome.margin_bytes),
                 ("", "free", max(0, outcome.free_bytes))]
    where = f"{g.node} GPU {local_index(gpus, g)}" if len(node_names(gpus)) > 1 else f"GPU {g.index}"
    caption = "; ".join(f"{name} {fraction:g} ({gib_text(w + a + k)} GiB)" for name, fraction, w, a, k in stages)
    free = f"free {gib_text(outcome.free_bytes)} GiB"
    return _Bar(g, f"{where} {g.name} ({gib_text(g.total_bytes)} GiB)", tuple(segments),
                (caption or "no stage") + f"; {free}")


def _svg(title: str, bars: list[_Bar]) -> str:
    gpus = [b.gpu for b in bars]
    hosts = node_names(gpus)
    rows = len(bars) + (len(hosts) if len(hosts) > 1 else 0)
    height = 70 + rows * ROW + 40
    svg = ET.Element("svg", xmlns="http://www.w3.org/2000/svg", width=str(WIDTH), height=str(height),
                     viewBox=f"0 0 {WIDTH} {height}", **{"font-family": "sans-serif", "font-size": "12"})
    ET.SubElement(svg, "title").text = title
    ET.SubElement(svg, "text", x="10", y="22", **{"font-size": "15"}).text = title
    x = 10
    for kind, colour in COLOURS.items():  # the legend
        ET.SubElement(svg, "rect", x=str(x), y="34", width="12", height="12", fill=colour, stroke="#666")
        ET.SubElement(svg, "text", x=str(x + 16), y="45").text = kind
        x += 24 + 7 * len(kind)
    scale = BAR_W / max(g.total_bytes for g in gpus)
    y = 70
    for host in hosts:
        if len(hosts) > 1:
            ET.SubElement(svg, "text", x="10", y=str(y + 16), **{"font-weight": "bold"}).text = f"host {host}"
            y += ROW
        for bar in (b for b in bars if b.gpu.node == host):
            group = ET.SubElement(svg, "g")
            ET.SubElement(group, "text", x="10", y=str(y + 16)).text = bar.title
            x0 = float(LEFT)
            for stage, kind, size in bar.segments:
                w = size * scale
                if w <= 0:
                    continue
                rect = ET.SubElement(group, "rect", x=f"{x0:.2f}", y=str(y), width=f"{w:.2f}", height=str(BAR_H),
                                     fill=COLOURS[kind], stroke="#ffffff")
                ET.SubElement(rect, "title").text = f"{stage + ' ' if stage else ''}{kind}: {gib_text(size)} GiB"
                if stage and kind == "weights" and w > 8 * len(stage):
                    ET.SubElement(group, "text", x=f"{x0 + 3:.2f}", y=str(y + 15), fill="#ffffff").text = stage
                x0 += w
            ET.SubElement(group, "text", x=str(LEFT), y=str(y + BAR_H + 15), fill="#333").text = bar.caption
            y += ROW
    ET.indent(svg)
    return ET.tostring(svg, encoding="unicode") + "\n"


def render_plan_svg(plan) -> str:
    """The plan's per-GPU memory map (planning.planner.Plan) as SVG text."""
    gpus = [g.gpu for g in plan.gpus]
    bars = []
    for outcome in plan.gpus:
        stages = [(sp.stage.name, sp.gpu_memory_utilization, sp.memory.weights_bytes, sp.memory.activation_bytes,
                   sp.kv_bytes_per_gpu.get(outcome.gpu.index, 0))
                  for sp in plan.stages if outcome.gpu.index in sp.devices]
        bars.append(_bar(gpus, outcome, stages))
    return _svg(f"{plan.request.pipeline.name}: per-GPU memory (GiB), vLLM-Omni {plan.request.version.name}", bars)


def render_check_svg(report) -> str:
    """A check report's per-GPU memory map (planning.check.CheckReport) as SVG text; a stage
    that cannot be modelled shows no weights, activations or KV."""
    gpus = [g.gpu for g in report.gpus]
    bars = []
    for outcome in report.gpus:
        stages = []
        for st in report.stages:
            run = st.run
            if outcome.gpu.index not in run.devices:
                continue
            memory = run.memory
            stages.append((run.name, run.gpu_memory_utilization, memory.weights_bytes if memory else 0,
                           memory.activation_bytes if memory else 0, st.kv_cache_bytes if run.has_kv else 0))
        bars.append(_bar(gpus, outcome, stages))
    name = Path(str(getattr(report.config, "path", "check"))).name
    return _svg(f"{name}: per-GPU memory (GiB), vLLM-Omni {report.version.name}", bars)

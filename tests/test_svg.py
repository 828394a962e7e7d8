"""`--format svg` and render_check_svg: well-formed SVG (parsed by xml.etree) that names every
GPU and stage, hosts grouped, the same bytes every run."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from click.testing import CliRunner

from omni_autoconf import check
from omni_autoconf.cli.main import main
from omni_autoconf.emit.svg import render_check_svg

NS = "{http://www.w3.org/2000/svg}"


def _texts(svg: str) -> str:
    root = ET.fromstring(svg)
    assert root.tag == NS + "svg"
    return "\n".join(e.text or "" for e in root.iter() if e.tag in (NS + "text", NS + "title"))


def _svg(*args) -> str:
    result = CliRunner().invoke(main, [*args, "--format", "svg", "-q"])
    assert result.exit_code == 0, result.stderr
    return result.stdout


def test_the_flagship_picture_names_every_gpu_and_stage():
    svg = _svg("--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe")
    texts = _texts(svg)
    for needle in ("GPU 0 H100-80GB", "GPU 1 H100-80GB", "thinker", "talker", "code2wav", "weights", "KV cache",
                   "margin", "free", "outside"):
        assert needle in texts, needle
    assert svg == _svg("--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe")


def test_hosts_are_grouped():
    texts = _texts(_svg("--gpus", "8xH100-80GB", "--nodes", "2", "--model", "qwen3-omni-moe"))
    assert "host node0" in texts and "host node1" in texts
    assert all(f"node{h} GPU {i}" in texts for h in (0, 1) for i in range(8))


def test_a_check_report_draws_the_same_way():
    report = check("examples/qwen3-omni-moe.2xH100-80GB.deploy.yaml", gpus="2xH100-80GB", model="qwen3-omni-moe")
    texts = _texts(render_check_svg(report))
    assert all(n in texts for n in ("GPU 0 H100-80GB", "GPU 1 H100-80GB", "thinker", "talker", "code2wav"))


def test_check_format_svg_draws_the_file_and_refuses_several(tmp_path):
    planned = CliRunner().invoke(main, ["--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "-q"])
    path = tmp_path / "deploy.yaml"
    path.write_text(planned.stdout)
    args = ["check", str(path), "--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "--format", "svg"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.stderr
    text = "".join(ET.fromstring(result.stdout).itertext())
    assert all(name in text for name in ("thinker", "talker", "code2wav", "GPU 0", "GPU 1"))
    several = CliRunner().invoke(main, args[:2] + [str(path)] + args[2:])
    assert several.exit_code == 2 and "one file" in several.stderr

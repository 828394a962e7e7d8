"""Docs match the code: the example files, and the generated blocks of README.md and docs/ (the
command samples, the comparison table, --help, the accuracy table, the covered-pipelines table)
are current. `make examples` rewrites them all."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "examples"))
    spec.loader.exec_module(module)
    return module


regenerate = _load("regenerate")


def _read(rel: str) -> str:
    return (ROOT / rel).read_text()


def _block(rel: str, name: str) -> str:
    body = regenerate.block(_read(rel), name)
    assert body is not None, f"{rel} has no <!-- {name}:start --> ... <!-- {name}:end --> block"
    return body


@pytest.mark.parametrize("name, args", regenerate.EXAMPLES, ids=[e[0] for e in regenerate.EXAMPLES])
def test_example_file_is_current(name, args):
    shipped = (ROOT / "examples" / name).read_text()
    fresh = regenerate.render(args)
    assert regenerate.comparable(name, fresh) == regenerate.comparable(name, shipped), (
        f"examples/{name} is stale: run `make examples`"
    )


def test_comparison_table_is_current_and_in_the_docs():
    table = _load("compare_bundled").table()
    assert (ROOT / "examples" / "comparison.md").read_text() == table
    assert _block("docs/cpsat.md", "comparison") == table, (
        "docs/cpsat.md comparison table is stale: run `make examples`")


def test_docs_show_the_current_help():
    help_text = regenerate.help_text()
    assert (ROOT / "examples" / "help.txt").read_text() == help_text
    assert _block("docs/cli.md", "help") == "```text\n" + help_text + "```\n", (
        "docs/cli.md --help block is stale: run `make examples`")


def test_docs_show_the_current_accuracy_table():
    table = regenerate.accuracy_table()
    assert (ROOT / "examples" / "accuracy.txt").read_text() == table
    assert _block("docs/accuracy.md", "bench") == "```text\n" + table + "```\n", (
        "docs/accuracy.md accuracy table is stale: run `make examples`")


def test_covered_pipelines_table_is_generated_from_the_catalog():
    from omni_autoconf.inputs.catalog import model_catalog

    table = _block("docs/pipelines.md", "pipelines")
    assert table == regenerate.pipelines_table(), "docs/pipelines.md pipelines table is stale: run `make examples`"
    rows = [line for line in table.splitlines() if line.startswith("|")][2:]  # below the header and its rule
    names = [re.match(r"\| \[?`([^`]+)`", line).group(1) for line in rows]
    assert names == list(model_catalog()), "one row per catalog entry, in the catalog's order"


def _sample_files() -> list[str]:
    return [str(p.relative_to(ROOT)) for p in regenerate.doc_files() if regenerate.samples(p.read_text())]


@pytest.mark.parametrize("rel", _sample_files())
def test_command_samples_are_current(rel):
    """Every ```text block that starts with `$ omni-autoconf ...` shows what the command prints now
    (stdout and stderr as a terminal shows them; the solve time aside)."""
    text = _read(rel)
    fresh = regenerate.with_samples_rerun(text)
    shown = [m.group(2) for m in regenerate.SAMPLE.finditer(text)]
    now = [m.group(2) for m in regenerate.SAMPLE.finditer(fresh)]
    for cmd, old, new in zip(regenerate.samples(text), shown, now):
        assert regenerate.steady(new) == regenerate.steady(old), f"{rel}: `{cmd}` is stale: run `make examples`"


def test_readme_shows_six_commands_and_the_no_plan_sample():
    commands = regenerate.samples(_read("README.md"))
    assert len(commands) >= 6, commands
    assert any(c.startswith("omni-autoconf --gpus 2xA100-40GB --model qwen3-omni-moe") for c in commands)
    assert "README.md" in _sample_files() and "docs/cpsat.md" in _sample_files()


def test_no_plan_sample_is_the_commands_stderr():
    """The no-plan sample is exactly what the command writes to stderr (it writes nothing else)."""
    import shlex

    from click.testing import CliRunner
    from omni_autoconf.cli.main import main

    for rel in ("README.md", "docs/cpsat.md"):
        m = next(m for m in regenerate.SAMPLE.finditer(_read(rel)) if "2xA100-40GB" in m.group(1))
        result = CliRunner().invoke(main, shlex.split(m.group(1))[1:])
        assert result.exit_code == 1
        assert result.stdout == ""
        assert result.stderr == m.group(2)


@pytest.mark.parametrize("rel", [str(p.relative_to(ROOT)) for p in regenerate.doc_files()])
def test_every_table_has_its_header_rule(rel):
    """A markdown table whose second line is not |---| renders as text."""
    lines = _read(rel).splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|"))]
    assert starts or rel != "README.md"
    for i in starts:
        assert i + 1 < len(lines) and re.fullmatch(r"\|[-:| ]+\|", lines[i + 1]), f"{rel} line {i + 1}: {lines[i]}"

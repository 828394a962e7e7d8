"""Docs match the code: the example files and the README's tables are current."""

from __future__ import annotations

import importlib.util
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


@pytest.mark.parametrize("name, args", regenerate.EXAMPLES, ids=[e[0] for e in regenerate.EXAMPLES])
def test_example_file_is_current(name, args):
    shipped = (ROOT / "examples" / name).read_text()
    fresh = regenerate.render(args)
    assert regenerate.comparable(name, fresh) == regenerate.comparable(name, shipped), (
        f"examples/{name} is stale: run `make examples`"
    )


def test_comparison_table_is_current_and_in_the_readme():
    table = _load("compare_bundled").table()
    assert (ROOT / "examples" / "comparison.md").read_text() == table
    assert table in (ROOT / "README.md").read_text(), "README comparison table is stale: run `make examples`"


def test_readme_shows_the_current_help():
    help_text = regenerate.help_text()
    assert (ROOT / "examples" / "help.txt").read_text() == help_text
    assert help_text in (ROOT / "README.md").read_text(), "README --help block is stale: run `make examples`"


def test_readme_no_plan_sample_is_current():
    import re
    import shlex

    from click.testing import CliRunner

    from omni_autoconf.cli.main import main

    text = (ROOT / "README.md").read_text()
    m = re.search(r"```text\n\$ (omni-autoconf [^\n]+)\n(.*?)```", text, re.S)
    assert m, "README has no `$ omni-autoconf ...` sample"
    result = CliRunner().invoke(main, shlex.split(m.group(1))[1:])
    assert result.stderr == m.group(2)


def test_readme_shows_the_current_accuracy_table():
    table = regenerate.accuracy_table()
    assert (ROOT / "examples" / "accuracy.txt").read_text() == table
    assert table in (ROOT / "README.md").read_text(), "README accuracy table is stale: run `make examples`"


def test_every_readme_table_has_its_header_rule():
    """A markdown table whose second line is not |---| renders as text."""
    import re
    from pathlib import Path

    lines = (Path(__file__).resolve().parent.parent / "README.md").read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|"))]
    assert starts
    for i in starts:
        assert i + 1 < len(lines) and re.fullmatch(r"\|[-:| ]+\|", lines[i + 1]), f"README.md line {i + 1}: {lines[i]}"

"""The README and docs/ stay readable and whole: a README a newcomer reads in two minutes, prose
wrapped at about 100 characters, every link resolving, every docs page reachable from the README,
and the layout page naming the code as it is. What the docs show is checked in test_examples.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PACKAGE = ROOT / "solver"
WIDTH = 100
# Pages written by others and checked by their own tests; links to them must resolve once they land.
OTHERS: set[str] = set()  # pages another tool writes (none today)


def _pages() -> list[Path]:
    return [README, *sorted(p for p in DOCS.glob("*.md") if f"docs/{p.name}" not in OTHERS)]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _prose_lines(text: str):
    """(line number, line) of the lines outside code blocks, tables and generated blocks."""
    fenced = generated = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if re.fullmatch(r"<!-- [\w-]+:start -->", line):
            generated = True
        if re.fullmatch(r"<!-- [\w-]+:end -->", line):
            generated = False
            continue
        if not (fenced or generated or line.startswith("|")):
            yield number, line


def _links(text: str) -> list[str]:
    prose = "\n".join(line for _, line in _prose_lines(text))
    tables = "\n".join(line for line in text.splitlines() if line.startswith("|"))
    return re.findall(r"\]\(([^)\s]+)\)", prose + "\n" + tables)


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings."""
    out = set()
    for _, line in _prose_lines(text):
        m = re.match(r"#+ (.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move material into docs/"


def test_readme_keeps_the_two_setup_commands():
    text = README.read_text()
    assert "make run    # creates .venv, installs omni-autoconf" in text
    assert "make test   # runs the test suite (exactly what CI's .ci/run does)" in text


def test_readme_exit_code_table_has_every_exit_code():
    from omni_autoconf import errors

    codes = {value for name, value in vars(errors).items() if name.startswith("EXIT_")}
    rows = {int(m.group(1)) for m in re.finditer(r"^\| (\d+) \|", README.read_text(), re.MULTILINE)}
    assert codes and codes <= rows, f"exit codes missing from the README's table: {sorted(codes - rows)}"


@pytest.mark.parametrize("page", _pages(), ids=_rel)
def test_prose_is_wrapped(page):
    """Prose lines at most WIDTH characters (tables, code and generated blocks aside); a line that
    is one long word (a URL) cannot be wrapped."""
    long = [f"{_rel(page)}:{n}: {len(line)} characters" for n, line in _prose_lines(page.read_text())
            if len(line) > WIDTH and " " in line.strip()]
    assert not long, "\n".join(long)


@pytest.mark.parametrize("page", _pages(), ids=_rel)
def test_every_link_resolves(page):
    broken = []
    for link in _links(page.read_text()):
        if re.match(r"[a-z]+:", link):
            continue  # https:, mailto:
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if _rel(path) in OTHERS and not path.exists():
            continue  # not written yet
        if not path.exists():
            broken.append(link)
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path.read_text()):
            broken.append(f"{link} (no such heading)")
    assert not broken, f"{_rel(page)}: broken links: {broken}"


def test_readme_links_every_docs_page():
    linked = {(ROOT / link.partition("#")[0]).resolve() for link in _links(README.read_text())}
    pages = {p.resolve() for p in DOCS.glob("*.md")} | {(ROOT / rel).resolve() for rel in OTHERS}
    assert not pages - linked, f"docs pages the README does not link: {sorted(p.name for p in pages - linked)}"


@pytest.mark.parametrize("page", _pages(), ids=_rel)
def test_module_paths_named_in_the_docs_exist(page):
    missing = sorted({p for p in re.findall(r"\bsolver/[\w/]+\.py\b", page.read_text()) if not (ROOT / p).is_file()})
    assert not missing, f"{_rel(page)} names modules that do not exist: {missing}"


def test_layout_page_names_every_layer_and_top_level_module():
    text = (DOCS / "layout.md").read_text()
    folders = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py") if p.parent.name != "data")
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    missing = [f"{name}/" for name in folders if f"`{name}/`" not in text]
    missing += [name for name in modules if f"`{name}`" not in text]
    assert not missing, f"docs/layout.md does not describe: {missing}"


def test_layout_page_names_only_modules_that_exist():
    text = (DOCS / "layout.md").read_text()
    known = {p.name for folder in ("solver", "benchmarks", "examples") for p in (ROOT / folder).rglob("*.py")}
    named = set(re.findall(r"`([\w]+\.py)`", text))
    assert not named - known, f"docs/layout.md names modules that do not exist: {sorted(named - known)}"


def test_api_page_has_one_runnable_python_block():
    """The block another test executes: exactly one ```python block in docs/api.md."""
    blocks = re.findall(r"^```python\n", (DOCS / "api.md").read_text(), re.MULTILINE)
    assert len(blocks) == 1

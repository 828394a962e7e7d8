"""Regenerate the example outputs in this folder and the generated blocks of the docs
(`make examples`).

tests/test_examples.py re-runs every entry and fails when a file here or a generated block of
README.md or docs/ is stale, so the examples and the docs always show what the current code
writes. The generated blocks:

- every ```text block of README.md and docs/*.md that starts with `$ omni-autoconf ...`: the
  command's output, the commands of one file run in order in one scratch folder (so a `check
  deploy.yaml` reads the deploy.yaml an earlier block wrote);
- between `<!-- NAME:start -->` and `<!-- NAME:end -->`: the blocks of BLOCKS below.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from click.testing import CliRunner

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# (file, omni-autoconf arguments): the README's first commands (Qwen3-Omni), the one-card 3B, the
# thinker-only Qwen3-Omni, Qwen3-TTS split over one small card, and BAGEL's thinker beside its dit.
EXAMPLES = [
    ("qwen3-omni-moe.2xH100-80GB.deploy.yaml", ["--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe"]),
    (
        "qwen3-omni-moe.2xH100-80GB.stage_configs.yaml",
        ["--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "--omni-version", "0.24", "--schema", "stage-args"],
    ),
    (
        "qwen2.5-omni-7b.H100+A100.json",
        ["--gpus", "1xH100-80GB,1xA100-80GB", "--model", "qwen2.5-omni-7b", "--max-model-len", "32768",
         "--format", "json"],
    ),
    (
        "qwen2.5-omni-3b.1xRTX4090.deploy.yaml",
        ["--gpus", "1xRTX4090", "--model", "qwen2.5-omni-3b", "--max-model-len", "4096",
         "--max-num-batched-tokens", "4096"],
    ),
    ("qwen3-omni-moe-thinking.2xH100-80GB.deploy.yaml", ["--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe-thinking"]),
    ("qwen3-tts-1.7b.1xRTX4090.deploy.yaml", ["--gpus", "1xRTX4090", "--model", "qwen3-tts-1.7b"]),
    ("bagel-7b-mot.1xA100-80GB.deploy.yaml", ["--gpus", "1xA100-80GB", "--model", "bagel-7b-mot"]),
]


def render(args: list[str]) -> str:
    from omni_autoconf.cli.main import main

    result = CliRunner().invoke(main, [*args, "-q"])
    if result.exit_code != 0:
        raise SystemExit(f"omni-autoconf {' '.join(args)} failed: {result.stderr}")
    return result.stdout


def comparable(name: str, text: str) -> str:
    """The text with run-to-run variation (JSON solve_seconds) taken out."""
    if name.endswith(".json"):
        data = json.loads(text)
        data.pop("solve_seconds", None)
        return json.dumps(data, indent=2)
    return text


def main() -> None:
    for name, args in EXAMPLES:
        (HERE / name).write_text(render(args))
        print(f"wrote examples/{name}", file=sys.stderr)
    sys.path.insert(0, str(HERE))
    from compare_bundled import table

    (HERE / "comparison.md").write_text(table())
    print("wrote examples/comparison.md", file=sys.stderr)
    (HERE / "help.txt").write_text(help_text())
    print("wrote examples/help.txt", file=sys.stderr)
    (HERE / "accuracy.txt").write_text(accuracy_table())
    print("wrote examples/accuracy.txt", file=sys.stderr)
    for path in sync_docs():
        print(f"updated the generated blocks of {path}", file=sys.stderr)


def accuracy_table() -> str:
    """`omni-autoconf bench accuracy tests/data/accuracy.jsonl`, as docs/accuracy.md shows it."""
    from omni_autoconf.cli.main import main as cli

    data = HERE.parent / "tests" / "data" / "accuracy.jsonl"
    result = CliRunner().invoke(cli, ["bench", "accuracy", str(data)], terminal_width=200)
    return result.stdout


def help_text() -> str:
    """`omni-autoconf --help` and `omni-autoconf check --help`, as docs/cli.md shows them."""
    from omni_autoconf.cli.main import main

    runner = CliRunner()
    return "\n".join(runner.invoke(main, [*cmd, "--help"], terminal_width=88, prog_name="omni-autoconf").stdout for cmd in ([], ["check"]))


def pipelines_table() -> str:
    """docs/pipelines.md's table: every entry of the model catalog, read from the catalog itself."""
    from omni_autoconf.inputs.catalog import model_catalog
    from omni_autoconf.vllm.facts import NEWEST_OMNI_VERSION, range_text

    catalog = model_catalog()
    roles = {"autoregressive": "AR", "generation": "generation", "diffusion": "diffusion"}

    def cell(text: str) -> str:
        return " ".join(str(text).split()).replace("|", "\\|")

    rows = []
    for spec in catalog.values():
        path = ROOT / "models" / f"{spec.name}.yaml"
        name = f"[`{spec.name}`](../models/{path.name})" if path.is_file() else f"`{spec.name}`"
        stages = " -> ".join(
            f"{s.name} ({roles[s.role]}, TP {'/'.join(map(str, s.tested_tp_degrees(NEWEST_OMNI_VERSION))) or '-'})"
            for s in spec.stages)
        legacy = range_text(spec.legacy_versions) if spec.legacy_versions else "-"
        key = f"`{spec.registry_key}`" if spec.registry_key else "-"
        rows.append(f"| {name} | {cell(spec.hf_id)} | {key} | {cell(stages)} | {range_text(spec.deploy_versions)} "
                    f"| {legacy} | {cell(spec.description)} |")
    diffusion = sum(any(s.role == "diffusion" for s in spec.stages) for spec in catalog.values())
    legacy_count = sum(spec.legacy_versions is not None for spec in catalog.values())
    columns = ["`--model`", "checkpoint", "pipeline key", "stages (role, TP)", "deploy files", "stage_args files",
               "what it loads"]
    summary = f"{len(catalog)} catalog entries: {diffusion} with a diffusion stage, {legacy_count} also planned as a"
    head = [
        f"{summary} stage_args file.",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    return "\n".join(head + rows) + "\n"


def _fenced(text: str) -> str:
    return "```text\n" + text + "```\n"


# (file, block name, what goes between its markers): the generated blocks that are no command's
# output; the comparison, accuracy and --help blocks are the example files main() has just written.
BLOCKS = [
    ("docs/pipelines.md", "pipelines", pipelines_table),
    ("docs/cpsat.md", "comparison", lambda: (HERE / "comparison.md").read_text()),
    ("docs/accuracy.md", "bench", lambda: _fenced((HERE / "accuracy.txt").read_text())),
    ("docs/cli.md", "help", lambda: _fenced((HERE / "help.txt").read_text())),
]

SAMPLE = re.compile(r"```text\n\$ (omni-autoconf [^\n]+)\n(.*?)```", re.DOTALL)


def block(text: str, name: str) -> str | None:
    """What lies between `<!-- name:start -->` and `<!-- name:end -->` (None: no such block)."""
    m = re.search(rf"<!-- {re.escape(name)}:start -->\n(.*?)<!-- {re.escape(name)}:end -->", text, re.DOTALL)
    return m.group(1) if m else None


def with_block(text: str, name: str, body: str) -> str:
    if block(text, name) is None:
        raise SystemExit(f"no <!-- {name}:start --> ... <!-- {name}:end --> block")
    return re.sub(rf"(<!-- {re.escape(name)}:start -->\n).*?(<!-- {re.escape(name)}:end -->)",
                  lambda m: m.group(1) + body + m.group(2), text, count=1, flags=re.DOTALL)


def doc_files() -> list[Path]:
    """README.md and the pages of docs/: where `$ omni-autoconf` samples may be."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def samples(text: str) -> list[str]:
    """The command lines of the `$ omni-autoconf ...` samples in `text`, in order."""
    return [m.group(1) for m in SAMPLE.finditer(text)]


def with_samples_rerun(text: str) -> str:
    """`text` with every `$ omni-autoconf ...` sample's output replaced by what the command prints
    now (stdout and stderr as a terminal shows them; an output that differs only in its solve
    time is kept), the commands run in order in one scratch folder."""
    from omni_autoconf.cli.main import main as cli

    runner = CliRunner()
    parts, pos = [], 0
    with _scratch_folder():
        for m in SAMPLE.finditer(text):
            result = runner.invoke(cli, shlex.split(m.group(1))[1:])
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                raise SystemExit(f"{m.group(1)} failed: {result.exception!r}")
            output = result.output if steady(result.output) != steady(m.group(2)) else m.group(2)
            parts.append(text[pos:m.start(2)] + output)
            pos = m.end(2)
    return "".join(parts) + text[pos:]


@contextmanager
def _scratch_folder() -> Iterator[None]:
    """Run in an empty temporary folder, then come back."""
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        try:
            yield
        finally:
            os.chdir(here)


def steady(text: str) -> str:
    """A sample's text without what changes from run to run (the solve time)."""
    return re.sub(r"solved in [0-9.]+ s", "solved in - s", text)


def sync_docs() -> list[str]:
    """Write the current generated blocks into README.md and docs/; the files changed."""
    texts = {path: path.read_text() for path in doc_files()}
    new = dict(texts)
    for rel, name, body in BLOCKS:
        path = ROOT / rel
        new[path] = with_block(new.get(path) if path in new else path.read_text(), name, body())
    for path, text in new.items():
        if samples(text):
            new[path] = with_samples_rerun(text)
    changed = []
    for path, text in new.items():
        if text != texts.get(path):
            path.write_text(text)
            changed.append(str(path.relative_to(ROOT)))
    return changed


if __name__ == "__main__":
    main()

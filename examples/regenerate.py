"""Regenerate the example outputs in this folder (`make examples`).

tests/test_examples.py re-runs every entry and fails when a file here is stale, so the
examples always show what the current code writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from click.testing import CliRunner

HERE = Path(__file__).resolve().parent

# (file, omni-autoconf arguments): the three commands of the README, the one-card 3B, the
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
    sync_readme()
    print("updated the generated blocks of README.md", file=sys.stderr)


def accuracy_table() -> str:
    """`omni-autoconf bench accuracy tests/data/accuracy.jsonl`, as the README shows it."""
    from omni_autoconf.cli.main import main as cli

    data = HERE.parent / "tests" / "data" / "accuracy.jsonl"
    result = CliRunner().invoke(cli, ["bench", "accuracy", str(data)], terminal_width=200)
    return result.stdout


def sync_readme() -> None:
    """Put the current comparison table, --help text and no-plan sample into the README."""
    import re
    import shlex

    from click.testing import CliRunner

    from omni_autoconf.cli.main import main as cli

    path = HERE.parent / "README.md"
    text = path.read_text()
    comparison = (HERE / "comparison.md").read_text()
    text = re.sub(r"\| stage \| config \|.*?requests of 65536 tokens\.\n", lambda m: comparison, text, count=1, flags=re.S)
    text = re.sub(r"```text\nUsage: omni-autoconf \[OPTIONS\].*?```", lambda m: "```text\n" + help_text() + "```", text,
                  count=1, flags=re.S)
    text = re.sub(r"(<!-- bench:start -->\n```text\n).*?(```\n<!-- bench:end -->)",
                  lambda m: m.group(1) + (HERE / "accuracy.txt").read_text() + m.group(2), text, count=1, flags=re.S)
    m = re.search(r"```text\n\$ (omni-autoconf [^\n]+)\n(.*?)```", text, re.S)
    sample = CliRunner().invoke(cli, shlex.split(m.group(1))[1:]).stderr
    text = text[:m.start(2)] + sample + text[m.end(2):]
    path.write_text(text)


def help_text() -> str:
    """`omni-autoconf --help` and `omni-autoconf check --help`, as the README shows them."""
    from omni_autoconf.cli.main import main

    runner = CliRunner()
    return "\n".join(runner.invoke(main, [*cmd, "--help"], terminal_width=88, prog_name="omni-autoconf").stdout for cmd in ([], ["check"]))


if __name__ == "__main__":
    main()

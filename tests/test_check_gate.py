"""`check` as a CI gate (issue 21 section 2): unknown keys, declared fractions over 1.0, --fix
agreeing with check, --strict, GitHub annotations, JUnit XML, the pre-commit hook, and -o for a
multi-host plan.

Also how solver/data/stage_keys.yaml is made: `python tests/test_check_gate.py OMNI_ROOT VLLM_WHEEL`
(OMNI_ROOT: an unpacked vllm-omni 0.30.0 wheel; VLLM_WHEEL: the vllm 0.30.0 wheel file) prints it.
"""

from __future__ import annotations

import ast
import json
import os
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from omni_autoconf.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
TTS = ("--gpus", "1xRTX4090", "--model", "qwen3-tts-0.6b")


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def write(tmp_path, text: str, name: str = "deploy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


TYPO = """\
stages:
  - stage_id: 0
    devices: "0"
    gpu_memory_utilizaton: 0.5
    max_num_seqs: 8
  - stage_id: 1
    devices: "0"
    gpu_memory_utilization: 0.2
    engine_args:
      enforce_eagre: true
"""

OVER_ONE = """\
stages:
  - stage_id: 0
    devices: "0"
    gpu_memory_utilization: 0.6
  - stage_id: 1
    devices: "0"
    gpu_memory_utilization: 0.6
"""


# --- 1. unknown keys --------------------------------------------------------------------------


def test_a_misspelled_key_is_an_unknown_key_warning_naming_stage_and_closest_key(tmp_path):
    result = run("check", write(tmp_path, TYPO), *TTS, "--format", "json")
    data = json.loads(result.stdout)
    found = {(p["stage"], p["severity"]): p for p in data["problems"] if p["code"] == "unknown-key"}
    talker = found[("talker", "warning")]
    assert "gpu_memory_utilizaton" in talker["message"] and "gpu_memory_utilization" in talker["message"]
    assert talker["line"] == 4
    code2wav = found[("code2wav", "warning")]
    assert "enforce_eagre" in code2wav["message"] and "enforce_eager" in code2wav["message"]
    assert code2wav["line"] == 10
    assert len([p for p in data["problems"] if p["code"] == "unknown-key"]) == 2  # devices, max_num_seqs are known


def test_the_bundled_deploy_files_of_0_30_hold_no_unknown_key_but_the_dead_ones():
    """Every key of vLLM-Omni 0.30.0's own deploy files is known, except two that its 0.30 loader
    passes to OmniEngineArgs, which drops them with a warning (vllm_omni 0.30.0
    entrypoints/utils.py filter_dataclass_kwargs: "Dropping unknown ... field")."""
    from wheels import wheel_root

    from omni_autoconf.inputs.configfile import read_config
    from omni_autoconf.planning.check import unknown_keys
    from omni_autoconf.vllm.facts import omni_version

    found = set()
    for path in sorted((wheel_root("0.30") / "vllm_omni" / "deploy").glob("*.yaml")):
        text = path.read_text()
        if "stages:" not in text or "forced_aligner:" in text:
            continue
        try:
            config = read_config(str(path))
        except Exception:  # a file this tool cannot judge (not modelled) is no part of this test
            continue
        found |= {(key, path.name) for _, key, _, _ in unknown_keys(config, omni_version("0.30"))}
    assert {k for k, _ in found} <= {"is_comprehension", "final_output_type"}, found


def _fields(text: str, cls: str) -> set[str]:
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                    and "ClassVar" not in ast.unparse(n.annotation)}
    raise LookupError(cls)


def _frozenset(text: str, name: str) -> set[str]:
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return set(ast.literal_eval(node.value.args[0]))
    raise LookupError(name)


def derive_keys(omni_root: Path, vllm_arg_utils: str) -> dict[str, list[str]]:
    """The known keys as derived from the wheels (the generator of solver/data/stage_keys.yaml)."""
    stage_config = (omni_root / "vllm_omni/config/stage_config.py").read_text()
    omni_args = (omni_root / "vllm_omni/engine/arg_utils.py").read_text()
    diffusion = (omni_root / "vllm_omni/diffusion/data.py").read_text()
    return {
        "top_level": sorted(_fields(stage_config, "DeployConfig") | {"base_config"}),
        "stage": sorted(_fields(stage_config, "StageDeployConfig") | _frozenset(stage_config, "_STAGE_RESERVED_KEYS")),
        "engine_args": sorted(_fields(vllm_arg_utils, "EngineArgs") | _fields(vllm_arg_utils, "AsyncEngineArgs")
                              | _fields(omni_args, "OmniEngineArgs")),
        "diffusion": sorted(_fields(diffusion, "OmniDiffusionConfig")),
    }


def _vllm_wheel() -> Path | None:
    for folder in (os.environ.get("OMNI_AUTOCONF_VLLM_WHEELS"), ROOT / ".cache"):
        if folder:
            found = sorted(p for p in Path(folder).glob("vllm-0.30.0-*.whl") if p.is_file())
            if found:
                return found[0]
    return None


def test_the_stored_keys_are_what_the_0_30_wheels_declare():
    from wheels import wheel_root

    stored = yaml.safe_load((ROOT / "solver/data/stage_keys.yaml").read_text())["versions"]["0.30"]
    wheel = _vllm_wheel()
    if wheel is None:  # the vllm wheel is 300 MB: the vllm-omni part is still compared
        omni = derive_keys(wheel_root("0.30"), "class EngineArgs:\n    x: int\nclass AsyncEngineArgs:\n    y: int\n")
        for part in ("top_level", "stage", "diffusion"):
            assert stored[part] == omni[part], part
        assert set(omni["engine_args"]) - {"x", "y"} <= set(stored["engine_args"])
        pytest.skip("no vllm 0.30.0 wheel in .cache/ or $OMNI_AUTOCONF_VLLM_WHEELS: EngineArgs not compared")
    with zipfile.ZipFile(wheel) as zf:
        arg_utils = zf.read("vllm/engine/arg_utils.py").decode()
    derived = derive_keys(wheel_root("0.30"), arg_utils)
    assert {k: stored[k] for k in derived} == derived


# --- 2. declared fractions over 1.0 --------------------------------------------------------------


def test_declared_fractions_over_one_gpu_are_reported_with_each_fraction(tmp_path):
    path = write(tmp_path, OVER_ONE)
    data = json.loads(run("check", path, *TTS, "--format", "json").stdout)
    over = [p for p in data["problems"] if p["code"] == "declared-sum-over-one"]
    assert len(over) == 1 and over[0]["gpu"] == 0 and over[0]["severity"] == "warning"
    text = over[0]["message"]
    assert "talker 0.6" in text and "code2wav 0.6" in text and "1.2" in text and "RTX4090" in text
    assert "parallel_stage_init" in text and "caps" in text
    table = run("check", path, *TTS)
    assert "declared-sum-over-one" in table.stdout
    # stages declared never co-resident may sum past 1.0
    apart = json.loads(run("check", path, *TTS, "--exclusive", "talker,code2wav", "--format", "json").stdout)
    assert "declared-sum-over-one" not in {p["code"] for p in apart["problems"]}


# --- 3. --fix agrees with check ------------------------------------------------------------------


OMNI = """\
stages:
  - stage_id: 0
    devices: "0"
    gpu_memory_utilization: 0.9
  - stage_id: 1
    devices: "1"
    gpu_memory_utilization: 0.6
    max_num_seqs: 16
  - stage_id: 2
    devices: "1"
    gpu_memory_utilization: 0.1
"""


def test_fix_pins_only_what_the_file_sets(tmp_path):
    """The file sets no max_num_batched_tokens: check judges code2wav with vLLM's defaults and
    --fix must not pin them (they clash with the chunked prefill the written file turns off)."""
    path = write(tmp_path, OMNI)
    checked = run("check", path, "--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "--format", "json")
    assert json.loads(checked.stdout)["stages"][2]["started"]
    out = tmp_path / "fixed.yaml"
    fixed = run("check", path, "--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "--fix", "-o", out, "-q")
    assert fixed.exit_code == 0, fixed.stderr
    text = out.read_text()
    inputs = text.splitlines()[1]
    assert "--max-num-batched-tokens" not in inputs and "--max-num-seqs talker=16" in inputs
    assert yaml.safe_load(text)["stages"][1]["max_num_seqs"] == 16


# --- 4. --strict, --format github / junit, pre-commit --------------------------------------------


def test_strict_turns_warnings_into_exit_1(tmp_path):
    path = write(tmp_path, OVER_ONE)
    assert run("check", path, *TTS).exit_code == 0
    strict = run("check", path, *TTS, "--strict")
    assert strict.exit_code == 1 and "declared-sum-over-one" in strict.stdout


def test_github_annotations_carry_file_line_and_severity(tmp_path):
    path = write(tmp_path, TYPO)
    result = run("check", path, *TTS, "--format", "github")
    lines = result.stdout.splitlines()
    assert f"::warning file={path},line=4,title=unknown-key (talker)::" in "\n".join(lines)
    assert any(line.startswith(f"::warning file={path},line=10,title=unknown-key (code2wav)::") for line in lines)
    assert all(line.startswith(("::warning ", "::error ", "::notice ")) for line in lines), lines
    broken = write(tmp_path, TYPO.replace("max_num_seqs: 8", "max_num_seqs: 8\n    max_model_len: 9999999"), "b.yaml")
    errors = run("check", broken, *TTS, "--format", "github")
    assert errors.exit_code == 1
    assert any(line.startswith(f"::error file={broken},line=2,") for line in errors.stdout.splitlines())
    from omni_autoconf.emit.check_github import escape_data, escape_property

    assert escape_data("a%b\r\nc") == "a%25b%0D%0Ac" and escape_property("a:b,c") == "a%3Ab%2Cc"


def test_junit_report_is_one_suite_one_case_per_stage_failures_for_errors(tmp_path):
    path = write(tmp_path, TYPO)
    result = run("check", path, *TTS, "--format", "junit")
    suite = ET.fromstring(result.stdout)
    assert suite.tag == "testsuite" and suite.get("tests") == "2"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["0 talker", "1 code2wav"]
    failed = {c.get("name") for c in cases if c.find("failure") is not None}
    assert int(suite.get("failures")) == len(failed)
    assert result.exit_code == (1 if failed else 0)
    ok = run("check", write(tmp_path, OVER_ONE, "ok.yaml"), *TTS, "--format", "junit")
    assert ok.exit_code == 0 and ET.fromstring(ok.stdout).get("failures") == "0"
    strict = run("check", tmp_path / "ok.yaml", *TTS, "--format", "junit", "--strict")
    assert strict.exit_code == 1 and int(ET.fromstring(strict.stdout).get("failures")) >= 1


def test_pre_commit_hook_runs_check_on_each_file_it_is_given(tmp_path):
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    hook = next(h for h in hooks if h["id"] == "omni-autoconf-check")
    assert hook["entry"] == "omni-autoconf check" and hook["language"] == "python"
    import re

    assert re.search(hook["files"], "vllm_omni/deploy/qwen3_tts.yaml") and not re.search(hook["files"], "README.md")
    # pre-commit passes every matching file: check takes several, and exits with the worst
    good, bad = write(tmp_path, OVER_ONE, "good.yaml"), write(tmp_path, OVER_ONE.replace("0.6", "0.01"), "bad.yaml")
    both = run("check", good, bad, *TTS)
    assert both.exit_code == 1 and str(good) in both.stdout and str(bad) in both.stdout
    assert run("check", good, good, *TTS).exit_code == 0


# --- 5. -o for a multi-host plan ------------------------------------------------------------------


def test_a_multi_host_plan_needs_a_folder_path(tmp_path):
    target = tmp_path / "plan.yaml"
    result = run("--nodes", "2", "--gpus", "4xH100-80GB", "--model", "qwen3-omni-moe", "-o", target, "-q")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "ending in /" in result.stderr and not target.exists()
    new = f"{tmp_path / 'plan'}/"
    assert run("--nodes", "2", "--gpus", "4xH100-80GB", "--model", "qwen3-omni-moe", "-o", new, "-q").exit_code == 0
    assert run("--nodes", "2", "--gpus", "4xH100-80GB", "--model", "qwen3-omni-moe", "-o", tmp_path / "plan",
               "-q").exit_code == 0  # an existing folder


if __name__ == "__main__":
    import sys

    with zipfile.ZipFile(sys.argv[2]) as zf:
        keys = derive_keys(Path(sys.argv[1]), zf.read("vllm/engine/arg_utils.py").decode())
    print(yaml.safe_dump({"versions": {"0.30": keys}}, sort_keys=False, width=120), end="")


def test_an_unknown_key_like_no_known_one_gets_no_guess(tmp_path):
    text = TYPO.replace("gpu_memory_utilizaton: 0.5", "zq%xw: 0.5")
    data = json.loads(run("check", write(tmp_path, text), *TTS, "--format", "json").stdout)
    talker = next(p for p in data["problems"] if p["code"] == "unknown-key" and p["stage"] == "talker")
    assert "zq%xw" in talker["message"] and "did you mean" not in talker["message"]

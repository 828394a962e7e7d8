"""`omni-autoconf check`: reading configs, simulating start-up, problem codes, --fix."""

from __future__ import annotations

import shlex
import textwrap
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from omni_autoconf.inputs.catalog import lookup_model
from omni_autoconf.cli.main import main
from omni_autoconf.inputs.configfile import read_config
from omni_autoconf.errors import InputError
from omni_autoconf.inputs.gpus import parse_gpus
from omni_autoconf.planning.check import check_config
from omni_autoconf.vllm.facts import omni_version

DATA = Path(__file__).parent / "data"
BUNDLED = DATA / "qwen3_omni_moe.deploy-0.30.yaml"
LEGACY = DATA / "qwen3_omni_moe.legacy.yaml"
QWEN3 = lookup_model("qwen3-omni-moe")


def run(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def check(path, gpus="2xH100-80GB", version=None, **kw):
    """The check of a file; legacy files on 0.24, the newest version that reads them and caps."""
    config = read_config(str(path))
    version = version or ("0.24" if config.schema == "stage-args" else "0.30")
    return check_config(QWEN3, parse_gpus(gpus), omni_version(version), config, **kw)


def codes(report):
    return [(p.code, p.stage, p.gpu) for p in report.errors]


def deploy(tmp_path, stages: list[dict], name="cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"stages": stages}))
    return path


def three(thinker: dict, talker: dict | None = None, code2wav: dict | None = None) -> list[dict]:
    return [
        {"stage_id": 0, **thinker},
        {"stage_id": 1, "devices": "1", "gpu_memory_utilization": 0.3, **(talker or {})},
        {"stage_id": 2, "devices": "1", "gpu_memory_utilization": 0.1, **(code2wav or {})},
    ]


def legacy_talker_at(util: float, tmp_path) -> Path:
    text = LEGACY.read_text().replace("gpu_memory_utilization: 0.3", f"gpu_memory_utilization: {util}")
    path = tmp_path / "legacy.yaml"
    path.write_text(text)
    return path


# --- acceptance ----------------------------------------------------------------------


def test_bundled_config_starts_on_two_h100_and_reports_kv():
    result = run("check", BUNDLED, "--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "--format", "json")
    assert result.exit_code == 0, result.stdout
    import json

    data = json.loads(result.stdout)
    assert data["ok"] and [p for p in data["problems"] if p["severity"] == "error"] == []
    kv = {s["name"]: s["kv_cache_tokens"] for s in data["stages"]}
    assert kv["thinker"] >= 65536 and kv["talker"] > kv["thinker"]


def test_bundled_config_on_two_a100_40gb_fails_on_thinker_gpu0():
    result = run("check", BUNDLED, "--gpus", "2xA100-40GB", "--model", "qwen3-omni-moe")
    assert result.exit_code == 1
    first = check(BUNDLED, "2xA100-40GB").problems[0]
    assert (first.stage, first.gpu) == ("thinker", 0)
    assert "thinker GPU 0" in result.stdout


def test_legacy_talker_at_06_is_capped_or_refused_on_gpu1(tmp_path):
    path = legacy_talker_at(0.6, tmp_path)
    # capped to all that is free, it leaves nothing for what the worse KV reading of 0.24 holds outside
    assert codes(check(path)) == [("free-memory-capped", "talker", 1), ("gpu-oversubscribed", None, 1)]
    assert codes(check(path, upstream=True)) == [("startup-refused", "talker", 1)]
    result = run("check", path, "--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "--omni-version", "0.24")
    assert result.exit_code == 1 and "[free-memory-capped] talker GPU 1" in result.stdout
    result = run("check", path, "--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "--omni-version", "0.24",
                 "--upstream")
    assert result.exit_code == 1 and "[startup-refused] talker GPU 1" in result.stdout
    assert "Decrease GPU memory utilization" in result.stdout  # vLLM's own words


def test_unchanged_legacy_file_starts():
    assert check(LEGACY).ok


def test_t4_has_no_plan_and_the_fix_is_many_t4s_at_an_untested_tp():
    # The thinker fits 15 GiB cards only at TP 8, which no upstream config runs; with up to 1,024
    # GPUs planned (defaults.MAX_GPUS), the fix search finds that inventory and says it is untested.
    result = run("--gpus", "1xT4", "--model", "qwen3-omni-moe", "--time-limit", "60")
    assert result.exit_code == 1
    commands = [line.strip() for line in result.stderr.splitlines() if line.strip().startswith("omni-autoconf --")]
    assert commands and all("xT4" in c for c in commands), result.stderr
    assert any("--allow-untested-tp" in c for c in commands)
    assert run(*shlex.split(commands[-1])[1:], "-q").exit_code == 0


def test_every_printed_fix_command_gives_a_plan():
    result = run("--gpus", "2xA100-40GB", "--model", "qwen3-omni-moe", "-q")
    assert result.exit_code == 1
    commands = [line.strip() for line in result.stderr.splitlines() if line.strip().startswith("omni-autoconf --")]
    assert commands, result.stderr
    for command in commands:
        args = shlex.split(command)[1:]
        assert run(*args, "-q").exit_code == 0, command


def test_shorter_context_and_fp8_fixes_are_found_and_work():
    # One H200 holds all three stages, but not 12 requests of 65536 tokens for both (the length
    # named, so that the planner may not shorten it on its own: planning/knobs.py)
    result = run("--gpus", "1xH200", "--model", "qwen3-omni-moe", "--min-concurrency", "12", "--max-model-len", "65536",
                 "--format", "json", "-q")
    assert result.exit_code == 1
    import json

    data = json.loads(result.stdout)
    kinds = [f["kind"] for f in data["fixes"]]
    assert "fewer-requests" in kinds and "fp8-kv-cache" in kinds
    assert kinds.index("fp8-kv-cache") < kinds.index("fewer-requests")  # the smaller change first
    assert {c["group"] for c in data["conflict"]} >= {"capacity", "min-concurrency"}
    for fix in data["fixes"]:
        assert run(*shlex.split(fix["command"])[1:], "-q").exit_code == 0, fix["command"]


# --- each problem code ----------------------------------------------------------------


@pytest.mark.parametrize(
    "stages, gpus, kw, expected",
    [
        (three({"devices": "0,5", "tensor_parallel_size": 2}), "2xH100", {}, ("unknown-device", "thinker", 5)),
        (three({"devices": "0", "tensor_parallel_size": 2}), "2xH100", {}, ("tp-mismatch", "thinker", None)),
        (three({"devices": "0,1,2", "tensor_parallel_size": 3}), "4xH100", {}, ("tp-not-divisible", "thinker", None)),
        (three({"devices": "0", "gpu_memory_utilization": 0.97}), "2xH100", {"parallel_init": True},
         ("admission-exceeded", None, 0)),
        (three({"devices": "0,1", "tensor_parallel_size": 2, "gpu_memory_utilization": 0.4}), "2xH100", {},
         ("no-kv-memory", "thinker", 0)),
        (three({"devices": "0,1", "tensor_parallel_size": 2, "gpu_memory_utilization": 0.46}), "2xH100", {},
         ("kv-below-max-model-len", "thinker", 0)),
        (three({"devices": "0"}), "2xA100-40GB", {}, ("load-oom", "thinker", 0)),
        (three({"devices": "0", "gpu_memory_utilization": 0.6}, {"gpu_memory_utilization": 0.95}), "2xH100", {},
         ("gpu-oversubscribed", None, 1)),
    ],
    ids=["unknown-device", "tp-mismatch", "tp-not-divisible", "admission-exceeded", "no-kv-memory",
         "kv-below-max-model-len", "load-oom", "gpu-oversubscribed"],
)
def test_problem_codes(tmp_path, stages, gpus, kw, expected):
    report = check(deploy(tmp_path, stages), gpus, **kw)
    assert expected in codes(report), codes(report)


def test_capped_stage_gets_less_kv_than_it_asked_for(tmp_path):
    path = legacy_talker_at(0.6, tmp_path)
    talker = check(path).stages[1]
    assert talker.started and talker.budget_bytes_per_gpu[1] < talker.requested_bytes


# --- reading configs ------------------------------------------------------------------


def test_base_config_inheritance_and_platform_overrides(tmp_path):
    (tmp_path / "base.yaml").write_text(textwrap.dedent("""
        stages:
          - {stage_id: 0, devices: "0", gpu_memory_utilization: 0.5, max_num_seqs: 8}
          - {stage_id: 1, devices: "1", gpu_memory_utilization: 0.3}
          - {stage_id: 2, devices: "1", gpu_memory_utilization: 0.1}
        platforms:
          cuda:
            stages:
              - {stage_id: 2, gpu_memory_utilization: 0.05}
    """))
    (tmp_path / "child.yaml").write_text(textwrap.dedent("""
        base_config: base.yaml
        stages:
          - {stage_id: 0, gpu_memory_utilization: 0.9}
        platforms:
          cuda:
            stages:
              - {stage_id: 1, devices: "0", enforce_eager: true}
          npu:
            stages:
              - {stage_id: 0, devices: "0,1", tensor_parallel_size: 2}
    """))
    cfg = read_config(str(tmp_path / "child.yaml"))
    s0, s1, s2 = cfg.stages
    assert (s0.devices, s0.gpu_memory_utilization, s0.max_num_seqs) == ((0,), 0.9, 8)
    assert (s1.devices, s1.enforce_eager) == ((0,), True)
    assert s2.gpu_memory_utilization == 0.05
    npu = read_config(str(tmp_path / "child.yaml"), platform="npu")
    assert npu.stages[0].tensor_parallel_size == 2 and npu.stages[1].devices == (1,)


def test_bundled_platform_sections_are_applied():
    cuda, npu = read_config(str(BUNDLED)), read_config(str(BUNDLED), platform="npu")
    assert cuda.stages[0].devices == (0,) and cuda.stages[0].gpu_memory_utilization == 0.9
    assert npu.stages[0].devices == (0, 1) and npu.stages[0].tensor_parallel_size == 2


def test_legacy_schema_is_read():
    cfg = read_config(str(LEGACY))
    assert cfg.schema == "stage-args"
    assert cfg.stages[0].devices == (0, 1) and cfg.stages[0].tensor_parallel_size == 2
    assert cfg.stages[0].enforce_eager is True and cfg.stages[0].max_num_seqs == 1


def test_absent_fields_get_vllm_defaults(tmp_path):
    path = deploy(tmp_path, [{"stage_id": 0, "devices": "0"}, {"stage_id": 1, "devices": "1"},
                             {"stage_id": 2, "devices": "1", "gpu_memory_utilization": 0.1}])
    report = check(path)
    thinker = report.stages[0].run
    assert thinker.gpu_memory_utilization == 0.92  # vLLM 0.20+'s default (0.9 before)
    assert thinker.knobs.max_model_len == 65536  # the model's maximum position
    assert check(path, version="0.18").stages[0].run.gpu_memory_utilization == 0.9


@pytest.mark.parametrize(
    "text, needle",
    [
        ("stages: [", "not valid YAML"),
        ("hello: 1\n", "neither a deploy config"),
        ("stages:\n  - {stage_id: 0, devices: 'a,b'}\n", "GPU indices"),
        ("stages:\n  - {stage_id: 0, gpu_memory_utilization: lots}\n", "not a number"),
    ],
)
def test_bad_config_files_are_input_errors(tmp_path, text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=needle):
        read_config(str(path))
    result = run("check", path, "--gpus", "2xH100", "--model", "qwen3-omni-moe")
    assert result.exit_code == 2 and "Traceback" not in result.stderr


def test_missing_stage_and_missing_file_exit_2(tmp_path):
    path = deploy(tmp_path, [{"stage_id": 0, "devices": "0"}])
    result = run("check", path, "--gpus", "2xH100", "--model", "qwen3-omni-moe")
    assert result.exit_code == 2 and "no stage 1 (talker)" in result.stderr
    result = run("check", tmp_path / "nope.yaml", "--gpus", "2xH100", "--model", "qwen3-omni-moe")
    assert result.exit_code == 2 and "cannot read" in result.stderr


# --- --fix ----------------------------------------------------------------------------


def test_fix_keeps_pinned_devices_and_the_fixed_file_starts(tmp_path):
    broken = legacy_talker_at(0.6, tmp_path)
    out = tmp_path / "fixed.yaml"
    result = run("check", broken, "--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "--omni-version", "0.24",
                 "--fix", "-o", out)
    assert result.exit_code == 0, result.stderr
    assert "gain" in result.stderr
    fixed = read_config(str(out))
    assert fixed.schema == "stage-args"
    assert [s.devices for s in fixed.stages] == [(0, 1), (1,), (0,)]  # pinned by the file
    assert check(out).ok


def test_fix_with_keep_none_may_move_stages(tmp_path):
    broken = legacy_talker_at(0.6, tmp_path)
    args = ("check", broken, "--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "--omni-version", "0.24", "--fix", "-q")
    pinned = run(*args)
    free = run(*args, "--keep", "none")
    assert pinned.exit_code == free.exit_code == 0
    assert pinned.stdout != free.stdout


def test_a_pinned_stage_holds_its_pin_not_its_fraction(tmp_path):
    """With kv_cache_memory_bytes vLLM takes that KV and sizes nothing from the fraction
    (vllm_omni 0.30.0 worker/base.py determine_available_memory)."""
    bundled = DATA / "qwen3_omni_moe.deploy-0.30.yaml"
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text(bundled.read_text().replace("gpu_memory_utilization: 0.9",
                                                  "gpu_memory_utilization: 0.9\n    kv_cache_memory_bytes: 4294967296", 1))
    assert "kv_cache_memory_bytes" in pinned.read_text()
    plain, pin = check(bundled, "2xH100-80GB"), check(pinned, "2xH100-80GB")
    assert pin.stages[0].kv_cache_bytes == 4 * 2**30
    assert pin.startup.gpus[0].used_bytes < plain.startup.gpus[0].used_bytes - 20 * 2**30


def test_dtype_bfloat16_on_a_gpu_below_compute_capability_8_is_refused_by_plan_and_check():
    """vLLM raises "Bfloat16 is only supported on GPUs with compute capability of at least
    8.0" (vllm 0.30.0 platforms/cuda.py); a bf16 model under dtype auto runs in fp16 there."""
    from wheels import wheel_root

    refused = run("--gpus", "1xT4", "--model", "qwen3-tts-1.7b", "-q")
    assert refused.exit_code == 2 and "refuses bfloat16 on T4" in refused.stderr
    assert run("--gpus", "1xT4", "--model", "moss-tts-nano", "-q").exit_code == 0  # writes no dtype
    deploy = wheel_root("0.30") / "vllm_omni" / "deploy"
    tts = check_config(lookup_model("qwen3-tts-1.7b"), parse_gpus("1xT4"), omni_version("0.30"),
                       read_config(str(deploy / "qwen3_tts.yaml")))
    assert ("engine-config-invalid", "code2wav", 0) in codes(tts)
    # a pipeline-wide dtype reaches every stage (vllm_omni 0.30.0 config/stage_config.py)
    gepard = check_config(lookup_model("gepard-1.0"), parse_gpus("1xV100-32GB"), omni_version("0.30"),
                          read_config(str(deploy / "gepard.yaml")))
    assert ("engine-config-invalid", "gepard", 0) in codes(gepard)
    on_l4 = check_config(lookup_model("gepard-1.0"), parse_gpus("1xL4"), omni_version("0.30"),
                         read_config(str(deploy / "gepard.yaml")))
    assert not [p for p in on_l4.problems if p.code == "engine-config-invalid"]

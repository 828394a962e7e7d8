"""plan -> file -> check: the tool's own check accepts every plan it writes, with the same KV.

Over a grid of catalog models, inventories (1-8 GPUs, mixed kinds) and options
(exclusive stages, pins, buffers, fp8 KV, both schemas), `check` with the same flags
finds no problem and no warning, and predicts exactly the KV the plan reports. The grid's
cells where no plan fits are listed (NO_PLAN) and asserted to be proven infeasible instead;
three plans also go round through the command line.
"""

from __future__ import annotations

import itertools
import json

import pytest
from click.testing import CliRunner

from omni_autoconf.cli.main import main
from omni_autoconf.planning.check import check_config
from omni_autoconf.inputs.configfile import read_config
from omni_autoconf.errors import InputError, NoPlanError
from omni_autoconf.planning.planner import plan
from omni_autoconf.emit.render import RENDERERS
from omni_autoconf.vllm.facts import MiB

from conftest import make_request

MODELS = ["qwen3-omni-moe", "qwen2.5-omni-7b", "qwen2.5-omni-3b"]
INVENTORIES = ["1xH200", "2xH100-80GB", "1xH100-80GB,1xA100-80GB", "2xA100-80GB,1xL40S", "4xL40S",
               "1xB200,2xRTX4090", "8xH100-80GB"]
OPTIONS = {
    "defaults": {},
    "exclusive": {"exclusive": (("thinker", "code2wav"),)},
    "pinned": {"devices": {"code2wav": (0,)}, "tp": {"thinker": 1}},
    "buffer": {"buffer_gib": 3.25},
    "fp8": {"kv_cache_dtype": "fp8"},
    "legacy": {"version": "0.22", "schema": "stage-args"},
    "short": {"max_model_len": {"thinker": 8192, "talker": 8192}, "min_concurrency": {"thinker": 2, "talker": 2}},
}
# the pipelines with other stage names or one version: the options that name no stage
OTHER_MODELS = ["qwen3-omni-moe-thinking", "qwen3-tts-1.7b", "qwen3-tts-0.6b", "bagel-7b-mot", "bagel-7b-mot-think",
                "bagel-7b-mot-single-stage", "step-audio-2-mini-asr", "step-audio-2-mini", "moss-tts-nano",
                "voxtral-4b-tts", "glm-tts", "fish-s2-pro", "gepard-1.0", "voxcpm2",
                "audio8-tts-0.6b", "indextts-2", "indextts-2.5",
                "higgs-audio-v2", "cosyvoice3-0.5b", "moss-tts", "omnivoice",
                "minimax-music3", "personaplex-7b", "moss-tts-realtime", "pi0",
                "pi05", "gr00t-n1.7-3b", "wan2.2-ti2v-5b",
                "glm-image", "ming-tts-0.5b", "ming-tts-16.8b-a3b",
                "cosmos3-nano", "cosmos3-nano-policy-droid", "lance-3b", "dreamzero-droid", "auk",
                "lingbot-world-v2-14b", "hunyuanvideo-1.5-480p-t2v",
                "moss-tts-local-1.5", "higgs-audio-v3-4b", "audex-tts-2b", "audex-tts-30b-a3b", "audex-s2s-30b-a3b",
                "breeze-tts-2", "nemotron-voicechat-11b", "minicpmo-4.5",
                "ming-flash-omni-2.0", "mammothmoda2-preview"]
GRID = list(itertools.product(MODELS, INVENTORIES, sorted(OPTIONS))) + list(
    itertools.product(OTHER_MODELS, INVENTORIES, ["buffer", "defaults", "fp8"]))
ANY = ("buffer", "defaults", "fp8")  # every option OTHER_MODELS are run with
# The cells where no plan fits (model -> inventory -> options): CP-SAT proves them infeasible,
# except Ming-flash-omni on fewer than 4 GPUs, refused before solving (its thinker runs at TP 4 only).
# Each is asserted to have no plan; every other cell must plan.
NO_PLAN = {
    "qwen3-omni-moe": {"4xL40S": ("pinned",)},
    "wan2.2-ti2v-5b": {"4xL40S": ANY},
    "glm-image": {"4xL40S": ANY},
    "cosmos3-nano": {"4xL40S": ANY},
    "dreamzero-droid": {"2xH100-80GB": ("buffer",), "1xH100-80GB,1xA100-80GB": ("buffer",),
                        "2xA100-80GB,1xL40S": ("buffer",), "4xL40S": ANY, "8xH100-80GB": ("buffer",)},
    "lingbot-world-v2-14b": dict.fromkeys(["2xH100-80GB", "1xH100-80GB,1xA100-80GB", "2xA100-80GB,1xL40S", "4xL40S",
                                           "8xH100-80GB"], ANY),
    "hunyuanvideo-1.5-480p-t2v": dict.fromkeys(["2xH100-80GB", "1xH100-80GB,1xA100-80GB", "2xA100-80GB,1xL40S",
                                                "4xL40S", "8xH100-80GB"], ANY),
    "audex-tts-30b-a3b": {"4xL40S": ANY},
    "audex-s2s-30b-a3b": {"4xL40S": ANY},
    "ming-flash-omni-2.0": dict.fromkeys(["1xH200", "2xH100-80GB", "1xH100-80GB,1xA100-80GB", "2xA100-80GB,1xL40S",
                                          "4xL40S", "1xB200,2xRTX4090"], ANY),
    "mammothmoda2-preview": {"4xL40S": ANY},
}
NO_PLAN_CELLS = {(m, g, o) for m, inventories in NO_PLAN.items() for g, options in inventories.items() for o in options}
PLANNED = [case for case in GRID if case not in NO_PLAN_CELLS]
UNPLANNED = [case for case in GRID if case in NO_PLAN_CELLS]


def _plan(model, gpus, option):
    kw = dict(OPTIONS[option])
    version = kw.pop("version", "0.30")
    try:
        return plan(make_request(model, gpus, version, time_limit_s=60, **kw))
    except NoPlanError as exc:
        assert exc.status == "infeasible", exc.message  # never a time-limit "no plan" here
        return None
    except InputError as exc:  # an inventory with fewer GPUs than a stage's only TP degree
        assert "needs tensor_parallel_size" in str(exc), str(exc)
        return None


@pytest.mark.parametrize("model, gpus, option", PLANNED, ids=["|".join(case) for case in PLANNED])
def test_check_accepts_the_plan_it_was_written_from(tmp_path, model, gpus, option):
    result = _plan(model, gpus, option)
    assert result is not None, "no plan fits (proven): if that is right now, the cell belongs in NO_PLAN"
    request = result.request
    path = tmp_path / "plan.yaml"
    path.write_text(RENDERERS[request.schema](result))
    report = check_config(request.pipeline, list(request.gpus), request.version, read_config(str(path)),
                          parallel_init=True, buffer_bytes=request.buffer_bytes, exclusive=request.exclusive)
    assert report.problems == (), [p.message for p in report.problems]
    assert [o.kv_cache_tokens for o in report.stages] == [sp.kv_cache_tokens for sp in result.stages]
    assert [o.kv_cache_bytes for o in report.stages] == [sp.kv_cache_bytes for sp in result.stages]
    # Without prefix caching, KV beyond max_num_seqs requests is given back as free memory:
    # at most one fraction step above it remains (or above the guaranteed minimum, if larger).
    for sp in result.stages:
        if sp.headroom_cap is not None:
            step = max(result.gpus[d].gpu.total_bytes for d in sp.devices) / request.resolution
            # the solver counts whole MiB (KV floored, the rest rounded up: cpsat.py), up to 2 MiB short
            step_requests = (step + 2 * MiB) / (sp.memory.kv_bytes_per_token * sp.knobs.max_model_len)
            floor = max(sp.knobs.max_num_seqs, request.min_concurrency.get(sp.stage.name, 1))
            # replicas share the fraction: the smallest is capped (one on a larger GPU holds more)
            tokens = min(sp.replica_kv_tokens or (sp.kv_cache_tokens,))
            assert tokens / sp.knobs.max_model_len <= floor + step_requests + 1e-9, sp.stage.name


@pytest.mark.parametrize("model, gpus, option", UNPLANNED, ids=["|".join(case) for case in UNPLANNED])
def test_the_cells_where_no_plan_fits_are_proven_so(model, gpus, option):
    """The cells the test above leaves out: proven infeasible, or refused as too few GPUs for
    a stage's only TP degree (never a time-limit "no plan"; _plan asserts which)."""
    assert _plan(model, gpus, option) is None


def test_grid_is_not_vacuous():
    assert NO_PLAN_CELLS <= set(GRID)  # no stale entry
    assert len(PLANNED) >= len(GRID) // 2  # and each of them must plan (above)


@pytest.mark.parametrize("args", [
    ["--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe"],
    ["--gpus", "1xH100-80GB", "--model", "qwen3-omni-moe", "--exclusive", "thinker,talker,code2wav"],
    ["--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "--omni-version", "0.16", "--buffer", "1"],
])
def test_round_trip_through_the_command_line(tmp_path, args):
    out = tmp_path / "plan.yaml"
    runner = CliRunner()
    planned = runner.invoke(main, [*args, "-o", str(out), "--format", "yaml", "-q"])
    assert planned.exit_code == 0, planned.stderr
    as_json = json.loads(runner.invoke(main, [*args, "--format", "json", "-q"]).stdout)
    flags = [a for pair in zip(args[::2], args[1::2]) for a in pair if pair[0] != "--format"]
    checked = runner.invoke(main, ["check", str(out), *flags, "--parallel-init", "--format", "json"])
    assert checked.exit_code == 0, checked.stdout
    data = json.loads(checked.stdout)
    assert data["problems"] == []
    assert [s["kv_cache_tokens"] for s in data["stages"]] == [s["kv_cache_tokens"] for s in as_json["stages"]]

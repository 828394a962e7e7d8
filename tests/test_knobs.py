"""The planner chooses the engine knobs too (issue 20): where the bundled knobs leave no plan it
lowers max_num_batched_tokens, CUDA-graph capture, max_num_seqs and max_model_len, cheapest in
throughput first and only as far as memory needs, each level proven by a CP-SAT solve; a knob
the user names never moves, and a plan at the bundled knobs is today's plan."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from omni_autoconf.cli.main import main
from omni_autoconf.emit.render import render_deploy
from omni_autoconf.emit.summary import plan_dict, render_table
from omni_autoconf.errors import NoPlanError
from omni_autoconf.inputs.catalog import lookup_model
from omni_autoconf.inputs.configfile import read_config
from omni_autoconf.inputs.gpus import parse_gpus
from omni_autoconf.opt import cpsat
from omni_autoconf.planning.check import check_config
from omni_autoconf.planning.fixes import propose_fixes
from omni_autoconf.planning.knobs import KNOB_ORDER, levels, with_values
from omni_autoconf.planning.planner import build_problem, plan
from omni_autoconf.vllm.facts import omni_version

from conftest import make_request
from test_verified import FILES, _bundled
from wheels import wheel_root

KNOBS = ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "enforce_eager")


def _minicpmo_8x4090():
    return wheel_root("0.30") / "vllm_omni" / "deploy" / "minicpmo_4_5_8x4090.yaml", "8xRTX4090"


def _file_knobs(model: str, path, gpus: str):
    report = check_config(lookup_model(model), parse_gpus(gpus), omni_version("0.30"), read_config(str(path)))
    return report, {o.run.name: o.run.knobs for o in report.stages}


def _as_options(pipeline, knobs) -> dict:
    return {"max_model_len": {n: k.max_model_len for n, k in knobs.items() if pipeline.stage(n).has_kv_cache},
            "max_num_seqs": {n: k.max_num_seqs for n, k in knobs.items()},
            "max_num_batched_tokens": {n: k.max_num_batched_tokens for n, k in knobs.items()},
            "enforce_eager": {n: k.enforce_eager for n, k in knobs.items()}}


def _assert_each_lowered_knob_is_as_high_as_a_plan_allows(result):
    """Lexicographic: one level above each chosen value (everything else as chosen) has no plan."""
    for change in result.knobs_lowered:
        st = result.request.pipeline.stage(change.stage)
        preferred = build_problem(result.asked)[1][change.stage]
        ladder = levels(result.asked, st, change.knob, preferred)
        above = ladder[ladder.index(change.after) - 1]
        problem, _ = build_problem(with_values(result.request, {change.stage: {change.knob: above}}))
        assert cpsat.feasibility(problem, 30, 1) is cpsat.SolveStatus.INFEASIBLE, change


def test_minicpmo_on_8x4090_plans_and_its_file_passes_check(tmp_path):
    out = tmp_path / "deploy.yaml"
    done = CliRunner().invoke(main, ["--gpus", "8xRTX4090", "--model", "minicpmo-4.5", "-q", "-o", str(out)])
    assert done.exit_code == 0, done.stderr
    text = out.read_text()
    assert "# Inputs: omni-autoconf --gpus 8xRTX4090 --model minicpmo-4.5 --omni-version 0.30\n" in text
    assert "# Knobs lowered: the bundled values leave no plan" in text
    checked = CliRunner().invoke(main, ["check", str(out), "--gpus", "8xRTX4090", "--model", "minicpmo-4.5", "-q"])
    assert checked.exit_code == 0, checked.stdout + checked.stderr


def test_minicpmo_on_8x4090_lowers_only_the_llm_batch_as_far_as_needed():
    result = plan(make_request("minicpmo-4.5", "8xRTX4090"))
    assert result.asked is not None and result.asked.max_num_batched_tokens == {}
    (change,) = result.knobs_lowered  # the cheapest knob alone is enough
    assert (change.stage, change.knob, change.before) == ("llm", "max_num_batched_tokens", 16384)
    assert change.after < change.before and change.freed_bytes > 0
    llm = next(sp for sp in result.stages if sp.stage.name == "llm")
    assert (llm.knobs.max_model_len, llm.knobs.max_num_seqs, llm.knobs.enforce_eager) == (40960, 4, False)
    assert llm.knobs.max_num_batched_tokens == change.after
    for sp in result.stages[1:]:  # tts and code2wav fit at their bundled values: untouched
        assert sp.knobs == build_problem(result.asked)[1][sp.stage.name]
    _assert_each_lowered_knob_is_as_high_as_a_plan_allows(result)
    with pytest.raises(NoPlanError):  # a named knob never moves: the bundled 16384 has no plan
        plan(make_request("minicpmo-4.5", "8xRTX4090", max_num_batched_tokens={"llm": 16384},
                          max_num_seqs={"llm": 4}, enforce_eager={"llm": False}, max_model_len={"llm": 40960}))


def test_minicpmo_with_the_8x4090_files_knobs_holds_at_least_its_headroom():
    path, gpus = _minicpmo_8x4090()
    pipeline = lookup_model("minicpmo-4.5")
    report, knobs = _file_knobs("minicpmo-4.5", path, gpus)
    assert report.ok, [p.message for p in report.errors]
    bundled = min(min(o.max_concurrency, o.run.knobs.max_num_seqs) for o in report.stages if o.run.has_kv)
    result = plan(make_request("minicpmo-4.5", gpus, **_as_options(pipeline, knobs)))
    assert result.knobs_lowered == ()
    assert result.min_kv_requests >= bundled


VERIFIED = sorted(FILES) + ["minicpmo-4.5"]


@pytest.mark.parametrize("model", VERIFIED)
def test_a_verified_configs_hardware_plans_without_knob_options_and_lowers_nothing_the_file_fits(model):
    path, gpus = _minicpmo_8x4090() if model == "minicpmo-4.5" else _bundled(model, "0.30")
    pipeline = lookup_model(model)
    _, file_knobs = _file_knobs(model, path, gpus)
    result = plan(make_request(model, gpus))  # no knob options: exits 0
    lowered = {(c.stage, c.knob) for c in result.knobs_lowered}
    preferred = build_problem(make_request(model, gpus))[1]
    below = []
    for sp in result.stages:
        ours, theirs = sp.knobs, file_knobs[sp.stage.name]
        for knob in KNOBS:
            if knob == "max_model_len" and not sp.stage.has_kv_cache:
                continue
            lower = (ours.enforce_eager and not theirs.enforce_eager) if knob == "enforce_eager" else (
                getattr(ours, knob) < getattr(theirs, knob))
            if not lower:
                continue
            if (sp.stage.name, knob) in lowered:
                below.append((sp.stage.name, knob))
            else:  # the catalog's preferred value (its default file), not a lowering
                assert getattr(ours, knob) == getattr(preferred[sp.stage.name], knob)
    if below:  # lowered below the file's values: only where those do not fit
        with pytest.raises(NoPlanError):
            plan(make_request(model, gpus, **_as_options(pipeline, file_knobs)))
    _assert_each_lowered_knob_is_as_high_as_a_plan_allows(result)


def test_where_the_bundled_knobs_fit_the_plan_is_todays():
    request = make_request("qwen3-omni-moe", "2xH100-80GB")
    result = plan(request)
    assert result.knobs_lowered == () and result.asked is None and result.request is request
    assert "Knobs lowered" not in render_deploy(result) and "knobs lowered" not in render_table(result)
    assert "knobs_lowered" not in plan_dict(result)


# One RTX 5090 per llm rank with a 4.5 GiB buffer: 2 GiB short of the bundled llm, so either
# CUDA graphs off or max_num_seqs 2 or a smaller batch would do; the order picks the cheapest free one.
TIGHT = dict(model="minicpmo-4.5", gpus="8xRTX5090", buffer_gib=4.5)


def _lowered(**options) -> dict:
    kw = {**TIGHT, **options}
    result = plan(make_request(kw.pop("model"), kw.pop("gpus"), **kw))
    _assert_each_lowered_knob_is_as_high_as_a_plan_allows(result)
    return {(c.stage, c.knob): (c.before, c.after) for c in result.knobs_lowered}


def test_the_batch_is_lowered_before_graph_capture():
    changes = _lowered()
    assert set(changes) == {("llm", "max_num_batched_tokens")}


def test_graph_capture_is_lowered_before_max_num_seqs():
    changes = _lowered(max_num_batched_tokens={"llm": 16384})
    assert changes == {("llm", "enforce_eager"): (False, True)}
    # max_num_seqs alone would have done it too: the order chose, not the memory
    alone = _lowered(max_num_batched_tokens={"llm": 16384}, enforce_eager={"llm": False})
    assert set(alone) == {("llm", "max_num_seqs")} and alone[("llm", "max_num_seqs")][1] >= 1


def test_the_order_is_documented():
    assert KNOB_ORDER == ("max_num_batched_tokens", "enforce_eager", "max_num_seqs", "max_model_len")


def test_json_and_table_say_what_was_lowered_and_what_it_freed():
    done = CliRunner().invoke(main, ["--gpus", "8xRTX4090", "--model", "minicpmo-4.5", "-q", "--format", "json",
                                     "-o", "-"])
    assert done.exit_code == 0, done.stderr
    doc = json.loads(done.stdout)
    (entry,) = doc["knobs_lowered"]
    assert set(entry) == {"stage", "knob", "from", "to", "freed_bytes"}
    assert (entry["stage"], entry["knob"], entry["from"]) == ("llm", "max_num_batched_tokens", 16384)
    assert entry["freed_bytes"] > 0
    llm = next(s for s in doc["stages"] if s["name"] == "llm")
    assert llm["max_num_batched_tokens"] == entry["to"]
    table = render_table(plan(make_request("minicpmo-4.5", "8xRTX4090")))
    assert "knobs lowered (the bundled values leave no plan):\n  llm max_num_batched_tokens 16384 -> " in table


def test_named_knobs_that_leave_no_plan_get_proven_knob_fixes_and_the_floors_in_the_reasons():
    request = make_request("minicpmo-4.5", "8xRTX4090", max_num_batched_tokens={"llm": 16384},
                           max_num_seqs={"llm": 4}, enforce_eager={"llm": False})
    with pytest.raises(NoPlanError) as err:
        plan(request)
    assert any("at their floors" in r and "max_model_len 4096" in r for r in err.value.reasons)
    fixes, _ = propose_fixes(request)
    knob_fixes = [f for f in fixes if f.kind == "lower-knob"]
    assert {f.summary.split(" for ")[0].split(" from ")[0] for f in knob_fixes} >= {
        "lower max_num_batched_tokens", "lower max_num_seqs"}
    for fix in knob_fixes:  # each proven: it plans
        assert plan(fix.request).stages

"""Property tests and a bounded fuzz of the command line (hypothesis, fixed seeds).

- For random inventories, models and options, every emitted plan passes the start-up
  model and round-trips through `check` with the same KV per stage.
- Every proven "no plan" of a small random problem is confirmed by the enumerator.
- Random argument lists and malformed YAML only ever end in exit 0, 1 or 2, with one
  line on stderr for exit 2, and never in an internal error.
"""

from __future__ import annotations

import string

import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omni_autoconf.opt import cpsat as cpsat
from omni_autoconf.opt.bruteforce import best_objective
from omni_autoconf.cli.main import main
from omni_autoconf.planning.check import check_config
from omni_autoconf.inputs.configfile import read_config
from omni_autoconf.errors import InputError, NoPlanError
from omni_autoconf.inputs.gpus import Gpu
from omni_autoconf.planning.evaluation import recheck
from omni_autoconf.planning.planner import plan
from omni_autoconf.opt.problem import Problem
from omni_autoconf.emit.render import RENDERERS
from omni_autoconf.vllm.facts import GiB

from conftest import make_request
from test_cpsat import gen_stage, kv_stage

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
KINDS = ["H100-80GB", "A100-80GB", "A100-40GB", "L40S", "H200", "RTX4090", "B200", "L4"]
MODELS = ["qwen3-omni-moe", "qwen2.5-omni-7b", "qwen2.5-omni-3b"]


@st.composite
def requests(draw):
    counts = draw(st.lists(st.tuples(st.integers(1, 3), st.sampled_from(KINDS)), min_size=1, max_size=2))
    gpus = ",".join(f"{n}x{kind}" for n, kind in counts)
    model = draw(st.sampled_from(MODELS))
    kw = {}
    if draw(st.booleans()):
        kw["exclusive"] = (("thinker", "code2wav"),)
    if draw(st.booleans()):
        kw["buffer_gib"] = draw(st.sampled_from([0.0, 1.0, 2.75]))
    if draw(st.booleans()):
        kw["kv_cache_dtype"] = "fp8"
    if draw(st.booleans()):
        length = draw(st.sampled_from([2048, 8192, 16384]))
        kw["max_model_len"] = {"thinker": length, "talker": length}
    if draw(st.booleans()):
        kw["min_concurrency"] = {"thinker": draw(st.integers(1, 3))}
    version, schema = draw(st.sampled_from([("0.30", "deploy"), ("0.22", "deploy"), ("0.22", "stage-args"),
                                            ("0.16", "stage-args")]))
    return make_request(model, gpus, version, schema=schema, time_limit_s=60, **kw)


@SETTINGS
@given(requests())
def test_every_plan_passes_the_start_up_model_and_round_trips(tmp_path_factory, request_):
    try:
        result = plan(request_)
    except NoPlanError as exc:
        assert exc.status == "infeasible"
        return
    assert recheck(result).problems == ()
    path = tmp_path_factory.mktemp("plan") / "plan.yaml"
    path.write_text(RENDERERS[request_.schema](result))
    report = check_config(request_.pipeline, list(request_.gpus), request_.version, read_config(str(path)),
                          parallel_init=True, buffer_bytes=request_.buffer_bytes, exclusive=request_.exclusive)
    assert report.problems == ()
    assert [o.kv_cache_tokens for o in report.stages] == [sp.kv_cache_tokens for sp in result.stages]


@st.composite
def small_problems(draw):
    sizes = draw(st.lists(st.sampled_from([16, 24, 40, 80]), min_size=1, max_size=3))
    gpus = tuple(Gpu(i, f"G{s}", int(s * GiB)) for i, s in enumerate(sizes))
    stages = [kv_stage(0, "a", draw(st.floats(2, 40)), draw(st.sampled_from([16384, 65536, 131072])), tps=(1, 2),
                       mml=draw(st.sampled_from([4096, 16384, 32768])), min_requests=draw(st.integers(1, 3)))]
    if draw(st.booleans()):
        stages.append(kv_stage(1, "b", draw(st.floats(1, 12)), 20480, mml=8192, cap=draw(st.sampled_from([None, 2]))))
    if draw(st.booleans()):
        stages.append(gen_stage(len(stages), "c", draw(st.floats(0.2, 3))))
    groups = ((0, len(stages) - 1),) if len(stages) > 1 and draw(st.booleans()) else ()
    return Problem(gpus, tuple(stages), 10, int(draw(st.floats(0.5, 3)) * GiB), groups)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(small_problems())
def test_no_plan_is_confirmed_by_the_enumerator(problem):
    solution = cpsat.solve(problem, 20)
    expected = best_objective(problem)
    if solution.status is cpsat.SolveStatus.INFEASIBLE:
        assert expected is None
    else:
        assert solution.status is cpsat.SolveStatus.OPTIMAL and expected is not None
        assert solution.objective == expected[0]


# --- fuzz -----------------------------------------------------------------------------------

FLAGS = ["--gpus", "--model", "--omni-version", "--schema", "--format", "--tp", "--devices", "--enforce-eager",
         "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--min-concurrency", "--weight",
         "--exclusive", "--kv-cache-dtype", "--buffer", "--resolution", "--workers", "--allow-untested-tp", "-o"]
VALUES = st.one_of(
    st.sampled_from(["2xH100-80GB", "1xL4", "qwen3-omni-moe", "qwen2.5-omni-3b", "0.30", "0.16", "deploy",
                     "stage-args", "json", "thinker=2", "talker=1", "code2wav=0", "thinker,code2wav", "fp8", "auto",
                     "0.5", "0.01", "-1", "0", "1e9", "nan", "inf", "１２", "thinker=", "=3", ",", "-", "/dev/null"]),
    st.text(alphabet=string.printable + "éü１", max_size=12),
    st.integers(-10, 10**12).map(str),
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(FLAGS), VALUES), max_size=5))
def test_fuzzed_arguments_end_in_0_1_or_2_with_one_line_errors(pairs):
    args = [a for flag, value in pairs for a in ((flag,) if flag == "--allow-untested-tp" else (flag, value))]
    args = [a for a in args if a not in ("-o",)]  # never write files from the fuzzer
    result = CliRunner().invoke(main, [*args, "--time-limit", "0.5", "-q"])
    assert result.exit_code in (0, 1, 2), (args, result.exit_code, result.stderr)
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)
    if result.exit_code == 2:
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)


KEYS = ["stages", "stage_args", "stage_id", "devices", "tensor_parallel_size", "gpu_memory_utilization",
        "max_model_len", "max_num_seqs", "max_num_batched_tokens", "enforce_eager", "kv_cache_dtype", "runtime",
        "engine_args", "engine_extras", "platforms", "cuda", "base_config", "compilation_config", "cudagraph_mode"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**6), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from(["0", "0,1", "1", "auto", "fp8", "false", "NONE", "x"]))
DOCS = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)),
                    max_leaves=25)


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(KEYS), DOCS, min_size=1, max_size=4), st.binary(max_size=40))
def test_fuzzed_config_files_end_in_0_1_or_2(tmp_path, doc, junk):
    path = tmp_path / "fuzz.yaml"
    text = yaml.safe_dump(doc)
    path.write_bytes(text.encode() + (junk if junk[:1] == b"#" else b""))
    result = CliRunner().invoke(main, ["check", str(path), "--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe"])
    assert result.exit_code in (0, 1, 2), (text, result.exit_code, result.stderr)
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr, (text, result.stderr)
    if result.exit_code == 2:
        assert len(result.stderr.strip().splitlines()) == 1, (text, result.stderr)


def test_a_malformed_config_read_directly_is_an_input_error(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("stages: [{stage_id: 0, devices: '0', max_num_seqs: 1.5}]\n")
    try:
        read_config(str(path))
    except InputError as exc:
        assert "max_num_seqs" in str(exc)
    else:
        raise AssertionError("1.5 sequences was accepted")




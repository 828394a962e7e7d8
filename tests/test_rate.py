"""Planning for a request rate (issue 23): profiles, `profile import`, --target-rate."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from omni_autoconf.cli.main import main
from omni_autoconf.inputs.perf_profile import load_profile, parse_profile, shipped_profiles
from omni_autoconf.opt import bruteforce, cpsat
from omni_autoconf.planning.planner import build_problem
from omni_autoconf.planning.rate import RateTarget, plan_for_rate


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def result_file(tmp_path, name: str, concurrency: int, rps: float, audio: float, ttfp: float, rtf: float,
                stage_metrics: bool = False):
    """A result shaped as `vllm bench serve --omni --save-result` writes it (vLLM's main_async
    fields, then vLLM-Omni 0.30's benchmark() result; see inputs/bench_import.py)."""
    completed = 64
    data = {
        "date": "20261201-120000", "endpoint_type": "openai-audio-speech", "backend": "openai-audio-speech",
        "label": None, "model_id": "Qwen/Qwen3-TTS-12Hz-1.7B-Base", "tokenizer_id": "Qwen/Qwen3-TTS-12Hz-1.7B-Base",
        "num_prompts": completed, "request_rate": "inf", "burstiness": 1.0, "max_concurrency": concurrency,
        "duration": completed / rps, "completed": completed, "failed": 0, "total_input_tokens": 3200,
        "total_output_tokens": 0, "request_throughput": rps, "request_goodput": None, "output_throughput": 0.0,
        "total_token_throughput": 3200 * rps / completed, "total_audio_duration_s": completed * audio / rps,
        "total_audio_frames": 0, "audio_throughput": audio, "stage_durations_mean": {}, "stage_durations_p50": {},
        "stage_durations_p99": {}, "max_concurrent_requests": concurrency, "rtfx": 0.0,
        "mean_e2el_ms": 1000.0, "median_e2el_ms": 1000.0, "p99_e2el_ms": 2000.0,
        "mean_audio_ttfp_ms": ttfp * 1.1, "median_audio_ttfp_ms": ttfp, "p99_audio_ttfp_ms": ttfp * 3,
        "mean_audio_rtf": rtf, "median_audio_rtf": rtf, "p99_audio_rtf": rtf * 2,
    }
    if stage_metrics:
        data["request_stage_metrics"] = [{"0": {"num_tokens_out": 60, "finish_reason": "stop"},
                                          "1": {"audio_frames": 120000, "audio_duration_s": audio / rps}}] * completed
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_shipped_profiles_validate_and_cite():
    shipped = shipped_profiles()
    assert {"qwen3-tts-1.7b", "qwen3-omni-moe"} <= set(shipped)
    for path in shipped.values():
        for entry in load_profile(path).entries:
            assert entry.source.url and entry.source.commit
            assert {"end-to-end", "workload-specific", "illustrative"} <= set(entry.labels)


def test_profile_validation_is_one_line():
    with pytest.raises(Exception, match="entries"):
        parse_profile({"entries": []}, "p.yaml")


def test_min_replicas_bruteforce_agrees(request_for):
    req = request_for("qwen3-tts-1.7b", "3xH100-80GB", resolution=20)
    problem, _ = build_problem(req)
    stages = problem.stages
    for need in (1, 2, 3, 4):
        from dataclasses import replace

        pb = replace(problem, stages=(replace(stages[0], min_replicas=need),) + stages[1:], shared_gpus=False)
        got = cpsat.feasibility(pb, 20)
        oracle = bruteforce.best_objective(pb)
        assert (got is cpsat.SolveStatus.OPTIMAL) == (oracle is not None), need
        assert (oracle is not None) == (need <= 2)  # 3 GPUs, one stage each: talker gets at most 2


def test_fewest_gpus_monotone_and_linear():
    counts = []
    for rate in (2, 8, 9, 16, 17, 30, 40):
        res = run("--model", "qwen3-tts-1.7b", "--gpus", "H100-80GB", "--target-rate", str(rate), "-q", "--format", "json")
        assert res.exit_code == 0, res.output
        info = json.loads(res.output)["rate"]
        assert info["serves"] and info["extrapolated"]
        assert all(s["utilisation"] <= 1 for s in info["stages"])
        counts.append(len(json.loads(res.output)["gpus"]))
        if len(counts) > 1 and counts[-1] > counts[0]:
            assert "proven infeasible by CP-SAT" in info["gpu_search"]
    assert counts == sorted(counts)
    assert counts == [2, 2, 4, 4, 6, 8, 10]  # 2 GPUs per 8.07 req/s once one unit saturates


def test_header_states_rate_and_extrapolation():
    res = run("--model", "qwen3-tts-1.7b", "--gpus", "H100-80GB", "--target-rate", "9", "-q")
    assert res.exit_code == 0, res.output
    assert "# Rate: target 9 requests/s" in res.output
    assert "utilisation 56%" in res.output and "EXTRAPOLATED" in res.output


def test_a_count_says_whether_it_serves():
    res = run("--model", "qwen3-tts-1.7b", "--gpus", "2xH100-80GB", "--target-rate", "12", "-q", "--format", "json")
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)["rate"]
    assert not info["serves"] and info["stages"][0]["utilisation"] > 1


def test_no_rate_no_key():
    res = run("--model", "qwen3-tts-1.7b", "--gpus", "2xH100-80GB", "-q", "--format", "json")
    assert "rate" not in json.loads(res.output)
    assert run("--model", "qwen3-tts-1.7b", "--gpus", "2xH100-80GB", "--rtf", "1").exit_code == 2


def test_import_then_plan(tmp_path):
    files = [result_file(tmp_path, f"c{c}.json", c, rps, audio, ttfp, rtf, stage_metrics=True)
             for c, rps, audio, ttfp, rtf in [(8, 4.0, 20.0, 200, 0.3), (16, 6.0, 30.0, 600, 0.5),
                                              (64, 6.5, 32.0, 5000, 1.4)]]
    out = tmp_path / "p.yaml"
    res = run("profile", "import", *files, "--gpu", "H100-80GB", "--devices", "talker=0", "--devices", "code2wav=1",
              "-o", str(out))
    assert res.exit_code == 0, res.output
    entry = load_profile(out).entries[0]
    assert entry.pipeline == "qwen3-tts-1.7b" and entry.unit == "pipeline" and len(entry.points) == 3
    assert entry.workload.output_tokens == 60  # from the per-stage statistics (total_output_tokens is 0)
    assert entry.capacity() == (6.0, entry.points[1])  # c64 has RTF 1.4: not sustainable
    res = run("--model", "qwen3-tts-1.7b", "--gpus", "H100-80GB", "--target-rate", "13", "--profile", str(out),
              "-q", "--format", "json")
    assert res.exit_code == 0, res.output
    assert [s["replicas"] for s in json.loads(res.output)["rate"]["stages"]] == [3, 3]
    res = run("--model", "qwen3-tts-1.7b", "--gpus", "H100-80GB", "--target-rate", "3", "--ttfp-p50", "300",
              "--profile", str(out), "-q", "--format", "json")
    assert json.loads(res.output)["rate"]["stages"][0]["requests_per_s_per_replica"] == 4.0


@pytest.mark.parametrize("text", ['{"foo": 1}', "[1, 2]", "not json", '{"request_throughput": 1, "completed": 3, '
                                                                       '"model_id": "x"}'])
def test_import_refuses_foreign(tmp_path, text):
    path = tmp_path / "r.json"
    path.write_text(text)
    res = run("profile", "import", str(path), "--gpu", "H100-80GB")
    assert res.exit_code == 2
    assert len(res.output.strip().splitlines()) == 1


def test_stage_profile_adds_replicas_to_the_saturated_stage_only(tmp_path, request_for):
    profile = {"entries": [
        {"pipeline": "qwen3-tts-1.7b", "unit": unit, "gpu": "H100-80GB",
         "layout": {"gpus": 4, "stages": {"talker": {"devices": [0]}, "code2wav": {"devices": [1, 2, 3], "replicas": 3}}
                    if unit == "talker" else {"talker": {"devices": [0, 1, 2], "replicas": 3}, "code2wav": {"devices": [3]}}},
         "workload": {"dataset": "test"}, "points": [{"concurrency": 8, "requests_per_s": rps, "rtf_p50": 0.5}],
         "labels": ["measured", "stage-level"],
         "source": {"command": "test", "omni_version": "0.30", "date": "2026-12-01", "note": "constructed"}}
        for unit, rps in (("talker", 2.0), ("code2wav", 20.0))]}
    path = tmp_path / "stages.yaml"
    path.write_text(yaml.safe_dump(profile))
    target = RateTarget(rate=5.0, profile=load_profile(path), profile_name=str(path))
    plan = plan_for_rate(request_for("qwen3-tts-1.7b", "1xH100-80GB"), target, "H100-80GB")
    replicas = {sp.stage.name: sp.num_replicas for sp in plan.stages}
    assert replicas == {"talker": 3, "code2wav": 1}
    assert len(plan.gpus) == 4 and plan.rate.serves and not plan.rate.extrapolated

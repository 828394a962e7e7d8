"""Qwen3-TTS, BAGEL and the other pipelines first modelled beyond the three-stage omni
models, and the rules they brought to every catalog entry.

The models: the Qwen3-Omni thinker alone, Qwen3-TTS (1.7B and 0.6B), Step-Audio 2 (ASR and
two-stage), BAGEL (single stage and think mode), MOSS-TTS-Nano, Voxtral, GLM-TTS, Fish S2 Pro,
Gepard and VoxCPM2: their figures against the public start-up logs and measurements they
cite, their bundled files under `check`, their checkpoint directories.
The rules: the versions each entry is served on (any other refused in one line), the
`extends` form a sibling checkpoint's entry takes, stages without a KV cache (a diffusion
stage held at its real use whatever its fraction, in its load order), the API front end's
room on GPU 0, and a pipeline's edges across hosts."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from omni_autoconf.inputs.catalog import load_pipeline_text, lookup_model
from omni_autoconf.cli.main import main
from omni_autoconf.errors import CatalogError
from omni_autoconf.memory.stage_memory import StageKnobs, stage_memory
from omni_autoconf.vllm.facts import GiB, omni_version


def _run(*args):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("version, key", [("0.26", "qwen3_omni_moe"), ("0.28", "qwen3_omni_moe_thinker_only"),
                                          ("0.30", "qwen3_omni_moe_thinker_only")])
def test_the_thinker_alone_names_the_pipeline_each_version_registers(version, key):
    result = _run("--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe-thinking", "--omni-version", version, "-q")
    assert result.exit_code == 0, result.stderr
    doc = yaml.safe_load(result.stdout)
    assert doc["pipeline"] == key and [s["stage_id"] for s in doc["stages"]] == [0]
    assert next(iter(doc)) == "pipeline"  # heads the file, as the bundled one
    assert ("enable_audio_output false" in result.stdout) == (version == "0.26")  # what 0.26 needs is said


@pytest.mark.parametrize("model, version, schema, needle", [
    ("qwen3-omni-moe-thinking", "0.24", None, "choose --omni-version 0.26 (deploy files"),
    ("qwen3-omni-moe-thinking", "0.26", "stage-args", "use --schema deploy"),
    ("qwen3-tts-1.7b", "0.28", None, "modelled for vLLM-Omni 0.30 only"),
    ("qwen3-tts-0.6b", "0.22", None, "choose --omni-version 0.30"),
])
def test_a_version_the_catalog_does_not_model_is_refused_in_one_line(model, version, schema, needle):
    args = ["--gpus", "1xH100-80GB", "--model", model, "--omni-version", version, "-q"]
    result = _run(*args, *(["--schema", schema] if schema else []))
    assert result.exit_code == 2 and needle in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("model, logged_gib", [("qwen3-tts-1.7b", 3.8655), ("qwen3-tts-0.6b", 1.91)])
def test_the_tts_talker_is_never_below_its_logged_load_and_keeps_its_logged_kv_per_token(model, logged_gib):
    talker = lookup_model(model).stage("talker")
    memory = stage_memory(talker, 1, StageKnobs(4096, 64, 512, False, "auto", True), omni_version("0.30"))
    assert memory.weights_bytes >= logged_gib * GiB
    assert memory.weights_bytes < (logged_gib + 0.01) * GiB  # the residual tops it up to the log, no more
    # 14.46 GiB -> 135,296 tokens (1.7B, PR 4130); 2.01 GiB -> 18,816 tokens (0.6B, PR 7488): 2 decimals of GiB
    assert memory.kv_bytes_per_token == 2 * 28 * 8 * 128 * 2
    for gib, tokens in ((14.46, 135_296), (2.01, 18_816)):
        assert abs(gib * GiB / tokens / memory.kv_bytes_per_token - 1) < 0.005


def test_the_tts_talker_profile_is_not_below_the_logged_peak():
    """0.6B talker, bundled file of 0.26/0.28 (max_num_batched_tokens 32768): "peak
    activation 0.81 GiB" (https://github.com/vllm-project/vllm-omni/pull/7488)."""
    talker = lookup_model("qwen3-tts-0.6b").stage("talker")
    memory = stage_memory(talker, 1, StageKnobs(4096, 64, 32768, False, "auto", True), omni_version("0.30"))
    assert memory.activation_bytes >= 0.81 * GiB


def test_code2wav_holds_its_decoder_state_per_request():
    code2wav = lookup_model("qwen3-tts-1.7b").stage("code2wav")
    v = omni_version("0.30")
    few, many = (stage_memory(code2wav, 1, StageKnobs(65536, n, 65536, False, "auto", True), v) for n in (1, 64))
    row = 2 * 8 * 16 * 64 * 71 * 2  # K and V, 8 layers, 16 heads of 64, 71 positions, bf16
    assert many.state_bytes - few.state_bytes == 63 * 2 * row
    assert many.weights_bytes == few.weights_bytes  # allocated while serving: no load figure holds it
    assert many.inside_bytes - few.inside_bytes == 63 * 2 * row
    assert few.kv_bytes_per_token == 0


def test_the_06b_variant_replaces_only_the_talker():
    small, large = lookup_model("qwen3-tts-0.6b"), lookup_model("qwen3-tts-1.7b")
    assert small.stage("code2wav") == large.stage("code2wav")
    assert small.deploy_top == large.deploy_top and small.deploy_versions == large.deploy_versions
    assert small.stage("talker").deploy_fields == large.stage("talker").deploy_fields
    assert small.stage("talker").transformer.hidden_size == 1024 != large.stage("talker").transformer.hidden_size


def test_the_two_stage_step_audio_keeps_the_asr_thinker_and_appends_token2wav():
    two, asr = lookup_model("step-audio-2-mini"), lookup_model("step-audio-2-mini-asr")
    assert [s.name for s in two.stages] == ["thinker", "token2wav"]
    thinker = two.stage("thinker")
    assert thinker.components == asr.stage("thinker").components
    assert thinker.encoder_profile == asr.stage("thinker").encoder_profile
    assert thinker.defaults["deploy"].max_num_batched_tokens == 8192  # step_audio_2.yaml's, not the ASR file's 2048
    assert not two.stage("token2wav").has_kv_cache and "pipeline" not in two.deploy_top


def test_the_single_stage_bagel_is_the_dit_alone_and_starts_where_its_file_runs():
    from wheels import wheel_root

    single, two = lookup_model("bagel-7b-mot-single-stage"), lookup_model("bagel-7b-mot")
    (dit,) = single.stages
    assert dit.stage_id == 0 and dit.components == two.stage("dit").components and dit.role == "diffusion"
    assert "input_connectors" not in dit.deploy_fields and single.deploy_top["pipeline"] == "bagel_single_stage"
    bundled = wheel_root("0.30") / "vllm_omni" / "deploy" / "bagel_single_stage.yaml"
    assert _check_at(bundled, "1xA100-80GB", "bagel-7b-mot-single-stage", "0.30").ok
    small = _check_at(bundled, "1xRTX5090", "bagel-7b-mot-single-stage", "0.30")  # loads, then its peak OOMs
    assert "diffusion-peak-beyond-free" in {p.code for p in small.errors}


@pytest.mark.parametrize("model", ["bagel-7b-mot-single-stage", "moss-tts-nano"])
def test_a_pipeline_without_kv_that_fits_nowhere_says_why(model):
    """The fix search once crashed looking for a context to shorten in a pipeline without one."""
    result = _run("--gpus", "1xT4", "--model", model, "--buffer", "14.5", "-q")
    assert result.exit_code == 1 and "no plan fits" in result.stderr and "internal error" not in result.stderr


@pytest.mark.parametrize("text, needle", [
    ("extends: nowhere.yaml\nname: x\n", "is not a catalog file beside it"),
    ("extends: bagel-7b-mot.yaml\nname: x\nkeep_stages: [vae]\n", "must list distinct stage names"),
    ("extends: bagel-7b-mot.yaml\nname: x\nkeep_stages: [dit, thinker]\n", "in its order"),
    ("extends: qwen3-tts-1.7b.yaml\nname: x\nstages:\n  - {stage_id: 3, name: vocoder}\n", "not a whole stage 2"),
    ("extends: ../qwen3-tts-1.7b.yaml\nname: x\n", "is not a catalog file beside it"),
    ("extends: qwen3-tts-1.7b.yaml\nname: x\nstages:\n  - {name: vocoder, dtype: float32}\n", "names no stage"),
    ("extends: qwen3-tts-0.6b.yaml\nname: x\n", "one level only"),
])
def test_a_bad_extends_names_the_file_and_the_reason(text, needle):
    with pytest.raises(CatalogError, match=needle):
        load_pipeline_text(text, "variant.yaml")


def _check(path, gpus, model="bagel-7b-mot"):
    from omni_autoconf.planning.check import check_config
    from omni_autoconf.inputs.configfile import read_config
    from omni_autoconf.inputs.gpus import parse_gpus

    return check_config(lookup_model(model), parse_gpus(gpus), omni_version("0.30"), read_config(str(path)))


BAGEL = """\
async_chunk: false
stages:
  - {stage_id: 0, devices: "0", gpu_memory_utilization: 0.45, max_num_seqs: 3, max_num_batched_tokens: 32768}
  - {stage_id: 1, devices: "%s", max_num_seqs: 1, max_num_batched_tokens: 32768, enforce_eager: true}
"""


def test_a_diffusion_stage_is_held_at_its_real_use_whatever_its_fraction(tmp_path):
    """A dense diffusion stage reads no gpu_memory_utilization: a file that gives none (as
    the bundled one) and one that gives 0.05 hold the same memory."""
    plain, tiny = tmp_path / "plain.yaml", tmp_path / "tiny.yaml"
    plain.write_text(BAGEL % "1")
    tiny.write_text((BAGEL % "1").replace("enforce_eager: true}", "enforce_eager: true, gpu_memory_utilization: 0.05}"))
    a, b = _check(plain, "2xA100-80GB"), _check(tiny, "2xA100-80GB")
    assert a.ok and b.ok
    dit = lookup_model("bagel-7b-mot").stage("dit")
    holds = stage_memory(dit, 1, StageKnobs(32768, 1, 32768, True, "auto", False), omni_version("0.30"))
    assert a.gpus[1].requested_bytes == b.gpus[1].requested_bytes == holds.inside_bytes


def test_a_diffusion_peak_beyond_the_free_memory_is_reported(tmp_path):
    """On a 32 GB card the dit's weights load but its 1024x1024 CFG request does not fit."""
    path = tmp_path / "dit-alone.yaml"
    path.write_text(BAGEL % "1")
    report = _check(path, "1xA100-80GB,1xRTX5090")
    codes = {(p.code, p.stage) for p in report.problems}
    assert ("diffusion-peak-beyond-free", "dit") in codes and not report.ok


def test_the_dit_loads_before_the_thinker_and_takes_its_peak_once_all_are_up(tmp_path):
    """vLLM-Omni starts diffusion stages first, with a small warm-up: on one A100 the
    thinker's 0.6 meets the dit's weights already resident (not capped: ~50 GiB free), and
    the dit's 1024x1024 request then finds too little left."""
    path = tmp_path / "shared.yaml"
    path.write_text((BAGEL % "0").replace("gpu_memory_utilization: 0.45", "gpu_memory_utilization: 0.6"))
    report = _check(path, "1xA100-80GB")
    found = {(p.code, p.stage) for p in report.problems}
    assert ("diffusion-peak-beyond-free", "dit") in found and ("free-memory-capped", "thinker") not in found
    tight = tmp_path / "tight.yaml"  # 0.75: the thinker's request no longer fits beside the dit's weights
    tight.write_text((BAGEL % "0").replace("gpu_memory_utilization: 0.45", "gpu_memory_utilization: 0.75"))
    assert ("free-memory-capped", "thinker") in {(p.code, p.stage) for p in _check(tight, "1xA100-80GB").problems}


def test_a_diffusion_stage_without_a_fraction_is_refused_by_parallel_init_admission(tmp_path):
    from omni_autoconf.planning.check import check_config
    from omni_autoconf.inputs.configfile import read_config
    from omni_autoconf.inputs.gpus import parse_gpus

    path = tmp_path / "bagel.yaml"
    path.write_text(BAGEL % "1")
    report = check_config(lookup_model("bagel-7b-mot"), parse_gpus("2xA100-80GB"), omni_version("0.30"),
                          read_config(str(path)), parallel_init=True)
    assert any("cannot account" in p.message and p.gpu == 1 for p in report.errors)
    assert report.stages[1].run.util_steps == 0


def test_the_plan_declares_the_dits_real_use_and_says_what_the_fraction_is():
    result = _run("--gpus", "1xA100-80GB", "--model", "bagel-7b-mot", "-q")
    assert result.exit_code == 0, result.stderr
    doc = yaml.safe_load(result.stdout)
    dit = lookup_model("bagel-7b-mot").stage("dit")
    holds = stage_memory(dit, 1, StageKnobs(32768, 1, 32768, True, "auto", False), omni_version("0.30"))
    util = doc["stages"][1]["gpu_memory_utilization"]
    assert holds.inside_bytes <= util * 79.14 * GiB < holds.inside_bytes + 0.02 * 79.14 * GiB
    assert "declared for vLLM-Omni's admission" in result.stdout


def test_a_tts_plan_over_two_hosts_wires_both_ends_of_each_edge_to_one_cross_host_connector(tmp_path):
    """vLLM-Omni registers an edge from both ends and refuses two connector types for one
    edge (vllm_omni 0.30.0 distributed/omni_connectors/utils/initialization.py)."""
    out = tmp_path / "plan"
    result = _run("--nodes", "2", "--gpus", "2xH100-80GB", "--model", "qwen3-tts-1.7b", "-o", f"{out}/", "-q")
    assert result.exit_code == 0, result.stderr
    files = sorted(out.glob("*.yaml"))
    assert len(files) == 3
    for path in files:
        doc = yaml.safe_load(path.read_text())
        names = {key: spec["name"] for key, spec in doc["connectors"].items()}
        ends = {}
        for st in doc["stages"]:
            for key, ref in (st.get("output_connectors") or {}).items():
                ends.setdefault((st["stage_id"], int(key.removeprefix("to_stage_"))), set()).add(names[ref])
            for key, ref in (st.get("input_connectors") or {}).items():
                ends.setdefault((int(key.removeprefix("from_stage_")), st["stage_id"]), set()).add(names[ref])
        assert ends == {(0, 1): {"MooncakeStoreConnector"}}, path.name


def test_a_diffusion_pipeline_over_two_hosts_is_refused():
    result = _run("--nodes", "2", "--gpus", "1xA100-80GB", "--model", "bagel-7b-mot", "-q")
    assert result.exit_code == 2 and "diffusion stage" in result.stderr


@pytest.mark.parametrize("value, ok", [("code2wav=1552", True), ("code2wav=1000", False), ("code2wav=1024", False)])
def test_code2wav_takes_only_batches_its_codec_chunks_allow(value, ok):
    result = _run("--gpus", "1xRTX4090", "--model", "qwen3-tts-1.7b", "--max-num-batched-tokens", value, "-q")
    assert (result.exit_code == 0) == ok
    if not ok:
        assert "multiple of 16 and at least 1552" in result.stderr


def test_a_global_batch_below_code2wavs_floor_skips_it_and_keeps_its_peak():
    small = _run("--gpus", "1xRTX4090", "--model", "qwen3-tts-1.7b", "--max-num-batched-tokens", "512",
                 "--format", "json", "-q")
    default = _run("--gpus", "1xRTX4090", "--model", "qwen3-tts-1.7b", "--format", "json", "-q")
    import json

    a, b = json.loads(small.stdout), json.loads(default.stdout)
    assert any("not applied to code2wav" in n for n in a["option_notes"])
    peaks = [{s["name"]: s["activation_bytes"] for s in d["stages"]}["code2wav"] for d in (a, b)]
    assert peaks[0] == peaks[1] > 0


def test_check_names_a_pipeline_key_the_version_does_not_serve(tmp_path):
    path = tmp_path / "thinking.yaml"
    path.write_text("pipeline: qwen3_omni_moe_thinker_only\nstages:\n"
                    "  - {stage_id: 0, devices: '0,1', tensor_parallel_size: 2, gpu_memory_utilization: 0.9,"
                    " max_num_seqs: 1, enforce_eager: true}\n")
    codes = {v: {p.code for p in _check_at(path, "2xH100-80GB", "qwen3-omni-moe-thinking", v).problems}
             for v in ("0.26", "0.30")}
    assert "pipeline-key-mismatch" in codes["0.26"] and "pipeline-key-mismatch" not in codes["0.30"]


def test_check_of_a_deploy_file_on_a_version_without_deploy_files_is_a_predicted_failure():
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "examples" / "qwen3-omni-moe.2xH100-80GB.deploy.yaml"
    result = _run("check", "--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "--omni-version", "0.18", str(example))
    assert result.exit_code == 1 and "schema-unsupported" in result.stdout + result.stderr


def _check_at(path, gpus, model, version):
    from omni_autoconf.planning.check import check_config
    from omni_autoconf.inputs.configfile import read_config
    from omni_autoconf.inputs.gpus import parse_gpus

    return check_config(lookup_model(model), parse_gpus(gpus), omni_version(version), read_config(str(path)))


def test_check_and_calibrate_refuse_a_version_the_catalog_does_not_model(tmp_path):
    path = tmp_path / "tts.yaml"
    path.write_text("stages:\n  - {stage_id: 0, devices: '0', gpu_memory_utilization: 0.3}\n"
                    "  - {stage_id: 1, devices: '0', gpu_memory_utilization: 0.3}\n")
    log = tmp_path / "start.log"
    log.write_text("INFO [gpu_model_runner.py:1] Model loading took 3.87 GiB memory and 20.1 seconds\n")
    common = ["--gpus", "1xH100-80GB", "--model", "qwen3-tts-1.7b", "--omni-version", "0.28"]
    for args in (["check", str(path), *common], ["calibrate", "--config", str(path), *common, str(log)]):
        result = _run(*args)
        assert result.exit_code == 2 and "choose --omni-version 0.30" in result.stderr, args


def test_bagel_think_mode_is_bagel_with_its_own_pipeline_key():
    think, plain = lookup_model("bagel-7b-mot-think"), lookup_model("bagel-7b-mot")
    assert think.stages == plain.stages
    assert think.deploy_top_at("0.30")["pipeline"] == "bagel_think" and "pipeline" not in plain.deploy_top_at("0.30")


def test_a_qwen3_tts_directory_plans_with_its_headers_and_the_codec_cast_to_bf16(tmp_path):
    """The codec sits in speech_tokenizer/, stored in fp32: the talker loads its encoder and
    code2wav its decoder, both cast to bf16; what is built at load (the stacked codec
    embeddings, the decoder's graph tensors, the logged residual) is kept from the catalog."""
    import json

    from test_checkpoints import ELEMENT, write_safetensors

    root = tmp_path / "Qwen3-TTS-12Hz-1.7B-Base"
    (root / "speech_tokenizer").mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"model_type": "qwen3_tts", "talker_config": {"hidden_size": 2048}}))
    main_tensors = {"talker.model.layers.weight": ("BF16", [1_400_000_000]), "talker.model.norm.weight": ("BF16", [2048]),
                    "talker.code_predictor.weight": ("BF16", [175_000_000]), "speaker_encoder.weight": ("BF16", [9_000_000])}
    codec = {"encoder.weight": ("F32", [50_000_000]), "decoder.weight": ("F32", [114_000_000])}
    write_safetensors(root / "model.safetensors", main_tensors)
    write_safetensors(root / "speech_tokenizer" / "model.safetensors", codec)

    def nbytes(spec):
        dtype, shape = spec
        n = ELEMENT[dtype]
        for d in shape:
            n *= d
        return n

    result = _run("--gpus", "1xRTX4090", "--model", str(root), "--format", "json", "-q")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    weights = {s["name"]: s["weights_bytes"] for s in data["stages"]}
    catalog = {c.name: c for st in lookup_model("qwen3-tts-1.7b").stages for c in st.components}
    built = catalog["stacked_codec_embed"].params * 2 + catalog["logged_residual"].params
    assert weights["talker"] == sum(map(nbytes, main_tensors.values())) + nbytes(codec["encoder.weight"]) // 2 + built
    assert weights["code2wav"] == nbytes(codec["decoder.weight"]) // 2 + catalog["decoder_graph_tensors"].params
    assert any("loaded as" in n or "loaded" in n for n in data["model_notes"]), data["model_notes"]


def test_a_qwen3_tts_directory_without_its_codec_folder_names_it(tmp_path):
    import json

    from test_checkpoints import write_safetensors

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_tts"}))
    write_safetensors(tmp_path / "model.safetensors", {"talker.model.norm.weight": ("BF16", [2048])})
    result = _run("--gpus", "1xRTX4090", "--model", str(tmp_path), "-q")
    assert result.exit_code == 2 and "speech_tokenizer: missing" in result.stderr


@pytest.mark.parametrize("version, starts", [("0.28", False), ("0.30", True)])
def test_step_audio_2_on_one_l4_fails_at_07_and_starts_at_08_as_its_ci_did(version, starts):
    """vLLM-Omni's weekly CI ran step_audio2_ci.yaml (TP 1, util 0.7, max_model_len 1024) on one
    L4: "Model loading took 15.59 GiB", "Available KV cache memory: 0.0 GiB", "No available
    memory for the cache blocks" (https://github.com/vllm-project/vllm-omni/issues/6836); the
    fix raised util to 0.8 (https://github.com/vllm-project/vllm-omni/pull/6839), the 0.30 file."""
    from wheels import wheel_root

    path = wheel_root(version) / "vllm_omni" / "deploy" / "step_audio2_ci.yaml"
    report = _check_at(path, "1xL4", "step-audio-2-mini-asr", version)
    assert report.ok == starts, [p.message for p in report.problems]
    if not starts:
        assert {p.code for p in report.errors} == {"no-kv-memory"}
    (stage,) = report.stages
    assert stage.run.memory.weights_bytes >= 15.59 * GiB


@pytest.mark.parametrize("version", ["0.28", "0.30"])
@pytest.mark.parametrize("name", ["step_audio_2.yaml", "step_audio_2_async_chunk.yaml"])
def test_the_two_stage_step_audio_files_start_and_a_token2wav_fraction_below_its_use_is_flagged(
        name, version, tmp_path):
    from wheels import wheel_root

    bundled = wheel_root(version) / "vllm_omni" / "deploy" / name
    report = _check_at(bundled, "2xH100-80GB", "step-audio-2-mini", version)
    assert report.ok, [p.message for p in report.problems]
    thinker, token2wav = report.stages
    assert thinker.run.has_kv and not token2wav.run.has_kv and thinker.max_concurrency > 1
    # token2wav builds its models on the first request: a fraction below what it then holds is flagged
    squeezed = tmp_path / name
    squeezed.write_text(bundled.read_text().replace("gpu_memory_utilization: 0.2\n", "gpu_memory_utilization: 0.02\n"))
    codes = {p.code for p in _check_at(squeezed, "2xH100-80GB", "step-audio-2-mini", version).problems}
    assert "fraction-below-usage" in codes


def test_the_step_audio_encoder_profile_grows_with_the_batch_it_is_given():
    """max_num_batched_tokens // 250 items of 25 s audio are encoded at once."""
    thinker = lookup_model("step-audio-2-mini-asr").stage("thinker")
    v = omni_version("0.30")
    peaks = [stage_memory(thinker, 1, StageKnobs(16384, 1, n, True, "auto", False), v).activation_bytes
             for n in (1024, 2048, 8192)]
    assert peaks[0] < peaks[1] < peaks[2]


def test_moss_tts_nano_is_held_at_no_less_than_its_measured_server_share():
    """vLLM reserves nothing for it (no attention layers); nvidia-smi put the server at about
    848 MiB (https://github.com/vllm-project/vllm-omni/pull/7577): the plan holds more."""
    import json

    result = _run("--gpus", "1xL4", "--model", "moss-tts-nano", "--format", "json", "-q")
    assert result.exit_code == 0, result.stderr
    (gpu,) = json.loads(result.stdout)["gpus"]
    assert gpu["requested_bytes"] + gpu["outside_bytes"] >= 848 * 2 ** 20
    refused = _run("--gpus", "1xL4", "--model", "moss-tts-nano", "--max-num-seqs", "moss_tts_nano=2", "-q")
    assert refused.exit_code == 2 and "at most 1 request" in refused.stderr


def test_a_stage_without_kv_gets_the_max_model_len_its_bundled_file_sets():
    doc = yaml.safe_load(_run("--gpus", "1xRTX4090", "--model", "qwen3-tts-1.7b", "-q").stdout)
    assert doc["stages"][1]["max_model_len"] == 65536  # the codec stream code2wav accumulates (bundled)
    doc = yaml.safe_load(_run("--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "-q").stdout)
    assert "max_model_len" not in doc["stages"][2]


def test_a_step_audio_2_directory_plans_its_model_types_pipeline_with_its_header_weights(tmp_path):
    """model_type step_audio_2 resolves to the two-stage pipeline (the ASR one needs `pipeline:`);
    token2wav's weights are .pt/.onnx files, so its catalog estimate stays."""
    import json

    from test_checkpoints import write_safetensors

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "step_audio_2",
                                                      "architectures": ["StepAudio2ForCausalLM"],
                                                      "audio_encoder_config": {"n_state": 1280}}))
    tensors = {"model.layers.weight": ("BF16", [6_525_600_000]), "lm_head.weight": ("BF16", [568_900_000]),
               "encoder.blocks.weight": ("BF16", [637_000_000]), "adapter.linear.weight": ("BF16", [14_900_000])}
    write_safetensors(tmp_path / "model.safetensors", tensors)
    result = _run("--gpus", "1xH100-80GB", "--model", str(tmp_path), "--format", "json", "-q")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["model"] == "step-audio-2-mini"
    catalog = lookup_model("step-audio-2-mini")
    residual = next(c for c in catalog.stages[0].components if c.name == "logged_residual")
    stored = 2 * (6_525_600_000 + 568_900_000 + 637_000_000 + 14_900_000)
    assert data["stages"][0]["weights_bytes"] == stored + residual.params
    assert data["stages"][1]["weights_bytes"] == sum(4 * c.params for c in catalog.stage("token2wav").components)
    assert any("token2wav: its weights are not in safetensors" in n for n in data["model_notes"])


def test_check_refuses_what_the_model_itself_refuses_and_a_missing_pipeline_key(tmp_path):
    moss = tmp_path / "moss.yaml"
    moss.write_text("stages:\n  - {stage_id: 0, devices: '0', gpu_memory_utilization: 0.3, max_num_seqs: 2,"
                    " max_model_len: 4096, enforce_eager: true}\n")
    codes = {p.code for p in _check_at(moss, "1xL4", "moss-tts-nano", "0.30").errors}
    assert "engine-config-invalid" in codes
    think = tmp_path / "think.yaml"
    think.write_text(BAGEL % "1")
    found = [p for p in _check_at(think, "2xA100-80GB", "bagel-7b-mot-think", "0.30").errors
             if p.code == "pipeline-key-mismatch"]
    assert found and "names no pipeline" in found[0].message


def test_a_stage_without_kv_capped_to_free_memory_still_starts(tmp_path):
    """Its fraction sizes nothing: vLLM-Omni warns and caps (worker/memory_utils.py
    request_memory_tolerant), and the stage holds what it uses."""
    path = tmp_path / "tts.yaml"
    path.write_text("model_runner: v2\nasync_chunk: true\nstages:\n"
                    "  - {stage_id: 0, devices: '0', gpu_memory_utilization: 0.6, max_num_seqs: 64,"
                    " max_num_batched_tokens: 512, max_model_len: 4096}\n"
                    "  - {stage_id: 1, devices: '0', gpu_memory_utilization: 0.3, max_num_seqs: 64,"
                    " max_num_batched_tokens: 65536, max_model_len: 65536}\n")
    report = _check_at(path, "1xRTX4090", "qwen3-tts-1.7b", "0.30")
    capped = [p for p in report.problems if p.stage == "code2wav"]
    assert capped and {p.code for p in capped} == {"no-kv-fraction-capped"} and capped[0].severity == "warning"


def test_voxtral_counts_the_codec_both_stages_build_and_its_measured_card_peak_is_not_above_the_plan():
    """Both Voxtral stages build the whole codec, its encoder included though the open checkpoint
    has none; the in-checkpoint counts give the Hub's 8 GB consolidated.safetensors. The bundled
    file on an RTX A6000 peaked at "~40.5 GiB" (https://github.com/vllm-project/vllm-omni/pull/4051):
    `check` may hold more, never less."""
    from wheels import wheel_root

    pipeline = lookup_model("voxtral-4b-tts")
    gen, codec = pipeline.stage("audio_generation"), pipeline.stage("audio_tokenizer")
    stored = sum(c.params for c in gen.components if c.in_checkpoint) * 2
    assert abs(stored / 8.0005e9 - 1) < 0.001
    assert {c.name for c in codec.components} <= {c.name for c in gen.components}
    knobs = StageKnobs(4096, 32, 32768, False, "auto", True)
    assert stage_memory(gen, 1, knobs, omni_version("0.30")).kv_bytes_per_token == 2 * 26 * 8 * 128 * 2
    report = _check_at(wheel_root("0.30") / "vllm_omni" / "deploy" / "voxtral_tts.yaml", "1xRTXA6000", "voxtral-4b-tts", "0.30")
    assert report.ok
    assert report.gpus[0].used_bytes >= 40.5 * GiB


def test_a_glm_tts_directory_points_to_the_catalog_name(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "glm_tts"}')
    result = _run("--gpus", "1xL4", "--model", str(tmp_path), "-q")
    assert result.exit_code == 2 and "--model glm-tts" in result.stderr


def test_a_mistral_format_directory_is_refused_in_one_line(tmp_path):
    (tmp_path / "params.json").write_text('{"dim": 3072}')
    result = _run("--gpus", "1xH20", "--model", str(tmp_path), "-q")
    assert result.exit_code == 2 and "Mistral-format directory" in result.stderr


def _on_48gb_cards(path, count):
    """vLLM-Omni's GLM-TTS recipe ran on 48 GB cards of 49,140 MiB (not in the GPU catalog)."""
    from omni_autoconf.planning.check import check_config
    from omni_autoconf.inputs.configfile import read_config
    from omni_autoconf.inputs.gpus import Gpu

    gpus = [Gpu(index=i, name="RTX4090-48GB", total_bytes=49_140 * 2**20) for i in range(count)]
    return check_config(lookup_model("glm-tts"), gpus, omni_version("0.30"), read_config(str(path)))


def test_glm_tts_holds_no_less_than_its_measured_peaks_front_end_included(tmp_path):
    """NVML peaks of the bundled file (https://github.com/vllm-project/vllm-omni/pull/5769): one
    card 31.52 GiB; two cards 29.23 GiB (stage 0 and the API process's voice-clone encoder) and
    2.91 GiB (stage 1 alone). `check` may hold more, never less."""
    from wheels import wheel_root

    bundled = wheel_root("0.30") / "vllm_omni" / "deploy" / "glm_tts.yaml"
    one = _on_48gb_cards(bundled, 1)
    assert one.ok and one.startup.gpus[0].used_bytes >= 31.52 * GiB
    split = tmp_path / "split.yaml"
    split.write_text(bundled.read_text().replace('devices: "0"\n    enable_prefix_caching', 'devices: "1"\n    enable_prefix_caching'))
    two = _on_48gb_cards(split, 2)
    assert two.ok and [s.run.devices for s in two.stages] == [(0,), (1,)]
    gpu0, gpu1 = two.startup.gpus
    assert gpu0.used_bytes >= 29.23 * GiB and gpu1.used_bytes >= 2.91 * GiB
    assert gpu1.used_bytes < 0.25 * gpu1.gpu.total_bytes  # stage 1 holds its use, not its inert 0.25
    # the front-end is on GPU 0 only: take it away and GPU 0 holds that much less, GPU 1 the same
    bare = lookup_model("glm-tts").model_copy(update={"frontend_gpu_bytes": 0})
    from omni_autoconf.planning.check import check_config
    from omni_autoconf.inputs.configfile import read_config

    without = check_config(bare, [g.gpu for g in two.startup.gpus], omni_version("0.30"), read_config(str(split)))
    assert gpu0.used_bytes - without.startup.gpus[0].used_bytes == lookup_model("glm-tts").frontend_gpu_bytes
    assert gpu1.used_bytes == without.startup.gpus[1].used_bytes


def test_the_planner_leaves_the_front_end_room_on_gpu_0_and_check_flags_a_file_that_does_not():
    import json

    data = json.loads(_run("--gpus", "1xL4", "--model", "glm-tts", "--format", "json", "-q").stdout)
    gpu = data["gpus"][0]
    assert gpu["total_bytes"] - gpu["requested_bytes"] - gpu["outside_bytes"] >= gpu["margin_bytes"]
    assert gpu["outside_bytes"] >= 2 * GiB
    from wheels import wheel_root

    report = _check_at(wheel_root("0.30") / "vllm_omni" / "deploy" / "glm_tts.yaml", "1xL4", "glm-tts", "0.30")
    # "fits 24GB cards": it starts, but once the front-end loads less than the margin is left
    assert report.ok
    (problem,) = report.problems
    assert problem.code == "below-margin" and "the API process" in problem.message


def test_fish_counts_its_checkpoint_exactly_and_what_it_builds_beyond_it():
    pipeline = lookup_model("fish-s2-pro")
    slow_ar = pipeline.stage("slow_ar")
    assert sum(c.params for c in slow_ar.components if c.in_checkpoint) == 4_561_852_416  # the shards' count
    knobs = StageKnobs(16384, 4, 16384, False, "auto", True)
    memory = stage_memory(slow_ar, 1, knobs, omni_version("0.30"))
    assert memory.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2
    assert 10.7 * GiB < memory.weights_bytes < 10.9 * GiB  # the head twice and the fp32 DAC encoder: 10.78 GiB
    assert memory.outside_bytes - stage_memory(slow_ar.model_copy(update={"serving_outside": None}), 1, knobs,
                                               omni_version("0.30")).outside_bytes == slow_ar.serving_outside.bytes


@pytest.mark.parametrize("seqs, frames", [(1, 75), (4, 300), (64, 1638)])
def test_the_dac_decodes_each_requests_window_up_to_what_the_batch_holds(seqs, frames):
    dac = lookup_model("fish-s2-pro").stage("dac_decoder")
    memory = stage_memory(dac, 1, StageKnobs(16384, seqs, 16384, True, "auto", True), omni_version("0.30"))
    assert memory.activation_bytes == frames * dac.generation_profile.bytes_per_frame


@pytest.mark.parametrize("name, gpus", [("fish_qwen3_omni_2gpu.yaml", "2xH100-80GB"),  # "validated on H100x2"
                                        ("fish_qwen3_omni_high_concurrency_dual_gpu.yaml", "2xH100-80GB"),
                                        ("fish_qwen3_omni_high_concurrency_single_gpu.yaml", "1xH100-80GB")])
def test_the_other_fish_files_start_on_the_cards_they_name(name, gpus):
    from wheels import wheel_root

    report = _check_at(wheel_root("0.30") / "vllm_omni" / "deploy" / name, gpus, "fish-s2-pro", "0.30")
    assert report.ok and not report.problems, [p.message for p in report.problems]


def test_a_fish_directory_takes_its_weights_from_the_headers_and_keeps_the_codecs_estimate(tmp_path):
    import json

    from test_checkpoints import write_safetensors

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "fish_qwen3_omni"}))
    tensors = {"text_model.model.layers.0.weight": ("BF16", [3_633_511_936]),
               "text_model.model.embeddings.weight": ("BF16", [398_786_560]),
               "audio_decoder.codebook_embeddings.weight": ("BF16", [104_857_600]),
               "audio_decoder.layers.0.weight": ("BF16", [424_696_320])}
    write_safetensors(tmp_path / "model.safetensors", tensors)
    result = _run("--gpus", "1xH20", "--model", str(tmp_path), "--format", "json", "-q")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    catalog = lookup_model("fish-s2-pro")
    built = sum(stage_memory(catalog.stage("slow_ar").model_copy(update={"components": [c]}), 1,
                             StageKnobs(16384, 4, 16384, False), omni_version("0.30")).weights_bytes
                for c in catalog.stage("slow_ar").components if not c.in_checkpoint)
    assert data["model"] == "fish-s2-pro"
    assert data["stages"][0]["weights_bytes"] == 2 * 4_561_852_416 + built
    assert any("dac_decoder: its weights are not in safetensors" in n for n in data["model_notes"])


def test_over_several_hosts_the_front_end_is_kept_on_each_hosts_first_gpu():
    """The head host (the API process's) is chosen after the plan, so each host keeps room."""
    import json

    from dataclasses import replace

    from omni_autoconf.inputs.gpus import parse_gpus
    from omni_autoconf.planning.planner import build_problem

    from conftest import make_request

    gpus = tuple(replace(g, node=f"node{g.index // 2}") for g in parse_gpus("4xL4"))
    problem, _ = build_problem(replace(make_request("glm-tts", "4xL4"), gpus=gpus))
    front = lookup_model("glm-tts").frontend_gpu_bytes
    usable = [problem.usable_bytes(g) for g in problem.gpus]
    assert [g.node for g in problem.gpus] == ["node0", "node0", "node1", "node1"]
    assert usable[0] == usable[1] - front and usable[2] == usable[3] - front
    data = json.loads(_run("--nodes", "2", "--gpus", "2xL4", "--model", "glm-tts", "--format", "json", "-q").stdout)
    assert data["frontend_gpu_bytes"] == front
    assert all(g["outside_bytes"] >= front for g in data["gpus"] if g["index"] in (0, 2))


@pytest.mark.parametrize("version", ["0.28", "0.30"])
def test_gepard_starts_on_the_l4_its_file_targets_and_keeps_room_for_its_lazy_codec(version):
    from wheels import wheel_root

    report = _check_at(wheel_root(version) / "vllm_omni" / "deploy" / "gepard.yaml", "1xL4", "gepard-1.0", version)
    assert report.ok and not report.problems, [p.message for p in report.problems]
    (stage,) = report.stages
    assert stage.run.memory.kv_bytes_per_token == 2 * 14 * 2 * 256 * 2
    codec = lookup_model("gepard-1.0").stage("gepard").serving_outside.bytes
    assert stage.run.memory.outside_bytes >= codec
    assert report.startup.gpus[0].used_bytes >= stage.requested_bytes + codec  # the codec lands beyond the fraction


def test_a_gepard_directory_is_not_planned_as_the_plain_llm_its_config_names(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen3_5_text", "num_hidden_layers": 14}')
    (tmp_path / "gepard_config.json").write_text("{}")
    result = _run("--gpus", "1xL4", "--model", str(tmp_path), "-q")
    assert result.exit_code == 2 and "--model gepard-1.0" in result.stderr


@pytest.mark.parametrize("gpus", ["1xL4", "1xH20"])
def test_voxcpm2_holds_its_pinned_kv_on_small_and_large_cards_alike(gpus):
    """"Runs on large (H20 141GB) and small (24GB L4) cards alike: the KV cache is pinned";
    "6 GiB holds ~175k tokens" (https://github.com/vllm-project/vllm-omni/pull/4279)."""
    from wheels import wheel_root

    report = _check_at(wheel_root("0.30") / "vllm_omni" / "deploy" / "voxcpm2.yaml", gpus, "voxcpm2", "0.30")
    assert report.ok and not report.problems, [p.message for p in report.problems]
    (stage,) = report.stages
    assert stage.kv_cache_tokens == 174_752
    used = report.startup.gpus[0].used_bytes  # the same on either card, not 0.9 of it
    assert 13 * GiB <= used < 20 * GiB  # the maintainers say "peak ~13 GiB"


def test_gepard_plans_kv_for_every_request_it_admits_since_a_preempted_one_restarts():
    import json

    data = json.loads(_run("--gpus", "1xL4", "--model", "gepard-1.0", "--max-num-seqs", "gepard=64",
                           "--format", "json", "-q").stdout)
    assert data["stages"][0]["kv_cache_tokens"] >= 64 * 4096
    fewer = json.loads(_run("--gpus", "1xL4", "--model", "gepard-1.0", "--max-num-seqs", "gepard=256",
                            "--min-concurrency", "gepard=2", "--format", "json", "-q").stdout)
    assert fewer["stages"][0]["kv_cache_tokens"] >= 2 * 4096  # an explicit --min-concurrency wins

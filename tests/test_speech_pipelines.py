"""Speech and audio pipelines of vLLM-Omni 0.30 beyond those of test_tts_and_bagel_pipelines.py
(Qwen3-TTS, Fish, GLM-TTS, ...): Audio8, IndexTTS 2 and 2.5, Higgs Audio v2 and v3, CosyVoice3,
MOSS-TTS (and its realtime and local variants), OmniVoice, MiniMax-Music3, PersonaPlex, Ming-TTS,
Audex, Breeze, Nemotron VoiceChat, MiniCPM-o, the Ming-flash-omni thinker, JoyAI and Aura,
Covo-Audio and MiMo-Audio. Each entry's counts against the public figures it cites, what it
builds beyond its checkpoint, its bundled files under `check` on the cards they name, and its
checkpoint directory read from the safetensors headers."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from omni_autoconf.inputs.catalog import lookup_model
from omni_autoconf.cli.main import main
from omni_autoconf.memory.stage_memory import StageKnobs, stage_memory
from omni_autoconf.vllm.facts import GiB, omni_version

from test_checkpoints import write_safetensors
from wheels import check_bundled as _check


def _run(*args):
    return CliRunner().invoke(main, list(args))


AUDIO8_CONFIG = {"architectures": ["ArkttsModel"], "model_type": "arktts", "dim": 896, "n_layer": 24, "n_head": 14,
                 "n_local_heads": 2, "head_dim": 64, "intermediate_size": 4864, "vocab_size": 155776,
                 "max_seq_len": 2048, "tie_word_embeddings": True, "dtype": "bfloat16"}


def test_audio8_counts_the_public_parameters_and_the_head_it_stores_apart():
    slow_ar = lookup_model("audio8-tts-0.6b").stage("slow_ar")
    in_checkpoint = sum(c.params for c in slow_ar.components if c.in_checkpoint)
    assert in_checkpoint == 601_159_424  # the model card's count
    memory = stage_memory(slow_ar, 1, StageKnobs(2048, 4, 2048, False, "auto", False), omni_version("0.30"))
    assert memory.kv_bytes_per_token == 2 * 24 * 2 * 64 * 2
    assert memory.weights_bytes == 2 * (in_checkpoint + 155_776 * 896)  # the separate lm_head, in bf16
    # the clone encoder arrives with the first cloning request, outside the fraction
    bare = slow_ar.model_copy(update={"serving_outside": None})
    assert memory.outside_bytes - stage_memory(bare, 1, StageKnobs(2048, 4, 2048, False, "auto", False),
                                               omni_version("0.30")).outside_bytes == slow_ar.serving_outside.bytes


def test_audio8s_codec_decodes_one_window_whatever_the_batch():
    codec = lookup_model("audio8-tts-0.6b").stage("codec_decoder")
    peaks = {stage_memory(codec, 1, StageKnobs(2048, seqs, tokens, True, "auto", True), omni_version("0.30"))
             .activation_bytes for tokens, seqs in [(2048, 1), (2048, 4), (512, 1)]}
    assert peaks == {50 * codec.generation_profile.bytes_per_frame}
    weights = stage_memory(codec, 1, StageKnobs(2048, 1, 2048, True, "auto", False), omni_version("0.30")).weights_bytes
    assert weights == 4 * 130_462_129 and weights < 0.49 * GiB  # the decoder half in fp32, not the 1.4 GB file


def _audio8_dir(path, config=AUDIO8_CONFIG):
    (path / "config.json").write_text(json.dumps(config))
    tensors = {"layers.0.attention.wqkv.weight": ("BF16", [357_897_216]), "norm.weight": ("BF16", [896]),
               "embeddings.weight": ("BF16", [155_776, 896]),
               "codebook_embeddings.weight": ("BF16", [40_960, 896]),
               "fast_layers.0.attention.wqkv.weight": ("BF16", [66_985_856])}
    return write_safetensors(path / "model.safetensors", tensors)


def test_an_audio8_directory_takes_its_weights_from_the_headers(tmp_path):
    stored = _audio8_dir(tmp_path)
    result = _run("--gpus", "1xL4", "--model", str(tmp_path), "--format", "json", "-q")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["model"] == "audio8-tts-0.6b"
    # the headers' bytes and the head vLLM-Omni fills from the embedding
    assert data["stages"][0]["weights_bytes"] == stored + 2 * 155_776 * 896
    assert any("codec_decoder: its weights are not in safetensors" in n for n in data["model_notes"])


def test_the_audio8_sibling_of_another_geometry_is_refused_in_one_line(tmp_path):
    _audio8_dir(tmp_path, {**AUDIO8_CONFIG, "dim": 512, "n_layer": 12})  # the Falcon-H1 0.1B shape
    result = _run("--gpus", "1xL4", "--model", str(tmp_path), "-q")
    assert result.exit_code == 2
    assert "model_type 'arktts', but not the geometry" in result.stderr and "Traceback" not in result.output


def test_indextts_2_5_reproduces_its_logged_start_up_from_below():
    """The bundled indextts2_5.yaml on one 143,771 MiB GPU: "3.57 GiB weights ... a 52.0 GiB configured
    KV-cache allocation" (https://github.com/vllm-project/vllm-omni/pull/5957)."""
    from omni_autoconf.inputs.gpus import Gpu

    report = _check("indextts2_5.yaml", [Gpu(0, "H200", 143_771 * 2**20)], "indextts-2.5")
    assert report.ok and not report.problems, [p.message for p in report.problems]
    talker = report.stages[0]
    memory = stage_memory(lookup_model("indextts-2.5").stage("talker"), 1, talker.run.knobs, omni_version("0.30"))
    assert 3.57 * GiB <= memory.weights_bytes < 3.58 * GiB  # the GPT in bf16 and its front end in fp32
    assert memory.kv_bytes_per_token == 2 * 24 * 20 * 64 * 2
    # the log prints one decimal: vLLM gave at most 52.05 GiB; within 1% of it, never above
    assert 51.5 * GiB <= talker.kv_cache_bytes < 52.05 * GiB
    assert report.startup.gpus[0].used_bytes >= 59_845 * 2**20  # NVML's "peak process/device memory"


@pytest.mark.parametrize("model, name", [("indextts-2", "indextts2.yaml"), ("indextts-2", "indextts2_low_latency.yaml"),
                                         ("indextts-2.5", "indextts2_5.yaml")])
@pytest.mark.parametrize("gpus", ["1xL4", "1xH100-80GB"])  # CI's card (tests/e2e test_indextts2.py) and the recipe's
def test_the_bundled_indextts_files_start_on_the_cards_they_are_run_on(model, name, gpus):
    from omni_autoconf.inputs.gpus import parse_gpus

    report = _check(name, parse_gpus(gpus), model)
    assert report.ok, [p.message for p in report.errors]


def test_an_indextts_directory_points_to_the_catalog(tmp_path):
    (tmp_path / "gpt.pth").write_bytes(b"")
    (tmp_path / "s2mel.pth").write_bytes(b"")
    (tmp_path / "config.yaml").write_text("gpt: {}\n")
    result = _run("--gpus", "1xL4", "--model", str(tmp_path), "-q")
    assert result.exit_code == 2 and "--model indextts-2" in result.stderr and "Traceback" not in result.output


@pytest.mark.parametrize("hub_id, name", [("IndexTeam/IndexTTS-2", "indextts-2"), ("indexteam/indextts-2.5", "indextts-2.5")])
def test_the_hub_id_of_an_unread_checkpoint_points_to_the_catalog_without_the_network(hub_id, name, monkeypatch):
    import omni_autoconf.inputs.model_source as source

    monkeypatch.setattr(source, "read_hub", lambda *a, **k: pytest.fail("the network was asked"))
    result = _run("--gpus", "1xL4", "--model", hub_id, "-q")
    assert result.exit_code == 2 and f"--model {name}" in result.stderr


def test_higgs_v2_counts_its_backbone_and_audio_adapter_as_published():
    talker = lookup_model("higgs-audio-v2").stage("talker")
    params = {c.name: c.params for c in talker.components}
    backbone = sum(params.values()) - params["audio_mlps"] - params["audio_lm_head"] - params["audio_codebook_embeddings"]
    assert round(backbone / 1e9, 1) == 3.6 and round((sum(params.values()) - backbone) / 1e9, 1) == 2.2  # "3.6B + 2.2B"
    memory = stage_memory(talker, 1, StageKnobs(4096, 4, 2048, True, "auto", False), omni_version("0.30"))
    assert memory.kv_bytes_per_token == 2 * 28 * 8 * 128 * 2


def test_the_bundled_higgs_v2_file_starts_on_the_h100_it_was_run_on_with_the_clone_encoder_on_gpu_0():
    """https://github.com/vllm-project/vllm-omni/pull/3762 ran the bundled file on one H100 80GB."""
    from omni_autoconf.inputs.gpus import parse_gpus

    report = _check("higgs_audio_v2.yaml", parse_gpus("1xH100-80GB"), "higgs-audio-v2")
    assert report.ok and not report.problems, [p.message for p in report.problems]
    from omni_autoconf.planning.check import check_config
    from omni_autoconf.inputs.configfile import read_config

    from wheels import wheel_root

    pipeline = lookup_model("higgs-audio-v2")
    bare = pipeline.model_copy(update={"frontend_gpu_bytes": 0})
    config = read_config(str(wheel_root("0.30") / "vllm_omni" / "deploy" / "higgs_audio_v2.yaml"))
    without = check_config(bare, parse_gpus("1xH100-80GB"), omni_version("0.30"), config)
    # the API process's clone encoder lands on GPU 0, beyond every fraction
    assert report.startup.gpus[0].used_bytes - without.startup.gpus[0].used_bytes == pipeline.frontend_gpu_bytes > 0


def test_a_higgs_v2_directory_takes_the_talkers_weights_from_the_headers(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "higgs_audio_v2",
                                                      "architectures": ["HiggsAudioV2ForConditionalGeneration"]}))
    stored = write_safetensors(tmp_path / "model.safetensors", {
        "model.layers.0.self_attn.q_proj.weight": ("BF16", [4_932_848_640]), "model.norm.weight": ("BF16", [3072]),
        "model.embed_tokens.weight": ("BF16", [128_256, 3072]), "lm_head.weight": ("BF16", [128_256, 3072]),
        "audio_lm_head.weight": ("BF16", [8208, 3072]), "model.embed_audio_tokens.embed_audio_tokens.weight": ("BF16", [8208, 3072]),
        "audio_tower.layers.0.weight": ("BF16", [1000])})  # a tensor vLLM-Omni does not load
    result = _run("--gpus", "1xH100-80GB", "--model", str(tmp_path), "--format", "json", "-q")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["model"] == "higgs-audio-v2"
    assert data["stages"][0]["weights_bytes"] == stored - 2000


def test_cosyvoice3_counts_give_its_fp32_pickles_sizes():
    """llm.pt 2,024,669,519 B, flow.pt 1,329,116,148 B and hift.pt 83,202,622 B, fp32 (the Hub's file list)."""
    pipeline = lookup_model("cosyvoice3-0.5b")
    talker = sum(c.params for c in pipeline.stage("talker").components)
    codec = {c.name: c.params for c in pipeline.stage("code2wav").components}
    assert 0 <= 2_024_669_519 - 4 * talker < 200_000  # a pickle's overhead, no tensor more or less
    assert 0 <= 1_329_116_148 + 83_202_622 - 4 * (codec["flow"] + codec["hift"]) < 400_000


def test_the_bundled_cosyvoice3_file_starts_on_the_h100_it_is_tuned_for():
    from omni_autoconf.inputs.gpus import parse_gpus

    report = _check("cosyvoice3.yaml", parse_gpus("1xH100-80GB"), "cosyvoice3-0.5b")
    assert report.ok and not report.problems, [p.message for p in report.problems]
    talker = report.stages[0]
    assert talker.run.knobs.max_model_len == 2048  # what vLLM assumes for a config without a length


def test_a_cosyvoice3_directory_points_to_the_catalog(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "cosyvoice3.yaml").write_text("llm: {}\n")
    (tmp_path / "llm.pt").write_bytes(b"")
    result = _run("--gpus", "1xL4", "--model", str(tmp_path), "-q")
    assert result.exit_code == 2 and "--model cosyvoice3-0.5b" in result.stderr


def test_moss_tts_counts_give_the_measured_talker_and_its_kv():
    """sglang-omni measured "15.81 GiB BF16 AR model" and 750,038 tokens in 103.00 GiB of KV
    (https://github.com/sgl-project/sglang-omni/pull/1300, /pull/1727)."""
    talker = lookup_model("moss-tts").stage("moss_tts")
    in_checkpoint = sum(c.params for c in talker.components if c.in_checkpoint)
    assert round(2 * in_checkpoint / GiB, 2) == 15.81
    memory = stage_memory(talker, 1, StageKnobs(4096, 4, 4096, False, "auto", True), omni_version("0.30"))
    assert abs(750_038 * memory.kv_bytes_per_token / GiB - 103.00) < 0.005


@pytest.mark.parametrize("name, starts", [("moss_tts_80gb.yaml", True), ("moss_tts.yaml", False)])
def test_moss_tts_fits_one_80gb_card_at_0_6_and_not_at_0_85(name, starts):
    """moss_tts_80gb.yaml: "both stages initialize on one H100/H800 80GB"; the default 0.85 file
    did not (https://github.com/vllm-project/vllm-omni/issues/4643), and online its API process
    adds the reference encoder on the codec's GPU."""
    from omni_autoconf.inputs.gpus import parse_gpus

    report = _check(name, parse_gpus("1xH100-80GB"), "moss-tts")
    if starts:
        assert report.ok and not report.problems, [p.message for p in report.problems]
    else:
        assert "gpu-oversubscribed" in {p.code for p in report.errors}


def test_a_moss_tts_directory_reads_the_talker_and_refuses_a_sibling_of_other_geometry(tmp_path):
    config = {"model_type": "moss_tts_delay", "n_vq": 32, "language_config": {"num_hidden_layers": 36}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    stored = write_safetensors(tmp_path / "model.safetensors", {
        "language_model.layers.0.self_attn.q_proj.weight": ("BF16", [6_946_075_648]),
        "language_model.embed_tokens.weight": ("BF16", [155_648, 4096]), "lm_heads.0.weight": ("BF16", [155_648, 4096]),
        "lm_heads.1.weight": ("BF16", [32 * 1025, 4096]), "emb_ext.0.weight": ("BF16", [32 * 1025, 4096])})
    data = json.loads(_run("--gpus", "1xH100-80GB", "--model", str(tmp_path), "--format", "json", "-q").stdout)
    assert data["model"] == "moss-tts" and data["stages"][0]["weights_bytes"] == stored + 2 * 268_697_600
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_vq": 16}))  # MOSS-TTSD's codebooks
    assert _run("--gpus", "1xH100-80GB", "--model", str(tmp_path), "-q").exit_code == 2


def test_omnivoice_counts_give_its_fp32_files():
    """model.safetensors 2,450,344,112 B (612,577,280 fp32 parameters, a 64-B buffer, its header)."""
    components = {c.name: c.params for c in lookup_model("omnivoice").stage("dit").components}
    generator = components["generator_layers"] + components["text_embedding"] + components["audio_io"]
    assert generator == 612_577_280
    assert abs(4 * components["higgs_codec"] - 805_600_772) < 0.001 * 805_600_772


def test_the_bundled_omnivoice_file_starts_on_a_24gb_card_and_is_held_at_its_peak():
    from omni_autoconf.inputs.gpus import parse_gpus

    report = _check("omnivoice.yaml", parse_gpus("1xL4"), "omnivoice")
    assert report.ok and not report.problems, [p.message for p in report.problems]
    dit = lookup_model("omnivoice").stage("dit")
    assert report.startup.gpus[0].used_bytes > dit.diffusion_profile.peak_bytes + 3.8 * GiB  # weights, graphs, peak


def test_an_omnivoice_directory_reads_both_files_from_their_headers(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "omnivoice", "architectures": ["OmniVoice"]}))
    (tmp_path / "audio_tokenizer").mkdir()
    main = write_safetensors(tmp_path / "model.safetensors", {
        "llm.layers.0.self_attn.q_proj.weight": ("F32", [440_466_432]), "llm.embed_tokens.weight": ("F32", [151_676, 1024]),
        "audio_embeddings.weight": ("F32", [8200, 1024]), "audio_heads.weight": ("F32", [8200, 1024])})
    codec = write_safetensors(tmp_path / "audio_tokenizer" / "model.safetensors",
                              {"acoustic_decoder.block.0.weight": ("F32", [201_000_000])})
    result = _run("--gpus", "1xL4", "--model", str(tmp_path), "--format", "json", "-q")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    built = (21_570_000 * 4) + 757_209_600  # the decoder copy and the graph outputs, not in the files
    assert data["model"] == "omnivoice" and data["stages"][0]["weights_bytes"] == main + codec + built


def test_minimax_music3_counts_give_the_measured_backbone_and_the_repacked_files():
    pipeline = lookup_model("minimax-music3")
    talker = {c.name: c.params for c in pipeline.stage("minimax_music3_ar").components}
    backbone = 2 * (talker["qwen3_layers"] + talker["embeddings"] + talker["lm_head"])
    assert 15.9 * GiB < backbone < 16.01 * GiB  # sglang-omni: "weights alone load at 16.01GB"
    acoustic = {c.name: c.params for c in pipeline.stage("minimax_music3_acoustic").components}
    assert 0 < 4_914_197_682 - 2 * (acoustic["dit"] + acoustic["condition_encoder"]) < 100_000  # bf16 repack
    assert abs(216_696_128 - 4 * acoustic["vocoder"]) < 0.001 * 216_696_128  # fp32


def test_minimax_music3_plans_two_kv_rows_per_song_by_default():
    from omni_autoconf.planning.planner import build_problem

    from conftest import make_request

    problem, _ = build_problem(make_request("minimax-music3", "1xH100-80GB"))
    assert {st.name: st.min_requests for st in problem.stages if st.has_kv} == {"minimax_music3_ar": 2}
    for asked, held in [(1, 2), (2, 2), (3, 4)]:  # --min-concurrency counts rows, rounded up to whole requests
        problem, _ = build_problem(make_request("minimax-music3", "1xH100-80GB",
                                                min_concurrency={"minimax_music3_ar": asked}))
        assert problem.stages[0].min_requests == held
    data = json.loads(_run("--gpus", "1xH100-80GB", "--model", "minimax-music3", "--format", "json", "-q").stdout)
    assert data["stages"][0]["kv_cache_tokens"] >= 2 * 10240


@pytest.mark.parametrize("name, gpus", [("minimax_music3.yaml", "1xH200"), ("minimax_music3_2gpu.yaml", "2xH200")])
def test_the_bundled_minimax_music3_files_start_on_140gb_cards(name, gpus):
    from omni_autoconf.inputs.gpus import parse_gpus

    report = _check(name, parse_gpus(gpus), "minimax-music3")
    assert report.ok and not report.problems, [p.message for p in report.problems]


def test_personaplex_counts_give_its_bf16_checkpoint():
    """model.safetensors: "8.37B parameters", bf16 "15.59 GB" (its public copies)."""
    talker = lookup_model("personaplex-7b").stage("personaplex")
    params = sum(c.params for c in talker.components)
    assert round(params / 1e9, 2) == 8.37 and round(2 * params / GiB, 2) == 15.59
    memory = stage_memory(talker, 1, StageKnobs(3000, 10, 512, False, "auto", True), omni_version("0.30"))
    assert memory.kv_bytes_per_token >= 2 * 32 * 32 * 128 * 2  # a window as long as max_model_len frees nothing


@pytest.mark.parametrize("gpus", ["1xH100-80GB", "1xA100-80GB"])
def test_the_bundled_personaplex_file_holds_its_ten_requests_on_an_80gb_card(gpus):
    from omni_autoconf.inputs.gpus import parse_gpus

    report = _check("personaplex.yaml", parse_gpus(gpus), "personaplex-7b")
    assert report.ok and not report.problems, [p.message for p in report.problems]
    assert 10 <= report.stages[0].max_concurrency < 11  # 0.4 of the card sized for max_num_seqs 10


def test_a_personaplex_directory_points_to_the_catalog(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "voices.tgz").write_bytes(b"")
    result = _run("--gpus", "1xH100-80GB", "--model", str(tmp_path), "-q")
    assert result.exit_code == 2 and "--model personaplex-7b" in result.stderr


def test_moss_tts_realtime_counts_give_its_model_cards_backbone_and_local_transformer():
    """"a 1.7B-parameter backbone and a 200M-parameter local Transformer"."""
    talker = {c.name: c.params for c in lookup_model("moss-tts-realtime").stage("moss_tts").components}
    assert round((talker["qwen3_layers"] + talker["embeddings"]) / 1e9, 1) == 1.7
    assert round((talker["local_transformer"] - 15 * 1027 * 2048 - 16 * 2048 * 1027) / 1e6, -1) == 200
    codec = lookup_model("moss-tts-realtime").stage("moss_tts_codec")
    assert codec.serving_outside == lookup_model("moss-tts").stage("moss_tts_codec").serving_outside  # the same codec


def test_the_bundled_moss_tts_realtime_file_starts_on_one_80gb_card():
    from omni_autoconf.inputs.gpus import parse_gpus

    report = _check("moss_tts_realtime.yaml", parse_gpus("1xH100-80GB"), "moss-tts-realtime")
    assert report.ok and not report.problems, [p.message for p in report.problems]


def test_ming_tts_moe_counts_give_lings_16_8b_and_its_file_fits_the_h20_it_names():
    """ming_tts_moe.yaml: "~31GB bf16 + the tiny audio VAE fit one 80GB+ GPU ... fits 97GB H20"."""
    from omni_autoconf.inputs.gpus import parse_gpus

    llm = {c.name: c.params for c in lookup_model("ming-tts-16.8b-a3b").stage("llm").components}
    backbone = llm["moe_layers"] + llm["routers_and_norms"] + llm["embeddings"]
    assert round((backbone + 126_464 * 2048) / 1e9, 1) == 16.8  # with the lm_head vLLM-Omni drops
    assert round(2 * backbone / GiB, 1) == 30.8  # "~31GB bf16"
    report = _check("ming_tts_moe.yaml", parse_gpus("1xH20"), "ming-tts-16.8b-a3b")
    assert report.ok and not report.problems, [p.message for p in report.problems]


@pytest.mark.parametrize("gpus", ["1xL4", "1xH100-80GB"])
def test_the_bundled_dense_ming_tts_file_starts_on_one_gpu(gpus):
    from omni_autoconf.inputs.gpus import parse_gpus

    report = _check("ming_tts.yaml", parse_gpus(gpus), "ming-tts-0.5b")
    assert report.ok and not report.problems, [p.message for p in report.problems]


def test_minimax_music3s_rows_come_in_pairs_in_the_plan_and_in_check(tmp_path):
    from omni_autoconf.planning.check import check_config
    from omni_autoconf.inputs.configfile import read_config
    from omni_autoconf.inputs.gpus import parse_gpus

    from wheels import wheel_root

    base = ["--gpus", "1xH100-80GB", "--model", "minimax-music3", "-q"]
    odd = _run(*base, "--max-num-seqs", "minimax_music3_ar=3")
    assert odd.exit_code == 2 and "must be a multiple of 2" in odd.stderr
    one = json.loads(_run(*base, "--min-concurrency", "minimax_music3_ar=1", "--format", "json").stdout)
    assert one["stages"][0]["kv_cache_tokens"] >= 2 * 10240  # one row asked for: one whole request planned
    text = (wheel_root("0.30") / "vllm_omni" / "deploy" / "minimax_music3.yaml").read_text()
    path = tmp_path / "one.yaml"
    path.write_text(text.replace("max_num_seqs: 16", "max_num_seqs: 1"))
    report = check_config(lookup_model("minimax-music3"), parse_gpus("1xH200"), omni_version("0.30"),
                          read_config(str(path)))
    assert "cfg-rows-unpaired" in {p.code for p in report.errors}
    path.write_text(text.replace("gpu_memory_utilization: 0.6", "gpu_memory_utilization: 0.15"))
    report = check_config(lookup_model("minimax-music3"), parse_gpus("1xH200"), omni_version("0.30"),
                          read_config(str(path)))
    talker = report.stages[0]
    assert talker.started and 10240 <= talker.kv_cache_tokens < 2 * 10240  # one row fits vLLM's check, not a pair
    assert "cfg-rows-unpaired" in {p.code for p in report.errors}


def test_indextts_2s_plan_keeps_each_prefill_in_one_step_and_check_warns_on_the_bundled_512():
    from omni_autoconf.inputs.gpus import parse_gpus
    import yaml

    report = _check("indextts2.yaml", parse_gpus("1xL4"), "indextts-2")
    assert report.ok and {p.code for p in report.problems} == {"stage-batch-rule"}
    plan = yaml.safe_load(_run("--gpus", "1xL4", "--model", "indextts-2", "-q").stdout)
    talker = plan["stages"][0]
    assert talker["enable_chunked_prefill"] is False and talker["max_num_batched_tokens"] >= talker["max_model_len"]


def test_moss_tts_local_counts_give_its_files_and_its_h200_file_starts_with_the_pinned_kv():
    """"9.11 GB F16 GGUF, 438 tensors" for the talker, 2,123,701,248 codec parameters, and
    moss_tts_local_h200.yaml: "both stages on one H200", KV pinned at 32 GiB."""
    from omni_autoconf.inputs.gpus import parse_gpus

    pipeline = lookup_model("moss-tts-local-1.5")
    talker = sum(c.params for c in pipeline.stage("moss_tts_local").components if c.in_checkpoint)
    assert round(2 * talker / 1e9, 1) == 9.1
    codec = {c.name: c.params for c in pipeline.stage("moss_tts_local_codec").components}
    assert codec["codec_encoder"] + codec["codec_decoder"] == 2_123_701_248
    report = _check("moss_tts_local_h200.yaml", parse_gpus("1xH200"), "moss-tts-local-1.5")
    assert report.ok and report.stages[0].kv_cache_tokens == 233_008  # 32 GiB / (16 x 147,456 B) blocks of 16


def test_a_moss_tts_local_directory_reads_the_talker_from_its_headers(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "moss_tts_local", "n_vq": 12}))
    stored = write_safetensors(tmp_path / "model.safetensors", {
        "transformer.layers.0.self_attn.q_proj.weight": ("BF16", [3_633_511_936]),
        "transformer.embed_tokens.weight": ("BF16", [151_936, 2560]), "text_lm_head.weight": ("BF16", [151_936, 2560]),
        "audio_embeddings.0.weight": ("BF16", [12 * 1024, 2560]), "local_transformer.h.0.attn.weight": ("BF16", [76_100_000])})
    data = json.loads(_run("--gpus", "1xH200", "--model", str(tmp_path), "--format", "json", "-q").stdout)
    assert data["model"] == "moss-tts-local-1.5" and data["stages"][0]["weights_bytes"] == stored + 2 * 31_457_280


@pytest.mark.parametrize("name", ["higgs_multimodal_qwen3.yaml", "higgs_multimodal_qwen3_high_throughput.yaml",
                                  "higgs_multimodal_qwen3_low_latency.yaml"])
def test_the_bundled_higgs_v3_files_start_on_the_h100_of_the_recipes_reference_run(name):
    """"Reference run: 1x H100 80 GB — Stage 0 ~60% GPU memory, Stage 1 ~25%"."""
    from omni_autoconf.inputs.gpus import parse_gpus

    talker = lookup_model("higgs-audio-v3-4b").stage("higgs_audio_v3")
    assert round(sum(c.params for c in talker.components) / 1e9, 2) == 4.43  # the head planned untied
    report = _check(name, parse_gpus("1xH100-80GB"), "higgs-audio-v3-4b")
    assert report.ok and not report.problems, [p.message for p in report.problems]


AUDEX_FILES = [("audex_tts.yaml", "audex-tts-2b"), ("audex_tts_30b.yaml", "audex-tts-30b-a3b"),
               ("audex_s2s.yaml", "audex-s2s-2b"), ("audex_s2s_30b.yaml", "audex-s2s-30b-a3b"),
               ("audex_thinker_only.yaml", "audex-thinker-only-2b"),
               ("audex_thinker_only_30b.yaml", "audex-thinker-only-30b-a3b"),
               ("audex_tta.yaml", "audex-tta-2b"), ("audex_tta_30b.yaml", "audex-tta-30b-a3b")]


@pytest.mark.parametrize("name, model", AUDEX_FILES)
def test_every_bundled_audex_file_starts_on_the_h100_its_files_name(name, model):
    # audex_tts.yaml: "Verified on 1x H100."; the 30B files: "Single H100 80GB layout"
    report = _check(name, "1xH100-80GB", model)
    assert report.ok, [p.message for p in report.errors]


def test_audex_30b_thinkers_state_is_sized_as_vllm_pools_it():
    # vllm 0.30.0: block 16 x cdiv(2,134,016, 16 x 1,024) = 2096 tokens; 1 attention group and 4 Mamba
    # groups of 6 layers, so a block is 6 pages of 2096 x 1,024 B; a 4096-token request without prefix
    # caching takes 2 + 4 blocks (the plan charges the null block too)
    report = _check("audex_tts_30b.yaml", "1xH100-80GB", "audex-tts-30b-a3b")
    thinker = report.stages[0].run.memory
    pool = thinker.kv_layout
    assert (pool.block_tokens, pool.block_bytes, pool.blocks_per_request(4096)) == (2096, 12_877_824, 6)
    assert thinker.kv_bytes_per_token == -(-7 * 12_877_824 // 4096)
    assert thinker.weights_bytes / GiB == pytest.approx(59.56, abs=0.01)  # the file's "~60 GB bf16"
    # with prefix caching on, vLLM's "align" mode keeps two state blocks a Mamba group
    knobs = StageKnobs(4096, 8, 512, False, prefix_caching=True)
    stage = lookup_model("audex-tts-30b-a3b").stage("audex_thinker")
    assert stage_memory(stage, 1, knobs, omni_version("0.30")).kv_layout.blocks_per_request(4096) == 10
    # the 2B is plain attention: 114,688 B a token, no pool layout
    dense = _check("audex_tts.yaml", "1xH100-80GB", "audex-tts-2b").stages[0].run.memory
    assert dense.kv_layout is None and dense.kv_bytes_per_token == 114_688


def test_an_audex_repo_root_points_to_the_catalog(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "nemotron_labs_audex"}))
    result = _run("--gpus", "1xH100-80GB", "--model", str(tmp_path), "-q")
    assert result.exit_code == 2 and "--model audex-tts-2b" in result.output
    hub = _run("--gpus", "1xH100-80GB", "--model", "nvidia/Nemotron-Labs-Audex-30B-A3B", "-q")
    assert hub.exit_code == 2 and "audex-tts-30b-a3b" in hub.output


def test_audex_tta_plans_the_whole_xcodec_and_one_500_frame_decode():
    # XcodecModel built whole in fp32 (HuBERT and both encoders too), one request's at most 500
    # frames decoded at once, whatever max_num_seqs is
    codec = lookup_model("audex-tta-2b").stage("audex_xcodec")
    v = omni_version("0.30")
    held = [stage_memory(codec, 1, StageKnobs(8192, n, 8192, True), v) for n in (1, 8)]
    assert held[0].weights_bytes == 177_484_041 * 4
    assert held[0].activation_bytes == held[1].activation_bytes == 500 * 1048576


@pytest.mark.parametrize("name, gpus, tokens", [
    ("breeze_tts_2.yaml", "1xL4", 4672), ("breeze_tts.yaml", "1xL4", 4672),  # 512 MiB pinned
    ("breeze_tts_2_throughput.yaml", "1xH100-80GB", 74896),  # "tested on one H100 80 GB", 8 GiB pinned
    ("breeze_tts_throughput.yaml", "1xH100-80GB", 74896)])
def test_breeze_files_start_with_their_pinned_kv(name, gpus, tokens):
    report = _check(name, gpus, "breeze-tts-2")
    assert report.ok, [p.message for p in report.errors]
    talker = report.stages[0]
    assert talker.kv_cache_tokens == tokens  # the pinned bytes in 16-token blocks of 114,688 B a token


def test_breeze_counts_give_the_public_component_sizes():
    # CrispASR's converter: text encoder 1.00 B, backbone 1.41 B, depth decoder 434 M (with its fp32 heads)
    parts = {c.name: c.params for c in lookup_model("breeze-tts-2").stage("breeze_tts_2").components}
    assert round(parts["text_encoder"] / 1e9, 2) == 1.00 and round(parts["qwen3_backbone"] / 1e9, 2) == 1.41
    assert round((parts["depth_decoder"] + parts["fp32_heads"]) / 1e6) == 438  # 434 M + the 4.2 M lm_head


def test_a_files_mamba_cache_dtypes_size_the_state_it_names(tmp_path):
    # vllm 0.30.0 config/cache.py: mamba_ssm_cache_dtype overrides the model's hook; the bf16 state
    # halves the SSM page, so the block vLLM sets is 1072 tokens, not 2096; mode "all" is not modelled
    from omni_autoconf.inputs.catalog import lookup_model
    from omni_autoconf.planning.check import check_config
    from omni_autoconf.inputs.configfile import read_config
    from omni_autoconf.errors import InputError
    from omni_autoconf.inputs.gpus import parse_gpus
    from wheels import wheel_root

    text = (wheel_root("0.30") / "vllm_omni" / "deploy" / "audex_tts_30b.yaml").read_text()
    pipeline, gpus, v = lookup_model("audex-tts-30b-a3b"), parse_gpus("1xH100-80GB"), omni_version("0.30")
    sized = {}
    for dtype in ("bfloat16", "float32"):
        path = tmp_path / f"{dtype}.yaml"
        path.write_text(text.replace("    enable_prefix_caching: false\n    async_scheduling: true\n",
                                     f"    enable_prefix_caching: false\n    async_scheduling: true\n"
                                     f"    mamba_ssm_cache_dtype: {dtype}\n", 1))
        sized[dtype] = check_config(pipeline, gpus, v, read_config(str(path))).stages[0].run.memory.kv_layout
    assert (sized["bfloat16"].block_tokens, sized["float32"].block_tokens) == (1072, 2096)
    path = tmp_path / "all.yaml"
    path.write_text(text.replace("    enable_prefix_caching: false\n    async_scheduling: true\n",
                                 "    enable_prefix_caching: true\n    mamba_cache_mode: all\n", 1))
    with pytest.raises(InputError, match="mamba_cache_mode"):
        read_config(str(path))
    # a larger block or speculative decoding changes the pool (block alignment, a state block a
    # speculative token): refused, not judged as if absent
    for extra, match in (("    block_size: 8192\n", "block_size"),
                         ("    speculative_config: {method: ngram, num_speculative_tokens: 3}\n", "speculative")):
        path.write_text(text.replace("    async_scheduling: true\n", "    async_scheduling: true\n" + extra, 1))
        with pytest.raises(InputError, match=match):
            read_config(str(path))


@pytest.mark.parametrize("name, model", [
    ("nemotron_labs_voicechat.yaml", "nemotron-voicechat-11b"), ("nemotron_labs_voicechat_duplex.yaml", "nemotron-voicechat-11b"),
    ("nemotron_labs_voicechat_streaming.yaml", "nemotron-voicechat-11b-streaming")])
def test_voicechat_files_start_on_the_h100_their_figures_name(name, model):
    report = _check(name, "1xH100-80GB", model)  # "RTF 0.23 on 1x H100" and the like: latency, no memory figure
    assert report.ok, [p.message for p in report.errors]


def test_voicechat_thinker_pool_and_the_fp32_talker_on_a_48gb_card():
    report = _check("nemotron_labs_voicechat.yaml", "1xH100-80GB", "nemotron-voicechat-11b")
    thinker, talker = (o.run.memory for o in report.stages[:2])
    # the yaml's fp32 SSM state: block 16 x cdiv(5,316,608, 16 x 4,096) = 1312 tokens, 8 groups of 4
    # layers (1 attention, 7 Mamba), a request of 8192 tokens 7 + 7 blocks
    assert (thinker.kv_layout.block_tokens, thinker.kv_layout.block_bytes) == (1312, 4 * 1312 * 4096)
    assert thinker.kv_layout.blocks_per_request(8192) == 14
    assert thinker.weights_bytes / GiB == pytest.approx(19.89, abs=0.01)
    # the talker's KV is fp32 (Triton): 9,216 B per layer and token, sliding layers in the hybrid pool
    assert talker.kv_layout.layer_token_bytes == 2 * 16 * 72 * 4
    # at 0.12 of a 48 GB card the talker cannot hold one 16384-token request
    small = _check("nemotron_labs_voicechat.yaml", "1xL40S", "nemotron-voicechat-11b")
    assert {(p.code, p.stage) for p in small.errors} >= {("kv-below-max-model-len", "talker")}


MINICPMO_FILES = [("minicpmo_4_5.yaml", "1xH200"), ("minicpmo_4_5_turn.yaml", "1xH200"),
                  ("minicpmo_4_5_2gpu.yaml", "2xH100-80GB"), ("minicpmo_4_5_3gpu.yaml", "3xH100-80GB"),
                  ("minicpmo_4_5_3gpu_stage1_replicas.yaml", "3xH100-80GB"),
                  ("minicpmo_4_5_4gpu_stage1_replicas.yaml", "4xH100-80GB"), ("minicpmo_4_5_8x4090.yaml", "8xRTX4090")]


@pytest.mark.parametrize("name, gpus", MINICPMO_FILES)
def test_minicpmo_files_start_on_the_cards_they_are_laid_out_for(name, gpus):
    report = _check(name, gpus, "minicpmo-4.5")
    assert report.ok, [p.message for p in report.errors]


def test_minicpmo_8x4090_replicas_file_oversubscribes_gpu_5():
    # a tts replica (0.8) and code2wav (0.9, which reserves nothing) share GPU 5: what the tts
    # replica leaves cannot hold the code2wav's weights and state beside the margin
    report = _check("minicpmo_4_5_8x4090_stage1_replicas.yaml", "8xRTX4090", "minicpmo-4.5")
    assert ("gpu-oversubscribed", 5) in {(p.code, p.gpu) for p in report.errors}


def test_minicpmo_profiles_at_most_max_num_seqs_videos():
    # vllm 0.30.0 encoder_budget.py: min(budget // 4096, max_num_seqs x 1 video a prompt) videos
    llm = lookup_model("minicpmo-4.5").stage("llm")
    v = omni_version("0.30")
    peaks = [stage_memory(llm, 1, StageKnobs(40960, n, 16384, False), v).activation_bytes for n in (1, 4, 8)]
    assert peaks[0] < peaks[1] == peaks[2]  # 1 video, then the budget's 4


def test_ming_flash_omni_thinker_counts_give_ling_flash():
    # one router a layer gives Ling-flash-2.0's 102,889,697,280 (its Hub count); Ming's MultiRouter adds two
    parts = {c.name: c.params for c in lookup_model("ming-flash-omni-2.0").stage("thinker").components}
    routers = 31 * 3 * 256 * 4096
    assert parts["moe_lm"] + parts["routers_and_norms"] - routers * 2 // 3 == 102_889_697_280


def test_joyai_starts_on_one_h100_and_auras_full_length_needs_an_h200():
    assert _check("joyai_vl_interaction.yaml", "1xH100-80GB", "joyai-vl-interaction-preview").ok
    # AuRA's file names no verified hardware: on an H200 its fraction leaves (by the derived profile
    # peak and the kept-workspace estimate, which errs high) within 1% of one 262,144-token request
    big = _check("aura_omni.yaml", "1xH200", "aura-omni")
    assert {p.code for p in big.errors} <= {"kv-below-max-model-len"}
    aura = next(s for s in big.stages if s.run.name == "aura")
    assert aura.kv_cache_tokens >= 0.99 * 262_144
    # one 262,144-token request of the Qwen3-VL-8B stage needs 36 GiB of KV: more than 0.x of 80 GB leaves
    small = _check("aura_omni.yaml", "1xH100-80GB", "aura-omni")
    assert ("kv-below-max-model-len", "aura") in {(p.code, p.stage) for p in small.errors}


def test_covo_audio_starts_on_the_a100_it_was_verified_on_with_its_longest_reply_planned():
    # "Verified on 1x A100-80G."; code2wav planned at the 2047-code reply its max_model_len allows,
    # whose fp32 attention bias grows with the square of the codes (beyond its 0.2 fraction: a warning)
    report = _check("covo_audio.yaml", "1xA100-80GB", "covo-audio-chat")
    assert report.ok, [p.message for p in report.errors]
    assert "fraction-below-usage" in {p.code for p in report.problems if p.severity == "warning"}
    assert report.stages[1].run.memory.activation_bytes >= 21 * GiB


def test_mimo_audio_needs_its_tokenizer_on_the_cpu_to_fit_the_5090d_it_was_verified_on():
    # the recipe that verified mimo_audio_5090d.yaml sets MIMO_AUDIO_TOKENIZER_DEVICE=cpu: with it the
    # file starts, and its KV stays at or below the recipe's ~4.9 GiB ("KV cache ~4.9 GiB",
    # https://github.com/vllm-project/vllm-omni/pull/6559); with the tokenizer copies on the GPU it does not fit
    cpu = _check("mimo_audio_5090d.yaml", "1xRTX5090", "mimo-audio-7b-tokenizer-cpu")
    assert cpu.ok and cpu.stages[0].kv_cache_bytes <= 4.9 * GiB
    assert "gpu-oversubscribed" in {p.code for p in _check("mimo_audio_5090d.yaml", "1xRTX5090", "mimo-audio-7b").errors}
    assert _check("mimo_audio.yaml", "1xH100-80GB", "mimo-audio-7b").ok


def test_mimo_audio_profiles_its_logits_over_every_token():
    # compute_logits over every batched token and a clone: 2 x tokens x 151680 x 2 B beyond the usual terms
    stage = lookup_model("mimo-audio-7b").stage("fused_thinker_talker")
    v = omni_version("0.30")
    peaks = [stage_memory(stage, 1, StageKnobs(8192, 1, t, True), v).activation_bytes for t in (4096, 8192)]
    assert peaks[1] - peaks[0] >= 2 * 4096 * 151680 * 2

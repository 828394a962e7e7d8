"""--model DIR and --model ORG/NAME: every number from the checkpoint, weights exactly.

The fixtures are real safetensors files with byte-exact headers (8-byte little-endian
length, JSON header, data), written here; the large ones are sparse, so they take no disk.
"""

from __future__ import annotations

import json
import struct
from importlib import resources
from pathlib import Path

import pytest
from click.testing import CliRunner

from omni_autoconf.inputs.catalog import lookup_model
from omni_autoconf.cli.main import main
from omni_autoconf.memory.stage_memory import kv_bytes_per_token
from omni_autoconf.inputs.model_source import resolve

ELEMENT = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "I32": 4}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> int:
    """A safetensors file of zero-filled (sparse) tensors; returns its data bytes."""
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = ELEMENT[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        f.truncate(8 + len(blob) + offset)
    return offset


LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 2,
         "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
         "max_position_embeddings": 8192, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def llama_tensors(fp8: bool = False) -> dict:
    h, i, v, kv = 4096, 14336, 128256, 1024
    out = {"model.embed_tokens.weight": ("BF16", [v, h]), "lm_head.weight": ("BF16", [v, h]),
           "model.norm.weight": ("BF16", [h])}
    linear = "F8_E4M3" if fp8 else "BF16"
    for n in range(2):
        p = f"model.layers.{n}."
        out.update({p + "self_attn.q_proj.weight": (linear, [h, h]), p + "self_attn.k_proj.weight": (linear, [kv, h]),
                    p + "self_attn.v_proj.weight": (linear, [kv, h]), p + "self_attn.o_proj.weight": (linear, [h, h]),
                    p + "mlp.gate_proj.weight": (linear, [i, h]), p + "mlp.up_proj.weight": (linear, [i, h]),
                    p + "mlp.down_proj.weight": (linear, [h, i]), p + "input_layernorm.weight": ("BF16", [h]),
                    p + "post_attention_layernorm.weight": ("BF16", [h])})
        if fp8:
            out[p + "mlp.down_proj.weight_scale"] = ("F32", [1])
    return out


def llama_dir(tmp_path: Path, sharded: bool = False, fp8: bool = False) -> tuple[Path, int]:
    root = tmp_path / "llama"
    root.mkdir()
    cfg = dict(LLAMA)
    if fp8:
        cfg["quantization_config"] = {"quant_method": "fp8"}
    (root / "config.json").write_text(json.dumps(cfg))
    tensors = llama_tensors(fp8)
    if not sharded:
        return root, write_safetensors(root / "model.safetensors", tensors)
    names = sorted(tensors)
    half = len(names) // 2
    total = write_safetensors(root / "model-00001-of-00002.safetensors", {k: tensors[k] for k in names[:half]})
    total += write_safetensors(root / "model-00002-of-00002.safetensors", {k: tensors[k] for k in names[half:]})
    weight_map = {k: ("model-00001-of-00002.safetensors" if k in names[:half] else "model-00002-of-00002.safetensors")
                  for k in names}
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root, total


def plan_json(*args):
    result = CliRunner().invoke(main, [*map(str, args), "--format", "json", "-q"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("sharded", [False, True])
def test_a_plain_llm_directory_plans_with_its_exact_weights(tmp_path, sharded):
    root, total = llama_dir(tmp_path, sharded)
    data = plan_json("--gpus", "1xH100-80GB", "--model", root, "--max-model-len", "8192")
    (stage,) = data["stages"]
    assert stage["weights_bytes"] == total  # TP=1: every tensor's stored bytes, exactly
    assert stage["kv_bytes_per_token"] == 2 * 2 * 8 * 128 * 2
    assert data["model_ref"] == str(root)


def test_quantized_tensors_count_at_their_stored_size(tmp_path):
    root, total = llama_dir(tmp_path, fp8=True)
    data = plan_json("--gpus", "1xH100-80GB", "--model", root, "--max-model-len", "8192")
    assert data["stages"][0]["weights_bytes"] == total


def test_weights_split_over_tp_ranks_but_norms_stay_whole(tmp_path):
    root, total = llama_dir(tmp_path)
    norms = (2 * 2 + 1) * 4096 * 2
    data = plan_json("--gpus", "2xH100-80GB", "--model", root, "--tp", "llm=2", "--max-model-len", "8192")
    assert data["stages"][0]["weights_bytes"] == (total - norms) // 2 + norms


def qwen3_omni_dir(tmp_path: Path, audio_output: bool = True) -> tuple[Path, dict[str, int]]:
    """A Qwen3-Omni checkpoint; without audio output (a Thinking or Captioner checkpoint)
    it holds the thinker's tensors only and says enable_audio_output false."""
    root = tmp_path / "qwen3-omni"
    root.mkdir()
    config = json.loads(resources.files("omni_autoconf.models").joinpath("qwen3-omni-moe.config.json").read_text())
    config["enable_audio_output"] = audio_output
    (root / "config.json").write_text(json.dumps(config))
    tensors = {
        "thinker.model.embed_tokens.weight": ("BF16", [152064, 2048]),
        "thinker.lm_head.weight": ("BF16", [152064, 2048]),
        "thinker.model.layers.0.mlp.experts.w13_weight": ("BF16", [128, 1536, 2048]),
        "thinker.model.layers.rest.weight": ("BF16", [14_700_000_000]),
        "thinker.model.layers.0.mlp.gate.weight": ("BF16", [128, 2048]),
        "thinker.model.norm.weight": ("BF16", [2048]),
        "thinker.audio_tower.layers.weight": ("BF16", [650_000_000]),
        "thinker.visual.blocks.weight": ("BF16", [540_000_000]),
        "talker.model.layers.weight": ("BF16", [3_320_000_000]),
        "talker.model.norm.weight": ("BF16", [1024]),
        "code2wav.decoder.weight": ("BF16", [220_000_000]),
    }
    if not audio_output:
        tensors = {name: spec for name, spec in tensors.items() if name.startswith("thinker.")}
    write_safetensors(root / "model.safetensors", tensors)
    sizes = {}
    for name, (dtype, shape) in tensors.items():
        n = ELEMENT[dtype]
        for d in shape:
            n *= d
        stage = name.split(".")[0]
        sizes[stage] = sizes.get(stage, 0) + n
    return root, sizes


def test_an_omni_checkpoint_plans_each_stage_with_its_exact_weights(tmp_path):
    root, sizes = qwen3_omni_dir(tmp_path)
    data = plan_json("--gpus", "2xH100-80GB", "--model", root, "--tp", "thinker=1")
    weights = {s["name"]: s["weights_bytes"] for s in data["stages"]}
    assert weights == sizes  # at TP=1: each stage's tensors' stored bytes, exactly
    buffers = {s["name"]: s["load_buffer_bytes"] for s in data["stages"]}
    assert buffers["thinker"] == 3 * 32768 * 2048 * 2  # the deepstack buffers, built at load: not in the checkpoint
    assert data["model"] == "qwen3-omni-moe"


def test_a_qwen3_omni_checkpoint_without_audio_output_plans_the_thinker_alone(tmp_path):
    root, sizes = qwen3_omni_dir(tmp_path, audio_output=False)
    data = plan_json("--gpus", "2xH100-80GB", "--model", root, "--tp", "thinker=1")
    assert data["model"] == "qwen3-omni-moe-thinking"
    assert {s["name"]: s["weights_bytes"] for s in data["stages"]} == sizes == {"thinker": sizes["thinker"]}


def test_the_qwen3_config_gives_the_catalogs_kv_bytes_per_token(tmp_path):
    root, _ = qwen3_omni_dir(tmp_path)
    from_dir = resolve(str(root)).pipeline
    catalog = lookup_model("qwen3-omni-moe")
    for name in ("thinker", "talker"):
        for tp in (1, 2):
            assert kv_bytes_per_token(from_dir.stage(name), tp) == kv_bytes_per_token(catalog.stage(name), tp)


def test_an_mla_config_gives_1152_bytes_per_token_and_layer_at_every_tp(tmp_path):
    root = tmp_path / "dsv2"
    root.mkdir()
    cfg = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 2048,
           "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 10944,
           "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
           "first_k_dense_replace": 1, "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128,
           "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 102400, "max_position_embeddings": 163840,
           "torch_dtype": "bfloat16"}
    (root / "config.json").write_text(json.dumps(cfg))
    write_safetensors(root / "model.safetensors", {"model.layers.weight": ("BF16", [15_700_000_000])})
    stage = resolve(str(root)).pipeline.stages[0]
    for tp in (1, 2, 4, 8):
        assert kv_bytes_per_token(stage, tp) == 1152 * 27


@pytest.mark.parametrize("break_it, needle", [
    (lambda root: (root / "config.json").unlink(), "config.json: missing"),
    (lambda root: (root / "model-00002-of-00002.safetensors").unlink(), "named by model.safetensors.index.json but missing"),
    (lambda root: (root / "model-00001-of-00002.safetensors").write_bytes(b"\xff" * 64), "not a safetensors file"),
    (lambda root: (root / "model.safetensors.index.json").write_text("{"), "not valid JSON"),
])
def test_a_broken_directory_names_the_file(tmp_path, break_it, needle):
    root, _ = llama_dir(tmp_path, sharded=True)
    break_it(root)
    result = CliRunner().invoke(main, ["--gpus", "1xH100-80GB", "--model", str(root)])
    assert result.exit_code == 2 and needle in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_hub_id_offline_says_to_pass_a_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("omni_autoconf.inputs.checkpoint.CACHE_DIR", tmp_path)
    result = CliRunner().invoke(main, ["--gpus", "1xH100-80GB", "--model", "some-org/some-model"])
    assert result.exit_code == 2 and "pass a local model directory" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_unreachable_hub_is_one_line_in_seconds(tmp_path, monkeypatch):
    import socket
    import time

    with socket.socket() as probe:  # a local port nobody listens on: connection refused at once
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr("omni_autoconf.inputs.checkpoint.CACHE_DIR", tmp_path)
    t0 = time.perf_counter()
    result = CliRunner().invoke(main, ["--gpus", "1xH100-80GB", "--model", "some-org/some-model"])
    assert time.perf_counter() - t0 < 10
    assert result.exit_code == 2 and f"cannot reach http://127.0.0.1:{port}" in result.stderr
    assert "pass a local model directory" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def _cached_llama_hub_entry(tmp_path, monkeypatch, repo: str) -> list:
    """An offline Hub cache holding the tiny Llama's config and headers under `repo`."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("omni_autoconf.inputs.checkpoint.CACHE_DIR", tmp_path)
    tensors = [[name, dtype, ELEMENT[dtype] * __import__("math").prod(shape)] for name, (dtype, shape) in llama_tensors().items()]
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / f"{repo.replace('/', '--')}.json").write_text(json.dumps({"config": LLAMA, "tensors": tensors}))
    return tensors


def test_a_hub_id_is_read_from_the_cache_without_the_network(tmp_path, monkeypatch):
    tensors = _cached_llama_hub_entry(tmp_path, monkeypatch, "meta-llama/Tiny")
    data = plan_json("--gpus", "1xH100-80GB", "--model", "meta-llama/Tiny", "--max-model-len", "8192")
    assert data["stages"][0]["weights_bytes"] == sum(t[2] for t in tensors)


def test_a_stage_cast_at_load_is_planned_at_the_loaded_size_and_says_so(tmp_path):
    root = tmp_path / "qwen25"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"architectures": ["Qwen2_5OmniModel"], "model_type": "qwen2_5_omni",
                                                  "thinker_config": {"text_config": {"hidden_size": 3584}}}))
    write_safetensors(root / "model.safetensors", {
        "thinker.model.layers.weight": ("BF16", [7_600_000_000]),
        "thinker.audio_tower.weight": ("BF16", [640_000_000]),
        "thinker.visual.weight": ("BF16", [680_000_000]),
        "talker.model.weight": ("BF16", [1_350_000_000]),
        "token2wav.code2wav_dit_model.weight": ("BF16", [400_000_000]),
    })
    result = CliRunner().invoke(main, ["--gpus", "2xH100-80GB", "--model", str(root), "--max-model-len", "8192", "-q"])
    assert result.exit_code == 0, result.stderr
    assert "code2wav: weights stored in BF16 are loaded as float32" in result.stdout
    data = plan_json("--gpus", "2xH100-80GB", "--model", root, "--max-model-len", "8192")
    assert {s["name"]: s["weights_bytes"] for s in data["stages"]}["code2wav"] == 400_000_000 * 4


def _llm_with(tmp_path, **extra) -> Path:
    root, _ = llama_dir(tmp_path)
    cfg = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**cfg, **extra}))
    return root


@pytest.mark.parametrize("extra, sliding", [
    ({"model_type": "gemma3_text", "sliding_window": 1024}, 2),            # Gemma 3 default: full every 6th: 2 - 0
    ({"model_type": "gemma3_text", "sliding_window": 1024, "sliding_window_pattern": 2}, 1),
    ({"model_type": "x", "sliding_window": 64, "layer_types": ["SLIDING_ATTENTION", "full_attention"]}, 1),
    ({"model_type": "mistral", "sliding_window": 4096}, 2),                # every layer slides
    ({"model_type": "gpt_oss", "sliding_window": 128}, 1),                 # even layers
    ({"model_type": "qwen2", "sliding_window": 131072, "use_sliding_window": False}, 0),
    ({"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 2}, 0),
    ({"model_type": "mistral", "sliding_window": None}, 0),
    ({"model_type": "cohere2", "sliding_window": 4096, "num_hidden_layers": 8}, 6),  # its config: 3 sliding : 1 full
    ({"model_type": "olmo3", "sliding_window": 4096, "num_hidden_layers": 8}, 6),
    ({"model_type": "gemma3_text", "num_hidden_layers": 12}, 10),          # window absent: the class's 4096
    ({"model_type": "qwen2", "sliding_window": 4096}, 0),                  # use_sliding_window defaults to False
    ({"model_type": "qwen3", "sliding_window": 4096, "use_sliding_window": True}, 0),  # max_window_layers 28
])
def test_the_sliding_layers_are_read_as_vllm_reads_them(tmp_path, extra, sliding):
    t = resolve(str(_llm_with(tmp_path, **extra))).pipeline.stages[0].transformer
    assert t.sliding_layers == sliding and (t.sliding_window > 0) == (sliding > 0)


def test_a_qwen2_config_sliding_on_some_layers_is_refused_as_vllm_refuses_it(tmp_path):
    root = _llm_with(tmp_path, model_type="qwen2", sliding_window=4096, use_sliding_window=True, max_window_layers=1)
    result = CliRunner().invoke(main, ["--gpus", "1xH100-80GB", "--model", str(root), "-q"])
    assert result.exit_code == 2 and "max_window_layers" in result.stderr


@pytest.mark.parametrize("extra, needle", [
    ({"model_type": "exaone4", "sliding_window": 4096}, "which layers of a exaone4 model slide"),
    ({"model_type": "gemma4_text", "global_head_dim": 512, "sliding_window": 1024}, "unequal KV size"),
])
def test_a_sliding_layout_it_cannot_read_is_refused(tmp_path, extra, needle):
    result = CliRunner().invoke(main, ["--gpus", "1xH100-80GB", "--model", str(_llm_with(tmp_path, **extra)), "-q"])
    assert result.exit_code == 2 and needle in result.stderr


def test_a_multimodal_config_is_refused_as_a_one_stage_llm(tmp_path):
    root = _llm_with(tmp_path, vision_config={"hidden_size": 1152})
    result = CliRunner().invoke(main, ["--gpus", "1xH100-80GB", "--model", str(root), "-q"])
    assert result.exit_code == 2 and "multimodal" in result.stderr


def test_a_qwen2_config_listing_mixed_layer_types_is_refused(tmp_path):
    root = _llm_with(tmp_path, model_type="qwen3", sliding_window=4096, use_sliding_window=True,
                     layer_types=["sliding_attention", "full_attention"])
    result = CliRunner().invoke(main, ["--gpus", "1xH100-80GB", "--model", str(root), "-q"])
    assert result.exit_code == 2 and "layer_types mix" in result.stderr


def test_a_file_without_the_hybrid_manager_or_with_a_kv_connector_is_judged_as_vllm_sizes_it(tmp_path):
    """disable_hybrid_kv_cache_manager makes vLLM size the sliding layers of a mixed model as
    full attention (vllm 0.30.0 v1/core/kv_cache_utils.py unify_hybrid_kv_cache_specs); a
    kv_transfer_config's connector may do the same, so the worse of the two is counted."""
    root = _llm_with(tmp_path, model_type="gemma3_text", sliding_window=1024, num_hidden_layers=12,
                     max_position_embeddings=65536)
    plan_path = tmp_path / "plan.yaml"
    result = CliRunner().invoke(main, ["--gpus", "1xH100-80GB", "--model", str(root), "--max-model-len", "65536",
                                       "-o", str(plan_path), "-q"])
    assert result.exit_code == 0, result.stderr
    variants = {"hybrid": "", "off": "  disable_hybrid_kv_cache_manager: true\n",
                "connector": "  kv_transfer_config: {kv_connector: LMCacheConnectorV1, kv_role: kv_both}\n"}
    tokens = {}
    for name, extra in variants.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(plan_path.read_text().replace("  enforce_eager:", extra + "  enforce_eager:", 1))
        checked = CliRunner().invoke(main, ["check", str(path), "--gpus", "1xH100-80GB", "--model", str(root),
                                            "--format", "json"])
        tokens[name] = json.loads(checked.stdout)["stages"][0]["kv_cache_tokens"]
    assert tokens["off"] < tokens["hybrid"] / 2.5  # 12 full layers against 1 full group and 5 windowed ones (2.58x)
    assert tokens["connector"] == min(tokens["hybrid"], tokens["off"])


def test_a_catalog_pipelines_hub_id_that_reads_as_another_is_refused_with_its_name(tmp_path, monkeypatch):
    """Gepard's config.json says qwen3_5_text: read alone it would plan as a plain LLM."""
    _cached_llama_hub_entry(tmp_path, monkeypatch, "nineninesix/gepard-1.0")
    result = CliRunner().invoke(main, ["--gpus", "1xL4", "--model", "nineninesix/gepard-1.0", "-q"])
    assert result.exit_code == 2 and "--model gepard-1.0" in result.stderr

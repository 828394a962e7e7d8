"""Mamba layers in vLLM's hybrid pool (solver/memory/mamba_pool.py) against public start-up
logs: the block vLLM sets, its padding, the groups, and the "Maximum concurrency" and "GPU KV
cache size" it prints for the "Available KV cache memory" it logged; Mamba-hybrid checkpoint
directories (Nemotron-H, Qwen3.6) planned with their state in the pool."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from omni_autoconf.inputs.catalog import lookup_model
from omni_autoconf.inputs.catalog_parts import StateLayers
from omni_autoconf.cli.main import main
from omni_autoconf.errors import InputError
from omni_autoconf.memory.mamba_pool import StatePool, state_page_bytes, state_pool
from omni_autoconf.memory.stage_memory import StageKnobs, stage_memory
from omni_autoconf.inputs.model_source import resolve
from omni_autoconf.vllm.facts import omni_version

from test_checkpoints import write_safetensors

GiB = 1 << 30

# Nemotron-3-Nano-30B-A3B's layout (23 Mamba2, 6 attention layers of 2 KV heads x 128), which
# Nemotron-Cascade-2-30B-A3B and the Audex-30B thinker share
NANO_30B = StateLayers(layers=23, num_heads=64, head_dim=64, state_size=128, n_groups=8, conv_kernel=4,
                       chunk_size=128, ssm_dtype="float32", source="test")


def _concurrency(pool: StatePool, available: int, length: int) -> tuple[int, float]:
    """vLLM's figures for a pool of `available` bytes: blocks, blocks / blocks per request
    (v1/core/kv_cache_utils.py get_max_concurrency_for_kv_cache_config)."""
    blocks = available // pool.block_bytes
    return blocks, blocks / pool.blocks_per_request(length)


def _logged(pool: StatePool, gib: float, length: int, concurrency: str) -> int:
    """The block count of a logged "Available KV cache memory" (printed to 0.01 GiB) whose
    concurrency prints as logged; fails when no count in the rounding interval does."""
    low, high = (_concurrency(pool, int((gib + d) * GiB), length)[0] for d in (-0.005, 0.005))
    matches = [n for n in range(low, high + 1) if f"{n / pool.blocks_per_request(length):.2f}" == concurrency]
    assert matches, (low, high)
    return matches[0]


def _checkpoint(path, cfg: dict, tensors: dict | None = None) -> int:
    """A model directory of `cfg` and a safetensors file of `tensors` (one small table by default)."""
    (path / "config.json").write_text(json.dumps(cfg))
    return write_safetensors(path / "model.safetensors", tensors or {"model.embed_tokens.weight": ("BF16", [1000, 256])})


def _plan_exit(path) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["--gpus", "1xH100-80GB", "--model", str(path), "-q"])
    return result.exit_code, result.output


def _groups(pool: StatePool) -> int:
    g = pool.group
    return -(-pool.attn_layers // g) + -(-pool.state_layers // g)


def test_the_state_page_is_vllms_mamba2_state_shape():
    # conv 3 x (4096 + 2 x 8 x 128) in bf16 + SSM 64 x 64 x 128 in fp32 (mamba_utils.py mamba2_state_shape)
    assert state_page_bytes(NANO_30B, 1, 2) == 3 * 6144 * 2 + 64 * 64 * 128 * 4 == 2_134_016
    assert state_page_bytes(NANO_30B, 2, 2) == 2_134_016 // 2
    bf16 = NANO_30B.model_copy(update={"ssm_dtype": "auto"})
    assert state_page_bytes(bf16, 1, 2) == 3 * 6144 * 2 + 64 * 64 * 128 * 2
    # one group at TP 4: replicated to every rank, 4 groups' conv channels split over the 4
    one = NANO_30B.model_copy(update={"n_groups": 1})
    assert state_page_bytes(one, 4, 2) == (4096 + 2 * 4 * 128) // 4 * 3 * 2 + 16 * 64 * 128 * 4


@pytest.mark.parametrize("gib, length, blocks, concurrency, tokens, version", [
    # Nemotron-Cascade-2-30B-A3B-NVFP4, fp8 KV, fp32 SSM, prefix caching off, TP 1: vLLM 0.20.1rc1
    # ("Available KV cache memory: 3.72 GiB", "GPU KV cache size: 1,206,303 tokens", "Maximum
    # concurrency for 256,000 tokens per request: 4.71x") and 0.19.1 (68.97 GiB, 4,819,104 tokens,
    # 86.16x for 262,144): public start-up logs found by exact-string search of public GitHub
    # content, the lines quoted here
    (3.72, 256000, 311, "4.71", 1_206_303, "new"),
    (68.97, 262144, 5773, "86.16", 4_819_104, "old"),
])
def test_nemotron_cascade_2_logs(gib, length, blocks, concurrency, tokens, version):
    pool = state_pool(NANO_30B, 6, 2 * 2 * 128 * 1, 1, 2, False, (0, 20))
    assert pool.block_tokens == 4176  # "Setting attention block size to 4176 tokens"
    padding = pool.block_tokens * pool.attn_token_bytes / pool.state_bytes - 1
    assert f"{100 * padding:.2f}" == "0.19"  # "Padding mamba page size by 0.19%"
    assert pool.group == 6 and _groups(pool) == 5  # "Add 1 padding layers" (23 Mamba layers in 4 groups of 6)
    n = _logged(pool, gib, length, concurrency)
    c = n / pool.blocks_per_request(length)
    assert n == blocks
    # the printed token count: int(concurrency x max_model_len) from vLLM 0.20.1, before it
    # num_blocks // groups x block
    assert (int(c * length) if version == "new" else n // _groups(pool) * pool.block_tokens) == tokens


def test_nemotron_3_nano_4b_log():
    # nvidia/NVIDIA-Nemotron-3-Nano-4B-FP8 on vLLM 0.13 (NGC 26.01): "Updating mamba_ssm_cache_dtype to
    # 'float16'", block 992, "Add 3 padding layers", 11.15 GiB, 208,320 tokens, 98.20x for 8,192
    nano4 = StateLayers(layers=21, num_heads=96, head_dim=80, state_size=128, n_groups=8, conv_kernel=4,
                        chunk_size=256, ssm_dtype="auto", source="test")
    pool = state_pool(nano4, 4, 2 * 8 * 128 * 1, 1, 2, False, (0, 13))
    assert pool.block_tokens == 992 and pool.group == 4 and _groups(pool) == 7
    n = _logged(pool, 11.15, 8192, "98.20")
    assert n // 7 * 992 == 208_320


@pytest.mark.parametrize("gib, length, concurrency", [(2.95, 65536, "3.87"), (5.98, 131072, "4.33")])
def test_qwen3_6_gated_deltanet_logs_keep_two_state_blocks_with_prefix_caching(gib, length, concurrency):
    # Qwen3.6-35B-A3B (10 attention layers of 2 KV heads x 256 in fp8, 30 Gated DeltaNet layers whose
    # state is conv 3 x 8192 in bf16 + 32 x 128 x 128 in fp32: mamba_utils.py gated_delta_net_state_shape),
    # prefix caching on ("Mamba cache mode is set to 'align'"): vLLM 0.20.0 (2.95 GiB, 3.87x for 65,536)
    # and 0.24.0 (https://github.com/noonghunna/club-3090/issues/612: 5.98 GiB, 4.33x for 131,072)
    page = 3 * 8192 * 2 + 32 * 128 * 128 * 4
    pool = StatePool(2 * 2 * 256 * 1, 10, page, 30, prefix_caching=True, vllm=(0, 20))
    assert pool.block_tokens == 2096 and pool.block_tokens * pool.attn_token_bytes == page  # no padding line
    _logged(pool, gib, length, concurrency)
    off = StatePool(2 * 2 * 256 * 1, 10, page, 30, prefix_caching=False, vllm=(0, 20))
    with pytest.raises(AssertionError):  # one state block a group would not give the logged figure
        _logged(off, gib, length, concurrency)


def test_the_planner_never_counts_more_requests_than_vllm():
    # the effective bytes per token charge every request the null block: at most vLLM's
    # concurrency, and within one request's blocks of it
    pool = state_pool(NANO_30B, 6, 2 * 2 * 128 * 2, 1, 2, False, (0, 30))
    assert pool.block_tokens == 2096 and pool.block_bytes == 12_877_824  # bf16 KV: 6 pages of 2,146,304 B
    for length in (4096, 8192, 32768):
        per_token = -(-pool.request_bytes(length) // length)
        for gib in (1, 7, 40):
            counted = gib * GiB / (per_token * length)
            blocks, vllm = _concurrency(pool, gib * GiB, length)
            assert counted <= vllm
            assert counted >= (blocks - 1) / (pool.blocks_per_request(length) + 1) - 1e-9


@pytest.mark.parametrize("extra", [
    {"model_type": "jamba", "attn_layer_period": 8, "mamba_d_state": 16},
    {"model_type": "falcon_h1", "mamba_d_ssm": 1024, "mamba_n_heads": 16},
    {"model_type": "lfm2", "layer_types": ["conv", "full_attention"], "conv_L_cache": 3},
    {"model_type": "granitemoehybrid", "layer_types": ["mamba", "attention"]},
    {"model_type": "mamba2"},
])
def test_a_hybrid_directory_is_refused_not_read_as_all_attention(tmp_path, extra):
    # read as a plain decoder, its Mamba layers would count as attention and its state as nothing
    cfg = {"architectures": ["X"], "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096,
           "torch_dtype": "bfloat16", **extra}
    _checkpoint(tmp_path, cfg)
    code, output = _plan_exit(tmp_path)
    assert code == 2 and "Mamba or linear-attention layers" in output, output


NANO_30B_CONFIG = {  # Nemotron-3-Nano-30B-A3B's config.json as the Audex notes cite it (hybrid_override_pattern etc.)
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": 2688, "num_hidden_layers": 52,
    "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 131072,
    "max_position_embeddings": 262144, "intermediate_size": 1856, "moe_intermediate_size": 1856,
    "moe_shared_expert_intermediate_size": 3712, "n_routed_experts": 128, "num_experts_per_tok": 6,
    "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME", "mamba_num_heads": 64,
    "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128,
    "torch_dtype": "bfloat16"}


def test_a_nemotron_h_directory_plans_its_mamba_state_in_the_pool(tmp_path):
    stored = _checkpoint(tmp_path, NANO_30B_CONFIG, {
        "backbone.embeddings.weight": ("BF16", [131072, 2688]), "lm_head.weight": ("BF16", [131072, 2688]),
        "backbone.layers.0.mixer.in_proj.weight": ("BF16", [10304, 2688])})
    stage = resolve(str(tmp_path)).pipeline.stage("llm")
    assert stage.transformer.num_layers == 6 and stage.transformer.state_layers.layers == 23
    assert stage.transformer.state_layers.ssm_dtype == "float32"  # vLLM's default for NemotronH
    v = omni_version("0.30")
    # fp8 KV without prefix caching: the Cascade-2 log's 4176-token block, 66 blocks for 256,000 tokens
    memory = stage_memory(stage, 1, StageKnobs(256000, 128, 8192, False, "fp8", prefix_caching=False), v)
    assert memory.weights_bytes == stored
    assert (memory.kv_layout.block_tokens, memory.kv_layout.blocks_per_request(256000)) == (4176, 66)
    # vLLM's default, prefix caching on: two state blocks a Mamba group
    on = stage_memory(stage, 1, StageKnobs(256000, 128, 8192, False, "fp8"), v)
    assert on.kv_layout.blocks_per_request(256000) == 62 + 8
    assert [t.tp for t in stage.tp_tested] == [1, 2, 4, 8]


QWEN36_TEXT_CONFIG = {  # Qwen3.6-35B-A3B's text model as public test fixtures copy its config.json
    "architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text", "hidden_size": 2048,
    "num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"], "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "vocab_size": 248320, "max_position_embeddings": 262144,
    "mamba_ssm_dtype": "float32", "torch_dtype": "bfloat16"}


def test_a_qwen3_6_text_directory_gives_the_logged_pool(tmp_path):
    # the directory path to the same figures as the Qwen3.6 logs above: fp8 KV, prefix caching on
    cfg = dict(QWEN36_TEXT_CONFIG, layer_types=QWEN36_TEXT_CONFIG["layer_types"] * 10)
    _checkpoint(tmp_path, cfg, {"model.embed_tokens.weight": ("BF16", [248320, 2048])})
    stage = resolve(str(tmp_path)).pipeline.stage("llm")
    assert (stage.transformer.num_layers, stage.transformer.state_layers.layers) == (10, 30)
    pool = stage_memory(stage, 1, StageKnobs(65536, 1, 8192, False, "fp8"), omni_version("0.30")).kv_layout
    assert (pool.block_tokens, pool.block_bytes, pool.blocks_per_request(65536)) == (2096, 21_463_040, 38)
    assert _logged(pool, 2.95, 65536, "3.87") == 147
    # Qwen3-Next names no SSM dtype and vLLM has no hook for it: the model dtype, half the state
    nxt = dict(cfg, model_type="qwen3_next", layer_types=None, full_attention_interval=4)
    (tmp_path / "config.json").write_text(json.dumps(nxt))
    state = resolve(str(tmp_path)).pipeline.stage("llm").transformer.state_layers
    assert state.ssm_dtype == "auto" and state_page_bytes(state, 1, 2) == 3 * 8192 * 2 + 32 * 128 * 128 * 2


@pytest.mark.parametrize("cfg, match", [
    (dict(QWEN36_TEXT_CONFIG, mamba_ssm_dtype="int4"), "mamba_ssm_dtype"),
    (dict(QWEN36_TEXT_CONFIG, linear_num_key_heads=3), "not a multiple of linear_num_key_heads"),
    (dict(NANO_30B_CONFIG, mamba_num_heads=2 ** 31 - 1, mamba_head_dim=2 ** 31 - 1), "no real model comes near"),
    (dict({k: v for k, v in NANO_30B_CONFIG.items() if k != "hybrid_override_pattern"}, layer_types=["mamba"]),
     "layer_types and no hybrid_override_pattern"),
])
def test_a_bad_hybrid_config_is_one_line_exit_2(tmp_path, cfg, match):
    if cfg.get("model_type") == "qwen3_5_moe_text":
        cfg = dict(cfg, layer_types=QWEN36_TEXT_CONFIG["layer_types"] * 10)
    _checkpoint(tmp_path, cfg)
    code, output = _plan_exit(tmp_path)
    assert code == 2 and match in output and "internal error" not in output, output


def test_a_nemotron_h_config_without_head_dim_takes_the_config_class_default(tmp_path):
    # vLLM loads transformers' NemotronHConfig for nemotron_h: head_dim 128, not hidden // heads (84)
    _checkpoint(tmp_path, {k: v for k, v in NANO_30B_CONFIG.items() if k != "head_dim"},
                {"backbone.embeddings.weight": ("BF16", [131072, 2688])})
    assert resolve(str(tmp_path)).pipeline.stage("llm").transformer.head_dim == 128


def test_fp8_skip_layers_beside_a_hybrid_pool_are_refused():
    # mixed page sizes beside Mamba pages are not modelled: refused, not sized as uniform fp8
    stage = lookup_model("audex-tts-30b-a3b").stage("audex_thinker")
    with pytest.raises(InputError, match="kv_cache_dtype_skip_layers"):
        stage_memory(stage, 1, StageKnobs(4096, 8, 512, False, "fp8", kv_skip_layers=1), omni_version("0.30"))

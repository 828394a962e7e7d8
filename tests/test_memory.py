"""Memory model against the figures vLLM printed in public start-up logs (tests/data/accuracy.jsonl
names each log's URL) and against vLLM's own formulas."""

from __future__ import annotations

import pytest

from omni_autoconf.inputs.catalog import StageSpec, lookup_model
from omni_autoconf.memory.stage_memory import (
    StageKnobs,
    activation_peak,
    kv_bytes_per_token,
    kv_tokens,
    requested_bytes,
    stage_memory,
    weights_per_rank,
)
from omni_autoconf.vllm.facts import GiB, omni_version

QWEN3 = lookup_model("qwen3-omni-moe")


def stage(name: str, model=QWEN3):
    return model.stage(name)


@pytest.mark.parametrize(
    "name, tp, expected",
    [
        ("thinker", 1, 98_304),  # 2 x 48 layers x 4 KV heads x 128 x 2 bytes (config.json thinker_config)
        ("thinker", 2, 49_152),
        ("talker", 1, 20_480),  # calibration: 37.18 GiB -> 1,949,520 tokens
    ],
)
def test_kv_bytes_per_token_targets(name, tp, expected):
    assert kv_bytes_per_token(stage(name), tp) == expected


def test_kv_heads_are_replicated_when_tp_exceeds_kv_heads():
    thinker = stage("thinker")  # 4 KV heads
    assert kv_bytes_per_token(thinker, 4) == 98_304 // 4
    assert kv_bytes_per_token(thinker, 8) == 98_304 // 4  # max(1, 4 // 8) = 1 head per rank


def test_fp8_kv_halves_bf16():
    assert kv_bytes_per_token(stage("thinker"), 1, "fp8") == 49_152


def test_generation_stage_has_no_kv():
    assert kv_bytes_per_token(stage("code2wav"), 1) == 0


def test_qwen25_3b_thinker_kv_matches_memory_facts():
    assert kv_bytes_per_token(lookup_model("qwen2.5-omni-3b").stage("thinker"), 1) == 36_864


def test_talker_kv_tokens_reproduce_logged_cache_size():
    # calibration: "Available KV cache memory: 37.18 GiB" -> "GPU KV cache size: 1,949,520 tokens".
    # 37.18 is rounded to 2 decimals, so the true figure is within +-0.005 GiB.
    per_token = kv_bytes_per_token(stage("talker"), 1)
    low, high = (kv_tokens(int((37.18 + d) * GiB), per_token) for d in (-0.005, 0.005))
    assert low <= 1_949_520 <= high


def within(value: float, target: float, tolerance: float) -> bool:
    return abs(value - target) <= tolerance * target


def test_thinker_weights_at_tp2_match_logged_model_loading():
    # calibration (vLLM-Omni ~0.12): "Model loading took 30.3338 GiB" on each of 2 ranks.
    got = weights_per_rank(stage("thinker"), 2, omni_version("0.12")) / GiB
    assert within(got, 30.3338, 0.03), got


def test_talker_weights_on_016_include_thinker_encoders():
    # calibration (vLLM-Omni 0.12-0.16): talker "Model loading took 8.4897 GiB".
    got = weights_per_rank(stage("talker"), 1, omni_version("0.16")) / GiB
    assert within(got, 8.4897, 0.03), got


def test_talker_on_030_loads_only_its_own_modules():
    old = weights_per_rank(stage("talker"), 1, omni_version("0.16"))
    new = weights_per_rank(stage("talker"), 1, omni_version("0.30"))
    # 0.30 builds only the talker (~3.32 B params, ~6.2 GiB in bf16; models/qwen3-omni-moe.yaml).
    assert within(new / GiB, 6.2, 0.03)
    assert old - new > 2 * GiB


def _llama_8b() -> StageSpec:
    """Llama-3.1-8B (32 layers, hidden 4096, 32/8 heads, MLP 14336, vocab 128256): a plain
    dense model with two logged profile runs in tests/data/accuracy.jsonl."""
    return StageSpec.model_validate(
        {
            "stage_id": 0,
            "name": "llm",
            "role": "autoregressive",
            "dtype": "bfloat16",
            "components": [{"name": "llm", "params": 8_030_261_248, "sharding": "tp", "source": "test"}],
            "transformer": {
                "num_layers": 32, "hidden_size": 4096, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128,
                "vocab_size": 128_256, "max_position": 131_072, "mlp": "dense", "intermediate_size": 14_336,
                "source": "Llama-3.1-8B config.json",
            },
            "tp_degrees": [1, 2, 4, 8],
            "tp_tested": [{"tp": 1, "versions": "0.12-", "source": "test geometry"}],
            "defaults": {
                "deploy": {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "enforce_eager": False},
                "stage-args": {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "enforce_eager": False},
            },
        }
    )


@pytest.mark.parametrize(
    "tokens, logged_gib",
    [
        # RTX 3090, V0 without chunked prefill: batched tokens = max_model_len; 256 seqs.
        (20_000, 17.06 - 14.9888),  # peak_torch_memory - weights
        (29_000, 17.98 - 14.9888),
    ],
)
def test_activation_peak_is_conservative_and_close_to_logged_profile(tokens, logged_gib):
    knobs = StageKnobs(max_model_len=tokens, max_num_seqs=256, max_num_batched_tokens=tokens, enforce_eager=True)
    got = activation_peak(_llama_8b(), 1, knobs, omni_version("0.30"))[0] / GiB
    assert logged_gib <= got <= 1.15 * logged_gib, (got, logged_gib)


def test_llama_kv_per_token_is_128_kib():
    assert kv_bytes_per_token(_llama_8b(), 1) == 128 * 1024  # 2 x 32 layers x 8 KV heads x 128 x 2 bytes


def test_graphs_are_outside_the_fraction_in_every_version():
    knobs = StageKnobs(max_model_len=65536, max_num_seqs=64, max_num_batched_tokens=32768, enforce_eager=False)
    for version in ("0.14", "0.20", "0.30"):
        m = stage_memory(stage("thinker"), 1, knobs, omni_version(version))
        assert m.graph_reserve_bytes == 2 * GiB
        assert m.inside_bytes == m.weights_bytes + m.activation_bytes + m.non_torch_bytes or m.accounting == "either"
    eager = stage_memory(stage("thinker"), 1, StageKnobs(65536, 64, 32768, True), omni_version("0.30"))
    assert eager.graph_reserve_bytes == 0


def test_process_scoped_versions_take_the_worse_reading():
    """vLLM-Omni 0.16-0.28 subtract the process's NVML memory when NVML sees it (context
    inside, transient peak outside), the profile figures otherwise: both must hold."""
    knobs = StageKnobs(65536, 64, 32768, False)
    scoped = stage_memory(stage("thinker"), 1, knobs, omni_version("0.24"))
    plain = stage_memory(stage("thinker"), 1, knobs, omni_version("0.30"))
    assert scoped.accounting == "either" and plain.accounting == "profile"
    assert scoped.inside_bytes >= plain.inside_bytes and scoped.outside_bytes >= plain.outside_bytes
    transient = scoped.activation_bytes - scoped.persistent_bytes
    assert scoped.outside_bytes >= scoped.graph_reserve_bytes + transient


def test_nccl_only_with_tensor_parallelism():
    knobs = StageKnobs(65536, 64, 32768, False)
    assert stage_memory(stage("thinker"), 1, knobs, omni_version("0.30")).nccl_bytes == 0
    assert stage_memory(stage("thinker"), 2, knobs, omni_version("0.30")).nccl_bytes > 0


def test_requested_is_ceil_of_total_times_fraction():
    # 0.6 x 79.32 GiB = 47.59 GiB, the figure vLLM printed for an A100 start-up failure
    # (https://github.com/vllm-project/vllm-omni/issues/276).
    assert round(requested_bytes(int(79.32 * GiB), 60, 100) / GiB, 2) == 47.59
    assert requested_bytes(101, 1, 100) == 2  # ceil, not floor


def test_gqa_formula_matches_qwen3_14b_logged_cache():
    # calibration (vLLM ~0.11): Qwen3-14B "Available KV cache memory: 6.51 GiB" ->
    # "GPU KV cache size: 42,656 tokens"; 40 layers x 8 KV heads x head_dim 128, bf16.
    qwen3_14b = _llama_8b().model_copy(
        update={"transformer": _llama_8b().transformer.model_copy(update={"num_layers": 40, "num_heads": 40})}
    )
    per_token = kv_bytes_per_token(qwen3_14b, 1)
    assert per_token == 160 * 1024  # 2 x 40 layers x 8 KV heads x 128 x 2 bytes
    low, high = (kv_tokens(int((6.51 + d) * GiB), per_token) for d in (-0.005, 0.005))
    assert low <= 42_656 <= high


def test_qwen3_omni_thinker_profile_terms_from_the_code():
    """The dummy video: 10 frames sized for max_pixels 12,845,056, resized by the HF
    processor to 864x864 (786,432-pixel frame limit): grid (5, 54, 54) = 14,580 patches."""
    from omni_autoconf.memory.profile_run import dummy_video_patches, profile_terms, smart_resize

    thinker = stage("thinker")
    assert smart_resize(3584, 3584, 32, 131072, 786432) == (864, 864)
    assert dummy_video_patches(thinker.vision_tower, 65536) == 14580
    assert dummy_video_patches(thinker.vision_tower, 32768) == 5832
    terms = profile_terms(thinker, 1, 65536, 64, 32768, omni_version("0.30"))
    assert terms.moe_workspace == 2 * 32768 * 8 * 2048 * 2  # two (M, top_k, H) bf16 buffers, 2 GiB
    assert 0.55 < terms.encoder / GiB < 0.65
    assert terms.peak == terms.decoder + terms.moe_workspace + terms.encoder_output  # the decoder phase rules
    assert 3.1 < terms.peak / GiB < 3.4
    old = profile_terms(thinker, 1, 65536, 64, 32768, omni_version("0.14"))
    assert old.moe_workspace == terms.moe_workspace // 2  # chunked at 16384 tokens in vLLM 0.14/0.16


def test_deepstack_buffers_are_loaded_with_the_weights():
    knobs = StageKnobs(65536, 64, 32768, False)
    m = stage_memory(stage("thinker"), 2, knobs, omni_version("0.30"))
    from omni_autoconf.memory.stage_memory import weights_per_rank

    assert m.weights_bytes - weights_per_rank(stage("thinker"), 2, omni_version("0.30")) == 3 * 32768 * 2048 * 2


def test_code2wav_profile_decodes_every_frame_when_streaming():
    streaming = StageKnobs(65536, 64, 65536, False, async_chunk=True)
    chunked = StageKnobs(65536, 64, 65536, False, async_chunk=False)
    s = stage_memory(stage("code2wav"), 1, streaming, omni_version("0.30")).activation_bytes
    c = stage_memory(stage("code2wav"), 1, chunked, omni_version("0.30")).activation_bytes
    assert s == 4096 * 2 * 1024 * 1024 and c == 325 * 2 * 1024 * 1024

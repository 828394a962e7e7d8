"""The profile-run peak derived from vLLM's code, per version (issue 19, cause 1)."""

from omni_autoconf.memory.accuracy import _plain_version
from omni_autoconf.memory.profile_run import profile_terms, sampler_bytes
from omni_autoconf.vllm.facts import GiB, MiB
from test_memory import _llama_8b

VOCAB, HIDDEN = 128_256, 4096  # Llama-3.1-8B


def test_the_sampler_holds_14_bytes_a_logit_from_the_triton_top_k_top_p_on():
    # bf16 logits 2 + fp32 copy 4 + softmax probs 4 + exponential noise 4 (vllm 0.19.0
    # v1/sample/sampler.py, v1/sample/ops/topk_topp_sampler.py), the Triton buffer of 160 rows at most
    got = sampler_bytes(1024, VOCAB, HIDDEN, 2, (0, 19))
    assert got == 1024 * VOCAB * 14 + 160 * VOCAB * 4 + 2 * 1024 * HIDDEN * 2


def test_the_sort_path_of_vllm_0_16_holds_38_bytes_a_logit():
    # sorted values 4 + int64 indices 8 + reverse indices 8 + CUB alternate buffers 12, beside the
    # bf16 logits and their fp32 copy (PyTorch SortStable.cu segmented_sort_pairs, >= 128 rows)
    assert sampler_bytes(1024, VOCAB, HIDDEN, 2, (0, 16)) == 1024 * VOCAB * 38 + 2 * 1024 * HIDDEN * 2
    assert sampler_bytes(64, VOCAB, HIDDEN, 2, (0, 16)) == 64 * VOCAB * 50 + 2 * 64 * HIDDEN * 2  # full-sort path


def test_an_fp32_model_makes_no_fp32_copy_of_its_logits():
    assert sampler_bytes(256, VOCAB, HIDDEN, 4, (0, 19)) - 256 * VOCAB * 12 == 160 * VOCAB * 4 + 2 * 256 * HIDDEN * 4


def test_llama_8b_at_1024_sequences_is_close_above_the_logged_peak():
    """Issue 19 quotes vLLM 0.19 logging `torch peak memory increase: 1.89GiB` for Llama-3.1-8B
    at max_num_seqs 1024, max_num_batched_tokens 8192 (the model predicted 4.94 GiB before)."""
    measured = profile_terms(_llama_8b(), 1, 131_072, 1024, 8192, _plain_version((0, 19))).measured / GiB
    assert 1.89 <= measured <= 1.89 * 1.08, measured


def test_at_256_sequences_the_decoder_pass_is_the_peak():
    terms = profile_terms(_llama_8b(), 1, 131_072, 256, 8192, _plain_version((0, 19)))
    assert terms.peak == terms.decoder and terms.measured == terms.decoder + 128 * MiB
    assert terms.measured / GiB < 1.55  # what the fitted 37 B/logit predicted


def test_the_sort_path_matches_the_llm_d_table_at_1024_rows():
    """llm-d-benchmark's table (config_explorer/empirical-vllm-memory-results.md, tests/data/
    accuracy.jsonl) logs 4.76 GiB for Llama-3.1-8B at 1024 rows, 8192 tokens on the sort path."""
    measured = profile_terms(_llama_8b(), 1, 16_000, 1024, 8192, _plain_version((0, 16))).measured / GiB
    assert 4.76 <= measured <= 4.76 * 1.05, measured


def test_a_log_that_shows_flashinfer_sampling_takes_its_two_fp32_tensors():
    # vllm 0.10.1.1 topk_topp_sampler.py: FlashInfer's top_k_top_p_sampling_from_logits (masked logits
    # and probs, fp32) when the optional package is installed, beside the bf16 logits and fp32 copy
    flashinfer = sampler_bytes(256, VOCAB, HIDDEN, 2, (0, 10), flashinfer=True)
    assert flashinfer == 256 * VOCAB * 14 + 2 * 256 * HIDDEN * 2
    assert sampler_bytes(256, VOCAB, HIDDEN, 2, (0, 10)) == 256 * VOCAB * 38 + 2 * 256 * HIDDEN * 2  # not known: sort

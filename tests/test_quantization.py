"""Quantized checkpoints from config.json alone, as vLLM loads them (issue 19, cause 4)."""

import pytest

from omni_autoconf.errors import InputError
from omni_autoconf.inputs.catalog import pipeline_from_config
from omni_autoconf.inputs.quantization import quant_bytes
from omni_autoconf.memory.stage_memory import weights_per_rank
from omni_autoconf.vllm.facts import GiB, omni_version

# https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json
GPT_OSS_20B = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
               "intermediate_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64,
               "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 32, "num_experts_per_tok": 4,
               "vocab_size": 201088, "max_position_embeddings": 131072, "sliding_window": 128,
               "torch_dtype": "bfloat16", "tie_word_embeddings": False,
               "quantization_config": {"quant_method": "mxfp4",
                                       "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                  "model.embed_tokens", "lm_head"]}}
# https://huggingface.co/RedHatAI/Meta-Llama-3.1-70B-Instruct-quantized.w8a8/blob/main/config.json
LLAMA_70B_W8A8 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
                  "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
                  "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
                  "torch_dtype": "bfloat16", "tie_word_embeddings": False,
                  "quantization_config": {"quant_method": "compressed-tensors", "format": "int-quantized",
                                          "ignore": ["lm_head"], "config_groups": {"group_0": {
                                              "targets": ["Linear"], "weights": {"num_bits": 8, "type": "int",
                                                                                 "strategy": "channel",
                                                                                 "symmetric": True}}}}}


def _gib(cfg, tp=1):
    return weights_per_rank(pipeline_from_config(cfg, "m").stages[0], tp, omni_version("0.30")) / GiB


def test_gpt_oss_20b_experts_are_mxfp4_not_bf16():
    # issue 19: predicted 19.47 GiB (read as bf16), vLLM logged 7.01 at TP=2
    got = _gib(GPT_OSS_20B, 2)
    assert 7.01 <= got <= 7.01 * 1.03, got


def test_llama_70b_int8_w8a8_is_a_byte_a_weight():
    # issue 19: predicted 131 GiB (read as bf16), vLLM logged 67.7
    got = _gib(LLAMA_70B_W8A8)
    assert 67.7 <= got <= 67.7 * 1.03, got


@pytest.mark.parametrize("q, per", [
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, 0.5 + 2.5 / 128),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, 0.5 + 2.5 / 128),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, 1 + 4 / 128 ** 2),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, 0.5 + 4 / 64),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {"weights": {
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": False}}}},
     0.5 + 2.5 / 128),
])
def test_bytes_per_weight_follow_the_stored_tensors(q, per):
    assert quant_bytes({"quantization_config": q}, "c").linear == pytest.approx(per)


@pytest.mark.parametrize("q, needle", [
    ({"quant_method": "hqq"}, "'hqq'"),
    ({"quant_method": "awq"}, "bits"),
    ({"quant_method": "compressed-tensors", "format": "marlin-24", "config_groups": {}}, "marlin-24"),
])
def test_an_unknown_method_or_format_is_refused_never_bf16(q, needle):
    with pytest.raises(InputError, match=needle):
        pipeline_from_config({**LLAMA_70B_W8A8, "quantization_config": q}, "m")

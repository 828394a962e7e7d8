"""config.json read with its transformers class defaults, and each architecture's real tensor
layout (issue 19, causes 2 and 3)."""

import json

import pytest
from click.testing import CliRunner

from omni_autoconf.cli.main import main
from omni_autoconf.errors import InputError
from omni_autoconf.inputs.catalog import pipeline_from_config
from omni_autoconf.memory.stage_memory import weights_per_rank
from omni_autoconf.vllm.facts import GiB, omni_version
from test_checkpoints import write_safetensors

# https://huggingface.co/google/gemma-2-27b/blob/main/config.json (no tie_word_embeddings key)
GEMMA2_27B = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 4608,
              "intermediate_size": 36864, "num_hidden_layers": 46, "num_attention_heads": 32,
              "num_key_value_heads": 16, "head_dim": 128, "vocab_size": 256000, "max_position_embeddings": 8192,
              "sliding_window": 4096, "torch_dtype": "float32"}
# https://huggingface.co/microsoft/phi-2/blob/main/config.json
PHI2 = {"architectures": ["PhiForCausalLM"], "model_type": "phi", "hidden_size": 2560, "intermediate_size": 10240,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None, "vocab_size": 51200,
        "max_position_embeddings": 2048, "partial_rotary_factor": 0.4, "torch_dtype": "float16",
        "tie_word_embeddings": False}


def _weights(cfg, tp=1):
    stage = pipeline_from_config(cfg, "m").stages[0]
    return weights_per_rank(stage, tp, omni_version("0.30"))


def test_gemma2_ties_its_head_as_gemma2config_defaults_it():
    tied, untied = _weights(GEMMA2_27B), _weights({**GEMMA2_27B, "tie_word_embeddings": False})
    assert untied - tied == 256000 * 4608 * 2  # the 2.19 GiB lm_head vLLM does not build
    assert round((untied - tied) / GiB, 2) == 2.2


def test_a_gemma_config_without_head_dim_takes_the_class_default():
    cfg = {k: v for k, v in GEMMA2_27B.items() if k != "head_dim"}
    assert pipeline_from_config(cfg, "m").stages[0].transformer.head_dim == 256  # Gemma2Config head_dim=256


def test_phi2_counts_its_plain_mlp_and_biases_exactly():
    # phi-2 has 2,779,683,840 parameters (its safetensors); gated, the MLP alone would be 50% larger
    assert _weights(PHI2) == 2_779_683_840 * 2


def test_an_architecture_without_a_known_layout_is_refused(tmp_path):
    cfg = {**PHI2, "architectures": ["FancyNewForCausalLM"], "model_type": "fancy"}
    with pytest.raises(InputError, match="FancyNewForCausalLM"):
        pipeline_from_config(cfg, "m")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    write_safetensors(tmp_path / "model.safetensors", {"model.embed_tokens.weight": ("BF16", [51200, 2560])})
    result = CliRunner().invoke(main, ["--gpus", "1xH100-80GB", "--model", str(tmp_path), "-q"])
    assert result.exit_code == 2 and "FancyNewForCausalLM" in result.stderr


@pytest.mark.parametrize("value", ["float128", [ "bfloat16"], 16])
def test_a_torch_dtype_that_is_no_dtype_is_refused(value):
    with pytest.raises(InputError, match="torch_dtype"):
        pipeline_from_config({**PHI2, "torch_dtype": value}, "m")


def test_float32_configs_load_in_bfloat16_as_vllm_auto_does():
    assert pipeline_from_config(GEMMA2_27B, "m").stages[0].dtype == "bfloat16"


def test_opt_counts_its_biases_its_learned_positions_and_a_tied_head():
    """vllm 0.30.0 models/opt.py: qkv/out/fc1/fc2 with bias, two LayerNorms a layer and a final one,
    a (max_position_embeddings + 2) x hidden position table, the head tied (OPTConfig default): 125,239,296
    parameters for facebook/opt-125m."""
    from omni_autoconf.inputs.catalog import pipeline_from_config
    from omni_autoconf.memory.accuracy import _plain_version
    from omni_autoconf.memory.stage_memory import weights_per_rank

    cfg = {"architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": 768, "ffn_dim": 3072,
           "num_hidden_layers": 12, "num_attention_heads": 12, "max_position_embeddings": 2048,
           "vocab_size": 50272, "word_embed_proj_dim": 768, "torch_dtype": "float16", "do_layer_norm_before": True}
    stage = pipeline_from_config(cfg, "facebook/opt-125m").stages[0]
    assert weights_per_rank(stage, 1, _plain_version((0, 30))) == 125_239_296 * 2
    import pytest
    from omni_autoconf.errors import InputError

    with pytest.raises(InputError, match="word_embed_proj_dim"):
        pipeline_from_config({**cfg, "hidden_size": 1024, "num_attention_heads": 16}, "facebook/opt-350m")

"""A config.json as vLLM reads it: with its transformers config class's defaults where the file is
silent, and the tensor layout of the architecture vLLM builds for it.

vLLM loads a config through transformers (AutoConfig picks the class by model_type), so a key the
file leaves out takes the class's default: Gemma-2's configs omit tie_word_embeddings, which
Gemma2Config defaults to True, and vLLM ties the head to the embedding. The table below holds the
defaults that change a memory figure (tie_word_embeddings, head_dim, num_key_value_heads,
intermediate sizes, attention_bias), read from transformers 5.25.0's configuration_<type>.py
(line numbers of the class's __init__ defaults). Importing transformers itself would cost more
than a second of start-up for these few keys; sliding-window defaults live in sliding_layers.py.

The layout (gated or plain MLP, which projections carry a bias, LayerNorm or RMSNorm, an lm_head
bias) is vLLM's model class for the architecture (vllm 0.30.0 model_executor/models/<file>.py);
an architecture not listed is refused rather than guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError

TRANSFORMERS_SOURCE = "transformers 5.25.0 models/{t}/configuration_{t}.py"

# model_type -> the class defaults that change a memory figure (keys absent from the file only)
CLASS_DEFAULTS: dict[str, dict] = {
    "llama": {"tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False},  # :78-82
    "mistral": {"tie_word_embeddings": False, "num_key_value_heads": 8, "intermediate_size": 14336},  # :64-77
    "mixtral": {"tie_word_embeddings": False, "num_key_value_heads": 8, "intermediate_size": 14336,
                "num_local_experts": 8, "num_experts_per_tok": 2},  # :65-82
    "qwen2": {"tie_word_embeddings": False, "num_key_value_heads": 32},  # :65-71
    "qwen3": {"tie_word_embeddings": False, "num_key_value_heads": 32, "head_dim": 128,
              "attention_bias": False},  # :66-75
    "qwen2_moe": {"tie_word_embeddings": False, "num_key_value_heads": 16, "moe_intermediate_size": 1408,
                  "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4},  # :80-96
    "qwen3_moe": {"tie_word_embeddings": False, "num_key_value_heads": 4, "moe_intermediate_size": 768,
                  "num_experts": 128, "num_experts_per_tok": 8, "attention_bias": False},  # :82-97
    "gemma": {"tie_word_embeddings": True, "num_key_value_heads": 16, "head_dim": 256},  # :71-81
    "gemma2": {"tie_word_embeddings": True, "num_key_value_heads": 4, "head_dim": 256},  # :72-82
    "gemma3_text": {"tie_word_embeddings": True, "num_key_value_heads": 4, "head_dim": 256},  # gemma3 :78-88
    "phi": {"tie_word_embeddings": False, "intermediate_size": 8192},  # :64-76
    "phi3": {"tie_word_embeddings": False},  # :75
    "deepseek_v2": {"tie_word_embeddings": False, "moe_intermediate_size": 1407},  # :87-116
    "deepseek_v3": {"tie_word_embeddings": False, "moe_intermediate_size": 2048},  # :86-113
    "gpt_oss": {"tie_word_embeddings": False, "num_key_value_heads": 8, "head_dim": 64,
                "num_local_experts": 128, "num_experts_per_tok": 4, "attention_bias": True},  # :52-77
    "granite": {"tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False},  # :77-81
    "olmo2": {"tie_word_embeddings": False, "attention_bias": False},  # :82-84
    "starcoder2": {"tie_word_embeddings": True, "num_key_value_heads": 2, "use_bias": True},  # :65-80
    "opt": {"tie_word_embeddings": True, "ffn_dim": 3072, "enable_bias": True},  # :53-73
}


def with_class_defaults(cfg: dict) -> dict:
    """cfg with its config class's defaults for the keys it leaves out (an explicit null stays)."""
    defaults = CLASS_DEFAULTS.get(str(cfg.get("model_type")), {})
    return {**defaults, **cfg}


@dataclass(frozen=True)
class Layout:
    """The tensors one decoder layer holds beyond its geometry, as vLLM's model class builds them."""

    gated_mlp: bool = True  # gate_up (2 x I) + down; False: fc1 (I) + fc2
    qkv_bias: bool = False  # or config attention_bias / use_bias where the class reads it
    o_bias: bool = False
    mlp_bias: bool = False
    layer_norm: bool = False  # LayerNorm (weight and bias) instead of RMSNorm
    norms_per_layer: int = 2
    lm_head_bias: bool = False
    learned_positions_offset: int | None = None  # a learned position table of max_position + offset rows
    source: str = ""


_LLAMA = Layout(source="vllm 0.30.0 model_executor/models/llama.py LlamaMLP (gate_up_proj, down_proj)")
LAYOUTS: dict[str, Layout] = {
    **dict.fromkeys(("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                     "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM", "DeepseekV2ForCausalLM",
                     "DeepseekV3ForCausalLM", "Phi3ForCausalLM", "GraniteForCausalLM", "Olmo2ForCausalLM",
                     "Olmo3ForCausalLM", "Cohere2ForCausalLM", "Exaone4ForCausalLM", "NemotronHForCausalLM",
                     "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"), _LLAMA),
    # Gemma 1-3: GeGLU gate_up + down, RMSNorm; Gemma 2/3 add post-attention and post-MLP norms
    "GemmaForCausalLM": Layout(source="vllm 0.30.0 model_executor/models/gemma.py GemmaMLP"),
    "Gemma2ForCausalLM": Layout(norms_per_layer=4, source="vllm 0.30.0 model_executor/models/gemma2.py Gemma2DecoderLayer"),
    "Gemma3ForCausalLM": Layout(norms_per_layer=4, source="vllm 0.30.0 model_executor/models/gemma3.py Gemma3DecoderLayer"),
    # phi-1/1.5/2: q/k/v and dense with bias, fc1 + fc2 (gelu_new, not gated) with bias, one LayerNorm
    # per layer (parallel attention and MLP), a final LayerNorm and an lm_head with bias
    "PhiForCausalLM": Layout(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True,
                             norms_per_layer=1, lm_head_bias=True,
                             source="vllm 0.30.0 model_executor/models/phi.py PhiAttention, PhiMLP, PhiForCausalLM"),
    # StarCoder2: c_fc + c_proj (not gated), biases on every projection (use_bias), LayerNorms
    "Starcoder2ForCausalLM": Layout(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True,
                                    source="vllm 0.30.0 model_executor/models/starcoder2.py Starcoder2MLP"),
    # OPT: qkv_proj, out_proj, fc1 (ReLU, not gated) and fc2 with bias (enable_bias), two LayerNorms
    # per layer and a final one, a learned position table of max_position_embeddings + 2 rows
    # (OPTLearnedPositionalEmbedding offset 2, a plain nn.Embedding: whole on every rank), the head
    # tied to the token embedding
    "OPTForCausalLM": Layout(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True,
                             learned_positions_offset=2,
                             source="vllm 0.30.0 model_executor/models/opt.py OPTDecoderLayer, OPTDecoder"),
    # gpt-oss: attention with biases (and sinks), SwiGLU experts with biases
    "GptOssForCausalLM": Layout(qkv_bias=True, o_bias=True, mlp_bias=True,
                                source="vllm 0.30.0 model_executor/models/gpt_oss.py OAIAttention, MLPBlock"),
}
# model_type -> the architecture a config without `architectures` is built as
_ARCH_OF_TYPE = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                 "mixtral": "MixtralForCausalLM", "deepseek_v2": "DeepseekV2ForCausalLM",
                 "deepseek_v3": "DeepseekV3ForCausalLM", "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                 "gemma3_text": "Gemma3ForCausalLM", "phi": "PhiForCausalLM", "phi3": "Phi3ForCausalLM",
                 "gpt_oss": "GptOssForCausalLM", "starcoder2": "Starcoder2ForCausalLM", "opt": "OPTForCausalLM"}


def layout_of(cfg: dict, architectures: list[str], where: str) -> Layout:
    """The layout of the first listed architecture vLLM knows (its registry tries them in order), or
    of the model_type's architecture when the file lists none; an architecture whose tensors are not
    known is refused (exit 2), never counted as Llama's."""
    names = [a for a in architectures if a in LAYOUTS]
    if not names and not cfg.get("architectures") and str(cfg.get("model_type")) in _ARCH_OF_TYPE:
        names = [_ARCH_OF_TYPE[str(cfg.get("model_type"))]]
    if not names:
        named = architectures[0] if architectures else cfg.get("model_type")
        raise InputError(f"{where}: architecture {named!r} has no known tensor layout (gated or plain MLP, biases): "
                         "not planned rather than guessed")
    layout = LAYOUTS[names[0]]
    fields = dict(layout.__dict__)
    if cfg.get("attention_bias") or cfg.get("use_bias") or cfg.get("model_type") == "qwen2":
        fields["qkv_bias"] = True  # Qwen2Attention always; LlamaAttention's o_proj too (bias_o_proj = attention_bias)
        fields["o_bias"] = layout.o_bias or (bool(cfg.get("attention_bias")) and names[0] == "LlamaForCausalLM")
    if cfg.get("mlp_bias"):
        fields["mlp_bias"] = True
    if names[0] == "OPTForCausalLM":  # OPTConfig: enable_bias (default true); a projected embedding is not modelled
        if cfg.get("enable_bias") is False:
            fields.update(qkv_bias=False, o_bias=False, mlp_bias=False)
        if cfg.get("word_embed_proj_dim", cfg.get("hidden_size")) != cfg.get("hidden_size") \
                or cfg.get("do_layer_norm_before") is False or cfg.get("layer_norm_elementwise_affine") is False:
            raise InputError(f"{where}: an OPT with word_embed_proj_dim, post-norm or non-affine LayerNorms is not "
                             "modelled (project_in/out and its norms differ)")
    return Layout(**fields)

"""A Hugging Face config.json -> the stage spec of a plain decoder LLM (a one-stage pipeline).

Covers the decoder families vLLM serves with one attention layout per layer: Llama,
Mistral, Qwen2/2.5, Qwen3 (q/k norms), Qwen2-MoE / Qwen3-MoE, Mixtral, DeepSeek-V2/V3
(MLA: one latent of kv_lora_rank + qk_rope_head_dim per token and layer, the same on every
TP rank), NemotronH, Qwen3-Next and Qwen3.5's text models (Mamba2 or Gated DeltaNet layers
beside attention, their state in vLLM's hybrid pool). Parameter counts are computed from the geometry (a checkpoint's safetensors
headers give them exactly); every figure's source is the config itself.
"""

from __future__ import annotations

from typing import Any

from ..errors import CatalogError, InputError
from .config_defaults import Layout, layout_of, with_class_defaults
from .quantization import linear_components, load_dtype
from .sliding_layers import sliding_layout



def _get(cfg: dict, *keys, default=None):
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


MAX_FIELD = 2 ** 31 - 1  # no real geometry comes near; beyond it, the solver's integers would overflow


def _int(cfg: dict, where: str, *keys, default=None, least: int = 1) -> int:
    """A whole-number field (the first of `keys` present), at least `least`: a zero head
    or layer count is no model, and would divide by zero further on."""
    value = _get(cfg, *keys, default=default)
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_FIELD:
        raise InputError(f"{where}: {keys[0]} must be a whole number from {least} to {MAX_FIELD}, not {value!r}")
    return value


def optional_mapping(cfg: dict, key: str, where: str) -> dict:
    """cfg[key], an object, or {} when absent."""
    value = cfg.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"{where}: {key} must be an object, not {value!r}")
    return value


def max_position(cfg: dict) -> int:
    """vLLM's derived max_model_len: max_position_embeddings, times a linear/dynamic/yarn
    rope factor (vllm/config/model.py _get_and_verify_max_len)."""
    length = _int(cfg, "config.json", "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", default=2048)
    rope = optional_mapping(cfg, "rope_scaling", "config.json")
    kind = rope.get("rope_type", rope.get("type"))
    factor = rope.get("factor")
    if kind in ("linear", "dynamic", "yarn") and isinstance(factor, (int, float)) and not isinstance(factor, bool):
        if not 0 < factor <= 1024:
            raise InputError(f"config.json: rope_scaling factor must be above 0 and at most 1024, not {factor!r}")
        base = _int(rope, "config.json rope_scaling", "original_max_position_embeddings", default=length) \
            if kind == "yarn" else length
        length = int(base * factor)
    return length


def _layer_params(cfg: dict, where: str, layout: Layout = Layout(),
                  parts: dict | None = None) -> tuple[int, int, str, dict[str, Any]]:
    """(linear params summed over layers, replicated params, MLP kind, geometry), the projections
    and biases as `layout` (vLLM's model class) builds them; `parts` gets the routed experts' share."""
    hidden = _int(cfg, where, "hidden_size")
    layers = _int(cfg, where, "num_hidden_layers")
    heads = _int(cfg, where, "num_attention_heads")
    kv_heads = _kv_heads(cfg, where, heads, default=heads)
    geometry: dict[str, Any] = {"num_layers": layers, "hidden_size": hidden, "num_heads": heads,
                                "num_kv_heads": kv_heads}
    if cfg.get("kv_lora_rank"):  # MLA
        rope, nope = _int(cfg, where, "qk_rope_head_dim"), _int(cfg, where, "qk_nope_head_dim")
        v_head, kv_lora = _int(cfg, where, "v_head_dim"), _int(cfg, where, "kv_lora_rank")
        q_lora = _int(cfg, where, "q_lora_rank", default=0, least=0)
        q = heads * (nope + rope)
        attn = (hidden * q_lora + q_lora * q) if q_lora else hidden * q
        attn += hidden * (kv_lora + rope) + kv_lora * heads * (nope + v_head) + heads * v_head * hidden
        geometry.update(head_dim=nope + rope, kv_latent_dim=kv_lora + rope, num_kv_heads=heads)
    else:
        head_dim = _int(cfg, where, "head_dim", default=max(1, hidden // heads))
        q, kv = heads * head_dim, kv_heads * head_dim
        attn = hidden * (q + 2 * kv) + q * hidden
        attn += (q + 2 * kv if layout.qkv_bias else 0) + (hidden if layout.o_bias else 0)
        geometry["head_dim"] = head_dim
    experts = _int(cfg, where, "num_experts", "num_local_experts", "n_routed_experts", default=0, least=0)
    dense_i = _int(cfg, where, "intermediate_size", "ffn_dim")  # OPT names it ffn_dim
    norm = 2 if layout.layer_norm else 1  # LayerNorm: weight and bias
    replicated = (layers * layout.norms_per_layer + 1) * hidden * norm
    if layout.learned_positions_offset is not None:  # OPT's position table, whole on every rank
        replicated += (_int(cfg, where, "max_position_embeddings") + layout.learned_positions_offset) * hidden

    def mlp_params(width: int) -> int:  # gate_up + down, or fc1 + fc2; their biases where the class has them
        return (3 if layout.gated_mlp else 2) * hidden * width + (
            ((2 if layout.gated_mlp else 1) * width + hidden) if layout.mlp_bias else 0)

    if experts:
        moe_i = _int(cfg, where, "moe_intermediate_size", default=dense_i)
        shared = _int(cfg, where, "shared_expert_intermediate_size", default=0, least=0) or (
            _int(cfg, where, "n_shared_experts", default=0, least=0) * moe_i)
        dense_layers = _int(cfg, where, "first_k_dense_replace", default=0, least=0)
        if dense_layers > layers:
            raise InputError(f"{where}: first_k_dense_replace {dense_layers} exceeds num_hidden_layers {layers}")
        moe_layers = layers - dense_layers
        routed = moe_layers * experts * mlp_params(moe_i)
        mlp = routed + moe_layers * (mlp_params(shared) if shared else 0) + dense_layers * mlp_params(dense_i)
        replicated += moe_layers * (hidden + (1 if layout.mlp_bias else 0)) * experts  # routers (and their bias)
        if parts is not None:
            parts["experts"] = routed
            parts["expert_dims"] = (moe_layers * experts, hidden, moe_i)
        geometry.update(mlp="moe", intermediate_size=moe_i, num_experts_per_tok=_int(cfg, where, "num_experts_per_tok"),
                        shared_expert_intermediate_size=shared)
    else:
        mlp = layers * mlp_params(dense_i)
        geometry.update(mlp="dense", intermediate_size=dense_i)
    return layers * attn + mlp, replicated, geometry["mlp"], geometry


def _kv_heads(cfg: dict, where: str, heads: int, default: int) -> int:
    """num_key_value_heads, which must divide the attention heads (vLLM's attention needs whole query groups)."""
    kv_heads = _int(cfg, where, "num_key_value_heads", default=default)
    if heads % kv_heads:
        raise InputError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    return kv_heads


def _ssm_dtype(cfg: dict, where: str, key: str, default: str | None) -> str | None:
    """A config's SSM state dtype as the catalog's StateLayers.ssm_dtype reads it: float32, or
    auto for a 2-byte one (the model's), or `default` when the config names none."""
    value = cfg.get(key, default)
    if value not in ("float32", "bfloat16", "float16") + ((None,) if default is None else ()):
        raise InputError(f"{where}: {key} must be float32, bfloat16 or float16, not {value!r}")
    return value if value in (None, "float32") else "auto"


def _nemotron_h_layers(cfg: dict, where: str) -> tuple[int, int, int, str, dict[str, Any]]:
    """_layer_params for NemotronH, whose hybrid_override_pattern names each layer: M a Mamba2
    mixer, * attention, - a non-gated relu2 MLP, E an MoE of such experts with a shared one
    (vllm 0.30.0 model_executor/models/nemotron_h.py). num_layers counts the attention layers;
    the Mamba2 layers become state_layers, their SSM state in fp32 unless the config names
    mamba_ssm_cache_dtype (vLLM's NemotronHForCausalLMConfig hook)."""
    pattern = cfg.get("hybrid_override_pattern")
    if pattern is None and cfg.get("layer_types") is not None:
        raise InputError(f"{where}: a NemotronH config with layer_types and no hybrid_override_pattern is not read yet")
    if not isinstance(pattern, str) or not pattern or set(pattern) - set("M*-E"):
        raise InputError(f"{where}: hybrid_override_pattern must be a string of M, *, - and E, not {pattern!r}")
    if len(pattern) != _int(cfg, where, "num_hidden_layers"):
        raise InputError(f"{where}: hybrid_override_pattern names {len(pattern)} layers, "
                         f"num_hidden_layers {cfg['num_hidden_layers']}")
    hidden, heads = _int(cfg, where, "hidden_size"), _int(cfg, where, "num_attention_heads")
    # transformers' NemotronHConfig defaults, which vLLM loads for nemotron_h (configuration_nemotron_h.py)
    kv_heads, head_dim = _kv_heads(cfg, where, heads, default=8), _int(cfg, where, "head_dim", default=128)
    m_heads, m_dim = _int(cfg, where, "mamba_num_heads"), _int(cfg, where, "mamba_head_dim")
    state, groups = _int(cfg, where, "ssm_state_size"), _int(cfg, where, "n_groups")
    kernel = _int(cfg, where, "conv_kernel", least=2)
    ssm_dtype = _ssm_dtype(cfg, where, "mamba_ssm_cache_dtype", default="float32")
    count = {kind: pattern.count(kind) for kind in "M*-E"}
    if not count["*"] or not count["M"]:
        raise InputError(f"{where}: hybrid_override_pattern without both attention (*) and Mamba (M) layers is not modelled")
    inner, conv_dim = m_heads * m_dim, m_heads * m_dim + 2 * groups * state
    _bounded_state(where, inner, conv_dim, inner * state)
    mamba = hidden * (2 * inner + 2 * groups * state + m_heads) + inner * hidden + conv_dim * kernel
    attn = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
    dense_i = _int(cfg, where, "intermediate_size")
    linear = count["M"] * mamba + count["*"] * attn + count["-"] * 2 * hidden * dense_i
    replicated = len(pattern) * hidden + hidden + count["M"] * (conv_dim + 3 * m_heads + inner)  # norms, conv bias, A, D, dt
    geometry: dict[str, Any] = {"num_layers": count["*"], "hidden_size": hidden, "num_heads": heads,
                                "num_kv_heads": kv_heads, "head_dim": head_dim, "mlp": "dense", "intermediate_size": dense_i}
    if count["E"]:
        experts, moe_i = _int(cfg, where, "n_routed_experts"), _int(cfg, where, "moe_intermediate_size")
        shared = _int(cfg, where, "moe_shared_expert_intermediate_size", default=0, least=0)
        linear += count["E"] * 2 * hidden * (experts * moe_i + shared)
        replicated += count["E"] * (hidden + 1) * experts  # routers and their bias
        geometry.update(mlp="moe", intermediate_size=moe_i, num_experts_per_tok=_int(cfg, where, "num_experts_per_tok"),
                        shared_expert_intermediate_size=shared)
    geometry["state_layers"] = {
        "layers": count["M"], "num_heads": m_heads, "head_dim": m_dim, "state_size": state, "n_groups": groups,
        "conv_kernel": kernel, "chunk_size": _int(cfg, where, "chunk_size", default=128),
        "ssm_dtype": ssm_dtype, "source": f"{where}: hybrid_override_pattern, mamba_* and ssm_state_size"}
    return linear, replicated, geometry["mlp"], geometry


GDN_MODEL_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")


def _bounded_state(where: str, *sizes: int) -> None:
    """A state layer's widths (inner width, conv channels, SSM elements) within what the solver's integers take."""
    if max(sizes) > MAX_FIELD:
        raise InputError(f"{where}: the Mamba or linear-attention state is {max(sizes):,} elements a layer, more than "
                         f"{MAX_FIELD:,}: no real model comes near")


def _gated_deltanet_layers(cfg: dict, where: str) -> tuple[int, int, int, str, dict[str, Any]]:
    """_layer_params for Qwen3-Next and Qwen3.5's text models: Gated DeltaNet layers
    ("linear_attention" in layer_types, else all but every full_attention_interval-th) beside
    gated full attention. A GDN layer's state has Mamba2's shape with the value heads as heads,
    the value head width as head_dim, the key head width as state and the key heads as groups
    (vllm 0.30.0 model_executor/layers/mamba/mamba_utils.py gated_delta_net_state_shape). Its
    SSM state is the model dtype unless a Qwen3.5 config names mamba_ssm_dtype (vLLM's
    Qwen3_5ForCausalLMConfig hook; Qwen3-Next has none: model_executor/models/config.py)."""
    layers = _int(cfg, where, "num_hidden_layers")
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        if len(types) != layers or set(map(str, types)) - {"linear_attention", "full_attention"}:
            raise InputError(f"{where}: layer_types must name {layers} layers, each linear_attention or full_attention")
        full = sum(t == "full_attention" for t in types)
    else:
        interval = _int(cfg, where, "full_attention_interval")
        full = layers // interval  # layer i is full when (i + 1) % interval == 0 (transformers' Qwen3NextConfig)
    if not 0 < full < layers:
        raise InputError(f"{where}: a Gated DeltaNet model with {full} of {layers} full-attention layers is not modelled")
    hidden, heads = _int(cfg, where, "hidden_size"), _int(cfg, where, "num_attention_heads")
    kv_heads, head_dim = _kv_heads(cfg, where, heads, default=heads), _int(cfg, where, "head_dim")
    nk, nv = _int(cfg, where, "linear_num_key_heads"), _int(cfg, where, "linear_num_value_heads")
    dk, dv = _int(cfg, where, "linear_key_head_dim"), _int(cfg, where, "linear_value_head_dim")
    kernel = _int(cfg, where, "linear_conv_kernel_dim", default=4, least=2)
    ssm = _ssm_dtype(cfg, where, "mamba_ssm_dtype", default=None) if cfg.get("model_type") != "qwen3_next" else None
    if nv % nk:  # vLLM's GDN repeats each key head over whole value-head groups
        raise InputError(f"{where}: linear_num_value_heads {nv} is not a multiple of linear_num_key_heads {nk}")
    linear_layers = layers - full
    conv_dim = 2 * nk * dk + nv * dv
    _bounded_state(where, nv * dv, conv_dim, nv * dv * dk)
    gdn = hidden * (conv_dim + nv * dv + 2 * nv) + nv * dv * hidden + conv_dim * kernel
    attn = hidden * (2 * heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden  # q with its output gate
    linear = linear_layers * gdn + full * attn
    replicated = layers * 2 * hidden + hidden + linear_layers * (2 * nv + dv) + full * 2 * head_dim
    geometry: dict[str, Any] = {"num_layers": full, "hidden_size": hidden, "num_heads": heads, "num_kv_heads": kv_heads,
                                "head_dim": head_dim}
    experts = _int(cfg, where, "num_experts", default=0, least=0)
    if experts:
        moe_i = _int(cfg, where, "moe_intermediate_size")
        shared = _int(cfg, where, "shared_expert_intermediate_size", default=0, least=0)
        linear += layers * 3 * hidden * (experts * moe_i + shared)
        replicated += layers * hidden * (experts + 1)  # router and shared-expert gate
        geometry.update(mlp="moe", intermediate_size=moe_i, num_experts_per_tok=_int(cfg, where, "num_experts_per_tok"),
                        shared_expert_intermediate_size=shared)
    else:
        dense_i = _int(cfg, where, "intermediate_size")
        linear += layers * 3 * hidden * dense_i
        geometry.update(mlp="dense", intermediate_size=dense_i)
    geometry["state_layers"] = {
        "layers": linear_layers, "num_heads": nv, "head_dim": dv, "state_size": dk, "n_groups": nk,
        "conv_kernel": kernel, "chunk_size": 64, "ssm_dtype": ssm or "auto",
        "source": f"{where}: layer_types or full_attention_interval, linear_* geometry"}
    return linear, replicated, geometry["mlp"], geometry


# the families whose state layers are read from config.json: model_type -> _layer_params' twin
_STATE_LAYER_READERS = {"nemotron_h": _nemotron_h_layers, **dict.fromkeys(GDN_MODEL_TYPES, _gated_deltanet_layers)}


def transformer_fields(cfg: dict, where: str) -> dict[str, Any]:
    """The catalog's Transformer fields that a (text) config states: geometry, vocab, positions."""
    _, _, _, geometry = _layer_params(cfg, where)
    return {**geometry, "vocab_size": _int(cfg, where, "vocab_size"), "max_position": max_position(cfg)}


def vision_fields(cfg: dict, where: str) -> dict[str, Any]:
    """The VisionTower fields a Qwen-VL style vision_config states."""
    def get(*keys):
        return _int(cfg, where, *keys)

    return {"depth": get("depth", "num_hidden_layers"), "hidden_size": get("hidden_size", "embed_dim"),
            "intermediate_size": get("intermediate_size"), "num_heads": get("num_heads", "num_attention_heads"),
            "patch_size": get("patch_size"), "temporal_patch_size": get("temporal_patch_size"),
            "spatial_merge_size": get("spatial_merge_size"),
            "deepstack_layers": len(cfg.get("deepstack_visual_indexes") or []),
            "out_hidden_size": get("out_hidden_size")}


def section(cfg: dict, path: str, where: str) -> dict:
    """A nested config section by dotted path ("thinker_config.text_config")."""
    node: Any = cfg
    for part in path.split("."):
        if not isinstance(node, dict) or not isinstance(node.get(part), dict):
            raise InputError(f"{where}: has no {path} section")
        node = node[part]
    return node


def one_stage_pipeline(cfg: dict, name: str, where: str = "config.json") -> dict[str, Any]:
    """The catalog data of a one-stage pipeline for the decoder LLM that `cfg` (a
    config.json) describes; catalog.pipeline_from_config validates it."""
    if not isinstance(cfg, dict):
        raise InputError(f"{where}: expected a JSON object")
    top = cfg
    cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) and "num_hidden_layers" not in cfg else cfg
    for key, value in top.items():  # vision_config, audio_config, audio_encoder_config, speech_config, ...
        if isinstance(value, dict) and any(part in key for part in ("vision", "audio", "speech", "visual", "image",
                                                                    "encoder", "talker", "tts")):
            raise InputError(f"{where}: a multimodal model ({key}) is not modelled as a one-stage LLM: its encoder's "
                             "profile run would be left out of the plan")
    cfg = with_class_defaults(cfg)  # what transformers' config class gives where the file is silent
    architectures = cfg.get("architectures") or [str(cfg.get("model_type", "decoder"))]
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise InputError(f"{where}: architectures must be a list of names, not {architectures!r}")
    parts: dict = {}
    state_reader = _STATE_LAYER_READERS.get(str(cfg.get("model_type")))
    if state_reader is not None:  # Mamba2 or Gated DeltaNet layers beside attention: mamba_pool.py sizes their state
        linear, replicated, _, geometry = state_reader(cfg, where)
        window = sliding = 0
        layout = Layout()
    else:
        window, sliding = sliding_layout(cfg, _int(cfg, where, "num_hidden_layers"), where)  # refuses state layers first
        layout = layout_of(cfg, architectures, where)
        linear, replicated, _, geometry = _layer_params(cfg, where, layout, parts)
    vocab = _int(cfg, where, "vocab_size")
    hidden = geometry["hidden_size"]
    embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2) + (vocab if layout.lm_head_bias else 0)
    dtype = load_dtype(cfg, where)
    components = linear_components(cfg, where, linear, parts, f"{where} ({', '.join(architectures)})")
    source = f"{where} ({', '.join(architectures)})"
    heads = geometry["num_heads"]
    state = geometry.get("state_layers")  # vLLM splits the Mamba heads over TP as well
    degrees = [d for d in (1, 2, 4, 8) if heads % d == 0 and (state is None or state["num_heads"] % d == 0
                                                             and state["n_groups"] % d == 0)]
    stage = {
        "stage_id": 0,
        "name": "llm",
        "role": "autoregressive",
        "dtype": dtype,
        "quantization": (cfg.get("quantization_config") or {}).get("quant_method"),
        "linear_layers": "hfconfig: the decoder's projections and routed experts, apart from embeddings and norms",
        "components": [
            *components,
            {"name": "embeddings", "params": embeddings, "sharding": "tp",
             "source": f"{source}: vocab x hidden, x2 unless tie_word_embeddings"},
            {"name": "norms_and_routers", "params": max(1, replicated), "sharding": "replicated",
             "source": f"{source}: norms, MoE routers (and OPT's learned position table), replicated on every rank"},
        ],
        "transformer": {**geometry, "vocab_size": vocab, "max_position": max_position(cfg),
                        "sliding_window": window, "sliding_layers": sliding,
                        "qk_norm": str(cfg.get("model_type", "")).startswith("qwen3"), "source": source},
        "tp_degrees": degrees,
        "tp_tested": [{"tp": d, "versions": "0.12-", "source": "vLLM serves a decoder LLM at any TP degree that divides "
                       f"its {heads} attention heads (vllm/config/model.py verify_with_parallel_config)"} for d in degrees],
        "defaults": {s: {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "enforce_eager": False}
                     for s in ("deploy", "stage-args")},
    }
    import re

    slug = re.sub(r"[^a-z0-9.\-]+", "-", name.rstrip("/").split("/")[-1].lower() if "/" in name and
                  name.startswith((".", "/", "~")) else name.lower()).strip("-.") or "model"
    return {
        "name": slug,
        "hf_id": name,
        "description": f"{name}: a one-stage decoder LLM read from its config.json",
        "model_arch": architectures[0],
        "legacy_versions": "0.12-0.26",
        "legacy_versions_source": "a one-stage pipeline has no stage wiring to name",
        "stages": [stage],
    }


def apply_config(raw: dict, config: dict, where: str) -> dict:
    """A catalog file's raw data with every number its model's config.json states filled in:
    each stage naming a `config_section` gets its decoder geometry from there, and one naming
    a `vision_config_section` its vision tower's. The catalog itself must not state them."""
    raw = dict(raw)
    stages = []
    for st in raw.get("stages") or []:
        st = dict(st)
        path = st.pop("config_section", None)
        if path is not None:
            own = _merge_section(st, "transformer", transformer_fields, config, path, where)
            st["transformer"]["source"] = own.get("source") or f"config.json {path}"
        vpath = st.pop("vision_config_section", None)
        if vpath is not None:
            own = _merge_section(st, "vision_tower", vision_fields, config, vpath, where)
            deepstack = st["vision_tower"]["deepstack_layers"]
            if "transformer" in st and deepstack and st.get("role") == "autoregressive" and own.get("only_if") is None:
                st["transformer"] = {"deepstack_levels": deepstack, **st["transformer"]}
        stages.append(st)
    raw["stages"] = stages
    return raw


def _merge_section(st: dict, key: str, fields, config: dict, path: str, where: str) -> dict:
    """Set st[key] to the fields config.json's `path` states, then the catalog's own (which
    may not repeat them); returns the catalog's own."""
    derived = fields(section(config, path, where), f"{where} {path}")
    own = dict(st.get(key) or {})
    repeated = sorted(set(own) & set(derived))
    if repeated:
        raise CatalogError(f"{where}: stage {st.get('name')}: {key} repeats what {path} states: {', '.join(repeated)}")
    st[key] = {**derived, **own}
    return own

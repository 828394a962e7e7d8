"""`--model`: a catalog name, a local Hugging Face model directory, or a Hub id.

For a checkpoint the pipeline definition (the catalog entry whose `match` rules its
config.json matches, or a one-stage decoder LLM) supplies the stage wiring, and the checkpoint
every number it has: the decoder geometry from config.json, and each stage's weights
exactly, as the sum of its tensors' stored sizes in the safetensors headers (quantized
tensors and their scales at their stored size). Tensors are assigned to stages by the
catalog's name prefixes (`thinker.`, `talker.`, `code2wav.`, ...); within a stage, norms
and MoE routers are replicated on every TP rank, a catalog component with a tensor
prefix (an encoder) keeps the catalog's sharding, and the rest is split.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, closest_names
from .catalog import (
    DTYPE_BYTES,
    PipelineSpec,
    catalog_heads,
    catalog_key,
    catalog_names,
    catalog_text,
    load_pipeline_text,
    lookup_model,
    pipeline_from_config,
)
from .catalog_match import match_config, names_model_type
from .checkpoint import (
    Checkpoint,
    looks_like_hub_id,
    read_hub,
    read_local,
    with_subfolders,
)
from .yamlio import parse_json, read_text

# safetensors dtype -> bytes per element (https://huggingface.co/docs/safetensors)
_ELEMENT = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "BF16": 2, "F16": 2, "I16": 2, "U16": 2,
            "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1}
_REPLICATED = re.compile(r"(norm|\.gate\.weight$|router|embed_positions)")
# token embeddings and the LM head: vocabulary-parallel in vLLM, never quantized at load (fp8's
# online method quantizes LinearBase and FusedMoE layers only; vllm 0.30.0 quantization/online/base.py)
_EMBEDDINGS = re.compile(r"(embed_tokens|lm_head|\.wte\.|word_embeddings|embed_out|embeddings?\.weight$)")
# the projections of vLLM's decoder layers and routed experts (its LinearBase / FusedMoE weights):
# the `linear` group, which quantization fp8 quantizes at load; any other tensor keeps the model
# dtype (`other_weights`), so a name missing here errs high, never low
_PROJECTION = re.compile(r"\.(?:q|k|v|o|qkv|gate|up|down|gate_up|in|out|q_a|q_b|kv_a|kv_b|kv_a_proj_with_mqa)_proj\."
                         r"|\.(?:kv_a_proj_with_mqa|w1|w2|w3|fc1|fc2|c_attn|c_proj|c_fc|query_key_value|"
                         r"dense_h_to_4h|dense_4h_to_h|wqkv|wo)\.")
_FLOAT = ("F32", "BF16", "F16")
# LeRobot policy configs name their kind in `type`, not model_type (vllm_omni 0.30.0 diffusion/data.py:1726-1735)
_LEROBOT_TYPES = {"pi0": "pi0", "pi05": "pi05"}
# a diffusers model_index.json class a catalog pipeline's diffusion stage runs, where its model_arch names the
# AR stage's class (vllm_omni 0.30.0 model_executor/models/glm_image/pipeline.py diffusers_class_name)
_DIFFUSERS_CLASSES = {"GlmImagePipeline": "glm-image"}


@dataclass(frozen=True)
class ModelSource:
    pipeline: PipelineSpec
    reference: str  # what --model said (reproduces the run)
    notes: tuple[str, ...] = ()


def resolve(text: str) -> ModelSource:
    """The pipeline a --model value names."""
    key = text.strip()
    if any(not ch.isprintable() for ch in key):  # it goes into file headers and launch.sh
        raise InputError(f"--model {key!r}: the name holds a control or line-break character")
    if catalog_key(key) in catalog_names():  # loads that entry alone (and the file it extends)
        return ModelSource(lookup_model(key), lookup_model(key).name)
    if Path(key).exists():
        _refuse_catalog_only(Path(key) / "config.json", key)
        return from_checkpoint(read_local(key), key)
    if looks_like_hub_id(key):
        _refuse_unread_hub_id(key)
        return from_checkpoint(read_hub(key), key)
    hint = closest_names(key, list(catalog_names()), "`omni-autoconf models`")
    raise InputError(f"unknown model {text!r}: not a catalog model, a model directory, or a Hub id ORG/NAME{hint}")


# a file in a directory that names a catalog pipeline its config.json does not: Gepard's
# config.json says qwen3_5_text (vllm_omni 0.30.0 wheel, deploy/gepard.yaml); IndexTTS-2 keeps
# its weights in PyTorch pickles beside a config.yaml (vllm_omni 0.30.0 wheel,
# model_executor/models/indextts2/indextts2_talker.py reads gpt.pth, the decoder s2mel.pth), and
# CosyVoice3 and PersonaPlex beside an empty config.json (model_executor/models/cosyvoice3/cosyvoice3.py reads
# llm.pt; model_executor/models/personaplex/duplex/stage0.py reads the voice prompts in voices.tgz)
_SIDECARS = {"gepard_config.json": ("gepard-1.0", "its config.json alone reads as a plain LLM"),
             "s2mel.pth": ("indextts-2 (indextts-2.5 for an IndexTTS-2.5 checkpoint)",
                           "its weights are PyTorch pickles, not safetensors"),
             "cosyvoice3.yaml": ("cosyvoice3-0.5b", "its weights are PyTorch pickles and its config.json is empty"),
             "voices.tgz": ("personaplex-7b", "its config.json is empty: vLLM-Omni's config defaults give every number")}


def _refuse_catalog_only(config_path: Path, reference: str) -> None:
    """A directory of a pipeline whose checkpoint layout is not read: its pointer before
    any shard is looked for (GLM-TTS keeps its shards in llm/)."""
    for sidecar, (name, why) in _SIDECARS.items():
        if (config_path.parent / sidecar).is_file():
            raise InputError(f"{reference}: its {sidecar} makes it a {name.split()[0]} checkpoint, whose directory is "
                             f"not read yet ({why}); plan it by its catalog name: --model {name}")
    index = config_path.parent / "model_index.json"
    if index.is_file() and not config_path.is_file():  # a diffusers pipeline: its class names the catalog entry
        cls = _json_object(index).get("_class_name")
        names = sorted(n for n, spec in catalog_heads().items()
                       if cls and (spec.model_arch == cls or _DIFFUSERS_CLASSES.get(cls) == n))
        # one class serves several checkpoints (Wan2.2's TI2V-5B and T2V-A14B are both WanPipeline)
        runs = ", ".join(f"{n} ({catalog_heads()[n].hf_id})" for n in names)
        hint = (f"the catalog runs that class for {runs}: if this is one of those checkpoints, plan it by its catalog "
                f"name: --model {names[0]}") if names else "no catalog pipeline runs it"
        raise InputError(f"{reference}: a diffusers pipeline directory (model_index.json, _class_name {cls!r}) is not "
                         f"read yet; {hint}")

    cfg = _json_object(config_path)  # {} when unreadable: read_local names what is wrong with the file
    _check_model_type(cfg, reference)
    _refuse_listed(cfg, reference)
    model_type, kind = cfg.get("model_type"), cfg.get("type")
    if isinstance(kind, str) and kind in _LEROBOT_TYPES and model_type is None:
        raise InputError(f"{reference}: a LeRobot {kind} policy directory is not read yet; plan it by its catalog "
                         f"name: --model {_LEROBOT_TYPES[kind]}")


def _json_object(path: Path) -> dict:
    """A small JSON object file's content, or {} (missing, too large, not JSON, not an object):
    bounded like every file this tool reads (yamlio.read_text, parse_json)."""
    try:
        value = parse_json(read_text(path), str(path)) if path.is_file() else {}
    except InputError:
        return {}
    return value if isinstance(value, dict) else {}


def _refuse_listed(cfg: dict, reference: str) -> None:
    """A config a catalog `match` rule with `refuse` matches (by model_type, else by
    architecture): its pointer, for a directory and a Hub id alike."""
    found = match_config(catalog_heads(), cfg, reference)
    if found is not None and found.rule.refuse is not None:
        raise found.refusal(reference)


def from_checkpoint(ckpt: Checkpoint, reference: str) -> ModelSource:
    """The pipeline of a checkpoint: the catalog entry whose `match` rules its config.json
    matches (catalog_match.py), else a one-stage decoder LLM."""
    cfg = ckpt.config
    _check_model_type(cfg, reference)
    model_type = str(cfg.get("model_type", ""))
    found = match_config(catalog_heads(), cfg, reference)
    if found is not None and found.rule.refuse is None:
        name = found.name
        text, filename = catalog_text(name)
        base = load_pipeline_text(text, filename, config=cfg if lookup_model(name).config else None)
        ckpt = with_subfolders(ckpt, base.checkpoint_subfolders)
    elif found is not None:  # a Hub id's config (a directory's is refused before its shards are read)
        raise found.refusal(reference)
    elif names_model_type(catalog_heads(), cfg.get("model_type")):
        raise InputError(f"{reference}: config.json model_type {model_type!r}, but not the geometry of the "
                         "checkpoint vLLM-Omni serves for it (see docs/pipelines.md)")
    else:
        if not (any(str(a).endswith("ForCausalLM") for a in _names(cfg.get("architectures")))
                or "num_hidden_layers" in cfg):
            raise InputError(f"{reference}: config.json model_type {model_type!r} is no pipeline this tool covers")
        base = pipeline_from_config(cfg, reference, where=f"{reference}/config.json")
    _refuse_misread_hub_id(base.name, reference)
    return exact_weights(base, ckpt, reference)


def _check_model_type(cfg: dict, reference: str) -> None:
    """config.json's model_type, when present, is a string: transformers' AutoConfig looks it
    up in its CONFIG_MAPPING by that string (transformers models/auto/configuration_auto.py
    AutoConfig.from_pretrained), so a list or a number is no config vLLM loads."""
    if "model_type" in cfg and not isinstance(cfg["model_type"], str):
        kind = "null" if cfg["model_type"] is None else type(cfg["model_type"]).__name__
        raise InputError(f"{reference}/config.json: model_type is a {kind}, not a string (the name of a model type)")


def _catalog_names_of(hub_id: str) -> list[str]:
    """The catalog entries whose checkpoint is this Hub id (case as the Hub ignores it)."""
    return sorted(name for name, head in catalog_heads().items() if head.hf_id.lower() == hub_id.lower())


def _refuse_unread_hub_id(reference: str) -> None:
    """The Hub id of a catalog pipeline whose checkpoint is not read (no checkpoint_prefixes:
    pickles, Mistral params.json, weights in subfolders): its pointer, before any network call."""
    names = [name for name in _catalog_names_of(reference) if not catalog_heads()[name].reads_checkpoint]
    if names:
        raise InputError(f"{reference}: the checkpoint of {', '.join(names)}, whose files are not read yet; plan it "
                         f"by its catalog name: --model {names[0]}")


def _refuse_misread_hub_id(read_as: str, reference: str) -> None:
    """A Hub id that is a catalog pipeline's checkpoint must read as that pipeline (Gepard's
    config.json alone reads as a plain Qwen3.5 LLM)."""
    if Path(reference).exists():
        return
    names = _catalog_names_of(reference)
    if names and read_as not in names:
        raise InputError(f"{reference}: is the checkpoint of {', '.join(names)}, but its config.json reads as "
                         f"{read_as}; plan it by its catalog name: --model {names[0]}")


def _names(value) -> list:
    """config.json `architectures` when it is a list (hfconfig says what else is wrong)."""
    return value if isinstance(value, list) else []


def exact_weights(pipeline: PipelineSpec, ckpt: Checkpoint, reference: str) -> ModelSource:
    """The pipeline with every stage's components replaced by its checkpoint tensors."""
    notes: list[str] = []
    prefixes = pipeline.checkpoint_prefixes or {pipeline.stages[0].name: [""]}
    stages = []
    claimed_total = 0
    for st in pipeline.stages:
        own = prefixes.get(st.name)
        if own is None:
            raise InputError(f"{pipeline.name}: the catalog names no checkpoint prefix for stage {st.name}")
        if not own:  # its weights are no safetensors (token2wav's .pt and .onnx files)
            notes.append(f"{st.name}: its weights are not in safetensors files: planned at the catalog's estimate")
            stages.append(st)
            continue
        tensors = ckpt.with_prefix(*own)
        if not ckpt.with_prefix(own[0]):  # its own weights, not only the blocks it also loads
            raise InputError(f"{reference}: no tensor starts with {own[0]} (stage {st.name})")
        claimed_total += sum(t.nbytes for t in tensors)
        components, cast = _components(st, tensors, ckpt)
        if cast:
            notes.append(f"{st.name}: weights stored in {cast} are loaded as {st.dtype}: planned at the loaded size")
        stages.append(st.model_copy(update={"components": components}))
    if claimed_total < ckpt.total_bytes:
        notes.append(f"{(ckpt.total_bytes - claimed_total) / 2**30:.2f} GiB of tensors belong to no planned stage")
    spec = pipeline.model_copy(update={"stages": stages, "hf_id": reference})
    return ModelSource(PipelineSpec.model_validate(spec.model_dump()), reference, tuple(notes))


def _components(st, tensors, ckpt: Checkpoint):
    """(components, stored dtype when the stage casts at load)."""
    from .catalog import Component

    load_elem = {"float32": 4}.get(st.dtype)
    cast = None
    groups: dict[str, tuple[Component | None, int]] = {}
    stored: dict[str, set[str]] = {}  # the safetensors dtypes each group holds
    prefixed = [c for c in st.components if c.tensor_prefix]
    for t in tensors:
        elem = _ELEMENT.get(t.dtype)
        if elem is None:
            raise InputError(f"{ckpt.source}: tensor {t.name} has dtype {t.dtype}, which safetensors does not define")
        size = t.nbytes
        owner = next((c for c in prefixed if t.name.startswith(c.tensor_prefix)), None)
        if load_elem and elem in (2,) and t.dtype in ("BF16", "F16"):
            size = t.nbytes // elem * load_elem
            cast = t.dtype
        elif owner is not None and owner.cast_at_load and t.dtype in ("F32", "BF16", "F16"):
            loaded = int(DTYPE_BYTES[owner.dtype or st.dtype])
            if loaded != elem:
                size = t.nbytes // elem * loaded
                cast = t.dtype
        key = owner.name if owner else ("norms_and_routers" if _REPLICATED.search(t.name) else
                                        "embeddings" if _EMBEDDINGS.search(t.name) else
                                        "linear_biases" if t.name.endswith(".bias") else
                                        "linear" if _PROJECTION.search(t.name) else "other_weights")
        prev = groups.get(key, (owner, 0))
        groups[key] = (owner, prev[1] + size)
        stored.setdefault(key, set()).add("cast" if size != t.nbytes else t.dtype)
    out = []
    for key, (owner, nbytes) in sorted(groups.items()):
        base = {"name": key, "params": max(1, nbytes), "dtype": "bytes",
                "source": f"{ckpt.source}: stored tensor sizes from the safetensors headers"}
        # a group stored in the dtype it loads in is parameters of that dtype (so --dtype and
        # --quantization fp8 rescale it); quantized or mixed groups stay bytes
        loaded = (owner.dtype if owner is not None and owner.dtype else None) or st.dtype
        elem = int(DTYPE_BYTES[loaded]) if loaded in ("bfloat16", "float16", "float32") else 0
        if (elem and stored[key] <= set(_FLOAT)
                and all(_ELEMENT[d] == elem for d in stored[key]) and nbytes % elem == 0):
            base.update(params=max(1, nbytes // elem), dtype=owner.dtype if owner is not None else None)
        if owner is not None:
            base.update(sharding=owner.sharding, split_versions=owner.split_versions, split_divides=owner.split_divides,
                        only_if=owner.only_if, tensor_prefix=owner.tensor_prefix, cast_at_load=owner.cast_at_load)
        else:
            base["sharding"] = "replicated" if key == "norms_and_routers" else "tp"
        out.append(Component.model_validate(base))
    # memory built at load, not read from the checkpoint (buffers, graph tensors): kept as it is
    out += [c for c in st.components if not c.in_checkpoint]
    # components of other stages' tensors this stage also loads (the talker built the thinker's encoders)
    for c in st.components:
        if c.tensor_prefix and c.only_if and c.name not in groups:
            nbytes = ckpt.bytes_with_prefix(c.tensor_prefix)
            if nbytes:
                out.append(c.model_copy(update={"params": nbytes, "dtype": "bytes",
                                                "source": f"{ckpt.source}: tensors under {c.tensor_prefix}"}))
    return out, cast

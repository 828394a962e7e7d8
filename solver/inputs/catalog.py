"""The model catalog: one YAML file per vLLM-Omni pipeline in models/, validated on load.

A pipeline is a list of stages. Each stage says what it loads (parameter counts by
component, how each is split across TP ranks, and in which vLLM-Omni versions it is
loaded), its transformer geometry (for KV bytes and activations), the TP degrees it
allows, the defaults of its memory knobs, and the non-memory fields each output schema
needs. Every number carries its source in the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationError, model_validator

from ..errors import CatalogError, InputError
from ..vllm.facts import in_range, range_text
from .catalog_match import MatchRule, check_rules
from .catalog_parts import (  # noqa: F401  (re-exported: the parts are catalog vocabulary)
    DTYPE_BYTES, PLANNED_KEYS, VERSIONS_PATTERN, BatchRule, Component, DeployTopOverlay, DiffusionProfile, EncoderProfile,
    GenerationProfile, LegacyOverlay, MemoryDefaults, ServingOutside, Strict, TpEvidence, Transformer, VisionTower,
)
from .catalog_stage import SCHEMAS, Schema, StageSpec  # noqa: F401  (re-exported)
from .catalog_variants import extended
from .yamlio import parse_mapping

if TYPE_CHECKING:
    from ..vllm.facts import OmniVersion as OmniVersionLike


class PipelineSpec(Strict):
    """A vLLM-Omni pipeline (one model)."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$", description="The catalog name --model takes.")
    hf_id: str = Field(description="The checkpoint's Hub id: the model multi-host launch commands serve; a "
                       "--model naming it must read as this entry.")
    description: str = Field(description="One line: the checkpoint, its parameters and dtype (with a source key).")
    model_arch: str = Field(description="The class vLLM-Omni runs (a diffusion pipeline's diffusers class: a "
                            "model_index.json naming it points to this entry).")
    stages: list[StageSpec] = Field(min_length=1, description="The stages in stage_id order.")
    deploy_top: dict[str, Any] = Field(default_factory=dict, description="Top-level keys of the deploy YAML.")
    legacy_top: dict[str, Any] = Field(default_factory=dict, description="Top-level keys besides stage_args.")
    legacy_versions: str | None = Field(
        pattern=VERSIONS_PATTERN,
        description="vLLM-Omni versions in which the legacy stage wiring (the functions its "
        "custom_process_input_func names) exists; null: no stage_args file serves this pipeline.",
    )
    legacy_versions_source: str = Field(min_length=1, description="Why legacy_versions (said when refusing it).")
    deploy_versions: str = Field(
        default="0.20-", pattern=VERSIONS_PATTERN,
        description="vLLM-Omni versions whose deploy loader serves this pipeline (deploy/ exists from 0.20).",
    )
    deploy_versions_source: str | None = Field(default=None, description="Why deploy_versions (when not 0.20-).")
    deploy_top_overlays: list[DeployTopOverlay] = Field(
        default_factory=list, description="deploy_top keys only some versions take.")
    registry_key: str | None = Field(
        default=None, description="The key vLLM-Omni's pipeline registry resolves this model to (a file's "
        "`pipeline:` naming another is another topology, or none).")
    config: str | None = Field(default=None, description="The model's config.json shipped beside this file.")
    checkpoint_prefixes: dict[str, list[str]] = Field(
        default_factory=dict, description="Per stage, the tensor-name prefixes of its weights in the checkpoint."
    )
    checkpoint_subfolders: list[str] = Field(
        default_factory=list, description="Folders of the checkpoint with shards of their own (tensors named SUB/...).")
    sources: dict[str, str] = Field(
        default_factory=dict, description="Citations by key; each `source` field and comment names its keys.")
    match: list[MatchRule] = Field(
        default_factory=list, description="How a checkpoint's config.json is recognised as this pipeline (not "
        "inherited by a file that `extends` this one).")
    frontend_gpu_bytes: int = Field(
        default=0, ge=0, description="What the API process itself loads on the first GPU once serving (a "
        "front-end encoder its input processor runs), outside every stage's fraction.")
    frontend_gpu_source: str | None = Field(default=None, description="Where frontend_gpu_bytes comes from.")

    @model_validator(mode="after")
    def _check(self) -> "PipelineSpec":
        ids = [s.stage_id for s in self.stages]
        if ids != list(range(len(ids))):
            raise ValueError(f"stage ids must be 0..{len(ids) - 1} in order, got {ids}")
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must be distinct, got {names}")
        if self.deploy_versions != "0.20-" and self.deploy_versions_source is None:
            raise ValueError("deploy_versions other than 0.20- needs deploy_versions_source")
        if self.frontend_gpu_bytes and not self.frontend_gpu_source:
            raise ValueError("frontend_gpu_bytes needs frontend_gpu_source")
        schemas = ("deploy",) if self.legacy_versions is None else SCHEMAS
        for st in self.stages:
            missing = set(schemas) - set(st.defaults)
            if missing:
                raise ValueError(f"stage {st.name}: defaults: missing schema(s) {sorted(missing)}")
        return self

    def deploy_top_at(self, version: str) -> dict[str, Any]:
        """The deploy file's top-level keys for `version`: deploy_top and its overlays."""
        top: dict[str, Any] = {}  # an overlay's keys first (`pipeline:` heads the file, as bundled)
        for overlay in self.deploy_top_overlays:
            if in_range(version, overlay.versions):
                top.update(overlay.fields)
        for key, value in self.deploy_top.items():
            top.setdefault(key, value)
        return top

    def judged_reason(self, schema: str, version: OmniVersionLike) -> str | None:
        """Why a `schema` file of this pipeline cannot be judged (check, calibrate) on
        `version`, or None. A schema the version does not read, and a legacy file whose
        wiring the version lacks, are judged: their failure is the prediction."""
        if not version.reads(schema):
            return None
        reason = self.unserved_reason(schema, version.name)
        return reason if reason is not None and (schema == "deploy" or self.legacy_versions is None) else None

    def unserved_reason(self, schema: str, version: str) -> str | None:
        """Why no `schema` file of this pipeline is planned or checked for `version`, or None."""
        if schema == "stage-args" and self.legacy_versions is None:
            fix = "use --schema deploy" if in_range(version, self.deploy_versions) else \
                f"choose --omni-version {self.deploy_versions.partition('-')[0]}"
            return (f"no stage_args file is planned for {self.name}: {self.legacy_versions_source}; {fix} "
                    f"(deploy files, vLLM-Omni {range_text(self.deploy_versions)})")
        if schema == "stage-args" and not in_range(version, self.legacy_versions):
            return (f"a stage_args file for {self.name} works on vLLM-Omni {range_text(self.legacy_versions)} only: "
                    f"{self.legacy_versions_source}; use --schema deploy for {version}")
        if schema == "deploy" and not in_range(version, self.deploy_versions):
            why = f" ({self.deploy_versions_source})" if self.deploy_versions_source else ""
            return (f"{self.name} is modelled for vLLM-Omni {range_text(self.deploy_versions)} only{why}; "
                    f"choose --omni-version {self.deploy_versions.partition('-')[0]}")
        return None

    def deploy_notes(self, version: str) -> list[str]:
        return [o.note for o in self.deploy_top_overlays if o.note and in_range(version, o.versions)]

    def prefix_caching(self, stage: StageSpec, schema: str) -> bool:
        """Whether the stage runs with prefix caching (vLLM V1's default is on)."""
        if schema == "deploy":
            value = stage.deploy_fields.get("enable_prefix_caching", self.deploy_top.get("enable_prefix_caching"))
        else:
            value = stage.legacy_engine_args.get("enable_prefix_caching")
        return True if value is None else bool(value)

    def async_chunk(self, schema: str) -> bool:
        """Whether stages stream to the next (async_chunk): the deploy schema's default is on
        (0.30.0 wheel, vllm_omni/config/stage_config.py DeployConfig async_chunk = True),
        the legacy loader's off (entrypoints/utils.py config_data.get("async_chunk", False))."""
        top = self.deploy_top if schema == "deploy" else self.legacy_top
        return bool(top.get("async_chunk", schema == "deploy"))

    def _deploy_value(self, stage: StageSpec, key: str):
        """A deploy file's value of `key` for `stage`: its engine_extras, else the stage's, else the
        pipeline-wide key (None: unset)."""
        extras = stage.deploy_fields.get("engine_extras") or {}
        return extras.get(key, stage.deploy_fields.get(key, self.deploy_top.get(key)))

    def written_dtype(self, stage: StageSpec, schema: str) -> str | None:
        """The dtype a file for this stage names (None: auto), stage over pipeline-wide."""
        if schema == "deploy":
            value = self._deploy_value(stage, "dtype")
        else:
            value = stage.legacy_engine_args.get("dtype")
        return None if value is None else str(value)

    def chunked_prefill(self, stage: StageSpec, schema: str) -> bool:
        """Whether the stage runs with chunked prefill (vLLM V1's default for decoder models:
        on; vllm/engine/arg_utils.py _set_default_chunked_prefill_and_prefix_caching_args)."""
        if schema == "deploy":
            value = self._deploy_value(stage, "enable_chunked_prefill")
        else:
            value = stage.legacy_engine_args.get("enable_chunked_prefill")
        return True if value is None else bool(value)

    def stage(self, key: str | int) -> StageSpec:
        """A stage by name or id ("thinker", "0", 0)."""
        for s in self.stages:
            if str(key) in (s.name, str(s.stage_id)):
                return s
        known = ", ".join(f"{s.stage_id}={s.name}" for s in self.stages)
        raise InputError(f"model {self.name} has no stage {key!r}; stages: {known}")


def _format_validation_error(filename: str, exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    return f"{filename}: field {where}: {err['msg']}"


def load_pipeline_text(text: str, filename: str, config: dict | None = None) -> PipelineSpec:
    """Parse and validate one catalog file's text; errors name the file and the field.
    `config`: the model's config.json (else the one the file names, shipped beside it)."""
    raw = parse_mapping(text, filename, CatalogError)
    if "extends" in raw:
        raw = extended(raw, filename)
    name = raw.get("config")
    if config is None and isinstance(name, str):
        import json

        config = json.loads(resources.files("omni_autoconf.models").joinpath(name).read_text())
    if config is not None:
        from .hfconfig import apply_config

        try:
            raw = apply_config(raw, config, filename)
        except InputError as exc:
            raise CatalogError(str(exc)) from None
    try:
        return PipelineSpec.model_validate(raw)
    except ValidationError as exc:
        raise CatalogError(_format_validation_error(filename, exc)) from None


def _models_folder():
    return resources.files("omni_autoconf.models")


@lru_cache(maxsize=1)
def catalog_names() -> tuple[str, ...]:
    """The shipped entries' names, sorted: each file's stem (its `name`, which _entry checks).
    Lists the folder and parses nothing, so a run loads only the entry it names."""
    return tuple(sorted(e.name[:-len(".yaml")] for e in _models_folder().iterdir() if e.name.endswith(".yaml")))


@lru_cache(maxsize=None)
def _entry(name: str) -> PipelineSpec:
    """One shipped entry (and the file it `extends`), parsed and validated once."""
    filename = f"{name}.yaml"
    spec = load_pipeline_text(_models_folder().joinpath(filename).read_text(), filename)
    if spec.name != name:
        raise CatalogError(f"{filename}: name {spec.name!r} must be the file's name ({name})")
    return spec


@lru_cache(maxsize=1)
def model_catalog() -> dict[str, PipelineSpec]:
    """Every shipped pipeline, keyed by name (`models`, the tests; a plan loads only its own)."""
    specs = {name: _entry(name) for name in catalog_names()}
    check_rules(specs)
    return specs


@dataclass(frozen=True)
class CatalogHead:
    """What matching a checkpoint reads of an entry (model_source.py): its top-level keys,
    over its base's where it `extends` one, without validating its stages."""

    name: str
    hf_id: str
    model_arch: str
    match: tuple[MatchRule, ...]
    reads_checkpoint: bool  # checkpoint_prefixes given: its safetensors are read


@lru_cache(maxsize=1)
def catalog_heads() -> dict[str, CatalogHead]:
    """The index matching a config.json needs, for every entry: one C-parsed read of each file,
    no pipeline validation (tests/test_scale.py checks it against model_catalog())."""
    raw = {name: parse_mapping(_models_folder().joinpath(f"{name}.yaml").read_text(), f"{name}.yaml", CatalogError)
           for name in catalog_names()}
    files = {f"{name}.yaml": data for name, data in raw.items()}
    heads = {}
    for name, data in raw.items():
        base = files.get(data.get("extends"), {}) if "extends" in data else {}
        top = {**base, **data}
        try:
            rules = tuple(MatchRule.model_validate(r) for r in data.get("match") or [])
        except ValidationError as exc:
            raise CatalogError(_format_validation_error(f"{name}.yaml", exc)) from None
        heads[name] = CatalogHead(name, str(top.get("hf_id", "")), str(top.get("model_arch", "")), rules,
                                  bool(top.get("checkpoint_prefixes")))
    check_rules(heads)
    return heads


def catalog_text(name: str) -> tuple[str, str]:
    """(text, file name) of a shipped catalog file, for re-reading it over another config."""
    if name not in catalog_names():
        raise InputError(f"no catalog file for {name}")
    filename = f"{name}.yaml"
    return _models_folder().joinpath(filename).read_text(), filename


def catalog_key(name: str) -> str:
    """A --model name as the catalog spells it (case-insensitive; `_` and `-` alike)."""
    return name.strip().lower().replace("_", "-")


def lookup_model(name: str) -> PipelineSpec:
    """A shipped pipeline by name (case-insensitive; `_` and `-` alike)."""
    key = catalog_key(name)
    if key not in catalog_names():
        raise InputError(f"unknown model {name!r}; known models: {', '.join(catalog_names())}")
    return _entry(key)


def pipeline_from_config(cfg: dict, name: str, where: str = "config.json") -> PipelineSpec:
    """The one-stage pipeline of a decoder LLM's config.json (hfconfig.one_stage_pipeline),
    validated; a value the schema refuses is an InputError naming it."""
    from .hfconfig import one_stage_pipeline

    data = one_stage_pipeline(cfg, name, where)
    try:
        return PipelineSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        at = ".".join(str(part) for part in first.get("loc", ()))
        raise InputError(f"{where}: cannot describe this model ({at}: {first.get('msg')})") from None

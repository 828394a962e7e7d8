"""The model catalog: one YAML file per vLLM-Omni pipeline in models/, validated on load.

A pipeline is a list of stages. Each stage says what it loads (parameter counts by
component, how each is split across TP ranks, and in which vLLM-Omni versions it is
loaded), its transformer geometry (for KV bytes and activations), the TP degrees it
allows, the defaults of its memory knobs, and the non-memory fields each output schema
needs. Every number carries its source in the file.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationError, model_validator

from ..errors import CatalogError, InputError
from ..vllm.facts import in_range, range_text
from .catalog_parts import (  # noqa: F401  (re-exported: the parts are catalog vocabulary)
    DTYPE_BYTES, PLANNED_KEYS, VERSIONS_PATTERN, BatchRule, Component, DeployTopOverlay, DiffusionProfile, EncoderProfile,
    GenerationProfile, LegacyOverlay, MemoryDefaults, ServingOutside, Strict, TpEvidence, Transformer, VisionTower,
)

if TYPE_CHECKING:
    from ..vllm.facts import OmniVersion as OmniVersionLike
from .catalog_variants import extended
from .yamlio import parse_mapping

Schema = Literal["deploy", "stage-args"]
SCHEMAS: tuple[str, ...] = ("deploy", "stage-args")

class StageSpec(Strict):
    """One stage of a pipeline."""

    stage_id: int = Field(ge=0)
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="The stage's role: thinker, talker, code2wav, ...")
    role: Literal["autoregressive", "generation", "diffusion"] = Field(
        description="autoregressive: vLLM attention with a KV cache; generation: no KV cache; diffusion: "
        "no KV cache, and its fraction bounds nothing (diffusion_profile)."
    )
    dtype: str = Field(description="dtype the weights are loaded in.")
    components: list[Component] = Field(min_length=1)
    transformer: Transformer
    vision_tower: VisionTower | None = None
    encoder_profile: EncoderProfile | None = Field(default=None, description="An estimate where no tower is derived.")
    generation_profile: GenerationProfile | None = None
    diffusion_profile: DiffusionProfile | None = None
    serving_outside: ServingOutside | None = None
    tp_degrees: list[int] = Field(min_length=1, description="TP degrees vLLM accepts for this stage.")
    tp_tested: list[TpEvidence] = Field(
        min_length=1, description="The degrees upstream runs, with evidence: the only ones planned by default."
    )
    max_num_seqs_limit: int | None = Field(default=None, ge=1, description="The most requests the model can batch.")
    max_num_seqs_limit_source: str | None = None
    every_request_kv: str | None = Field(
        default=None, description="Set (why): the plan holds KV for max_num_seqs requests of max_model_len by "
        "default, since a preempted request cannot resume.")
    kv_rows_per_request: int = Field(
        default=1, ge=1, description="KV rows of max_model_len one user request takes (2: CFG's conditioned and "
        "unconditioned rows); max_num_seqs and the plan's headroom count rows.")
    kv_rows_source: str | None = None
    runner_hidden_size: int | None = Field(
        default=None, gt=0, description="The width of the model runner's inputs_embeds buffer, the hidden_size of "
        "the text config vLLM reads for this stage, where that is not transformer.hidden_size (a vocoder stage "
        "handed the talker's or thinker's config); the buffer is max_num_batched_tokens of it.")
    runner_hidden_source: str | None = None
    logits_every_token: str | None = Field(
        default=None, description="Set (why): the model computes its head's logits over every batched token, and "
        "keeps a copy, in the profile run and every prefill (MiMo-Audio), where vLLM's runner takes only the "
        "sampled rows.")
    whole_prefill: str | None = Field(
        default=None, description="Set (why): the model raises on a prefill split over steps, so chunked prefill "
        "must be off (and max_num_batched_tokens then at least max_model_len, vLLM's rule).")
    batch_rule: BatchRule | None = None
    defaults: dict[Schema, MemoryDefaults]
    deploy_fields: dict[str, Any] = Field(default_factory=dict, description="Non-memory keys of a deploy stage.")
    legacy_fields: dict[str, Any] = Field(default_factory=dict, description="Non-memory keys of a stage_args stage.")
    legacy_engine_args: dict[str, Any] = Field(default_factory=dict)
    legacy_runtime: dict[str, Any] = Field(default_factory=dict)
    legacy_overlays: list[LegacyOverlay] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> "StageSpec":
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {sorted(DTYPE_BYTES)}")
        for c in self.components:
            if c.dtype is not None and c.dtype not in DTYPE_BYTES:
                raise ValueError(f"component {c.name}: dtype {c.dtype!r} is not one of {sorted(DTYPE_BYTES)}")
        heads = self.transformer.num_heads
        for tp in self.tp_degrees:
            if tp < 1 or heads % tp:
                raise ValueError(f"tp_degrees: {tp} does not divide num_heads {heads}")
        if sorted(set(self.tp_degrees)) != self.tp_degrees:
            raise ValueError("tp_degrees must be ascending and distinct")
        for ev in self.tp_tested:
            if ev.tp not in self.tp_degrees:
                raise ValueError(f"tp_tested: {ev.tp} is not one of tp_degrees {self.tp_degrees}")
        for where, fields in (("deploy_fields", self.deploy_fields), ("deploy_fields.engine_extras",
                              self.deploy_fields.get("engine_extras") or {}), ("legacy_engine_args", self.legacy_engine_args),
                              ("legacy_runtime", self.legacy_runtime)):
            clash = sorted(set(fields) & set(PLANNED_KEYS))
            if clash:
                raise ValueError(f"{where}: {', '.join(clash)} is planned, not a catalog field")
        if (self.max_num_seqs_limit is None) != (self.max_num_seqs_limit_source is None):
            raise ValueError("max_num_seqs_limit and max_num_seqs_limit_source go together")
        if (self.runner_hidden_size is None) != (self.runner_hidden_source is None):
            raise ValueError("runner_hidden_size and runner_hidden_source go together")
        if (self.kv_rows_per_request > 1) != (self.kv_rows_source is not None):
            raise ValueError("kv_rows_per_request above 1 and kv_rows_source go together")
        if (self.role == "generation") != (self.generation_profile is not None):
            raise ValueError("generation_profile is required for generation stages and only for them")
        if (self.role == "diffusion") != (self.diffusion_profile is not None):
            raise ValueError("diffusion_profile is required for diffusion stages and only for them")
        return self

    @property
    def has_kv_cache(self) -> bool:
        return self.role == "autoregressive"

    def min_requests(self, max_num_seqs: int, asked: int | None = None) -> int:
        """KV rows of max_model_len the plan holds: --min-concurrency's rounded up to whole requests (CFG's pairs),
        else one request's rows, or every admitted request's where a preempted one cannot resume."""
        rows = self.kv_rows_per_request
        if asked is not None:
            return -(-asked // rows) * rows
        return max_num_seqs if self.every_request_kv else rows

    def rows_rule_error(self, max_num_seqs: int) -> str | None:
        """Why max_num_seqs breaks a request of several KV rows (None: it does not)."""
        rows = self.kv_rows_per_request
        if rows == 1 or max_num_seqs % rows == 0:
            return None
        return (f"max_num_seqs {max_num_seqs}: a request of {self.name} is {rows} KV rows decoded in one step "
                f"({self.kv_rows_source.strip()}), so max_num_seqs counts rows and must be a multiple of {rows}")

    @property
    def input_stage_ids(self) -> list[int]:
        """The stages this one reads from: the legacy engine_input_source, else the deploy
        file's input_connectors (from_stage_N), as vLLM-Omni's input_sources wire them."""
        legacy = self.legacy_fields.get("engine_input_source")
        if legacy:
            return [int(x) for x in legacy]
        keys = self.deploy_fields.get("input_connectors") or {}
        return sorted(int(k[len("from_stage_"):]) for k in keys
                      if k.startswith("from_stage_") and k[len("from_stage_"):].isdigit())

    def batch_rule_error(self, max_num_batched_tokens: int) -> str | None:
        """Why this stage cannot take `max_num_batched_tokens` (None: it can)."""
        rule = self.batch_rule
        if rule is None or (max_num_batched_tokens >= rule.minimum and max_num_batched_tokens % rule.multiple_of == 0):
            return None
        multiple = f"a multiple of {rule.multiple_of} and " if rule.multiple_of > 1 else ""
        return (f"{self.name}'s max_num_batched_tokens must be {multiple}at least {rule.minimum}, not "
                f"{max_num_batched_tokens} ({rule.source.strip()})")

    @property
    def bounded_by_fraction(self) -> bool:
        """Whether vLLM-Omni measures this stage against its gpu_memory_utilization at
        start-up (every stage but a dense diffusion one)."""
        return self.role != "diffusion"

    def default_max_model_len(self, schema: str) -> int:
        """The bundled config's max_model_len, else the model's positions (vLLM's default)."""
        d = self.defaults.get(schema)
        return (d.max_model_len if d is not None else None) or self.transformer.max_position

    def tested_tp_degrees(self, version: str) -> list[int]:
        """The TP degrees some upstream config or test of `version` runs this stage at."""
        return sorted({ev.tp for ev in self.tp_tested if in_range(version, ev.versions)})

    def tp_evidence(self, tp: int, version: str) -> list[str]:
        return [ev.source for ev in self.tp_tested if ev.tp == tp and in_range(version, ev.versions)]


class PipelineSpec(Strict):
    """A vLLM-Omni pipeline (one model)."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    hf_id: str
    description: str
    model_arch: str
    stages: list[StageSpec] = Field(min_length=1)
    deploy_top: dict[str, Any] = Field(default_factory=dict, description="Top-level keys of the deploy YAML.")
    legacy_top: dict[str, Any] = Field(default_factory=dict, description="Top-level keys besides stage_args.")
    legacy_versions: str | None = Field(
        pattern=VERSIONS_PATTERN,
        description="vLLM-Omni versions in which the legacy stage wiring (the functions its "
        "custom_process_input_func names) exists; null: no stage_args file serves this pipeline.",
    )
    legacy_versions_source: str = Field(min_length=1)
    deploy_versions: str = Field(
        default="0.20-", pattern=VERSIONS_PATTERN,
        description="vLLM-Omni versions whose deploy loader serves this pipeline (deploy/ exists from 0.20).",
    )
    deploy_versions_source: str | None = None
    deploy_top_overlays: list[DeployTopOverlay] = Field(default_factory=list)
    registry_key: str | None = Field(
        default=None, description="The key vLLM-Omni's pipeline registry resolves this model to (a file's "
        "`pipeline:` naming another is another topology, or none).")
    config: str | None = Field(default=None, description="The model's config.json shipped beside this file.")
    checkpoint_prefixes: dict[str, list[str]] = Field(
        default_factory=dict, description="Per stage, the tensor-name prefixes of its weights in the checkpoint."
    )
    checkpoint_subfolders: list[str] = Field(
        default_factory=list, description="Folders of the checkpoint with shards of their own (tensors named SUB/...).")
    sources: dict[str, str] = Field(default_factory=dict, description="Citations used by the fields.")
    frontend_gpu_bytes: int = Field(
        default=0, ge=0, description="What the API process itself loads on the first GPU once serving (a "
        "front-end encoder its input processor runs), outside every stage's fraction.")
    frontend_gpu_source: str | None = None

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


@lru_cache(maxsize=1)
def model_catalog() -> dict[str, PipelineSpec]:
    """Every shipped pipeline, keyed by name."""
    folder = resources.files("omni_autoconf.models")
    specs: dict[str, PipelineSpec] = {}
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".yaml"):
            spec = load_pipeline_text(entry.read_text(), entry.name)
            specs[spec.name] = spec
    return specs


def catalog_text(name: str) -> tuple[str, str]:
    """(text, file name) of a shipped catalog file, for re-reading it over another config."""
    folder = resources.files("omni_autoconf.models")
    for entry in folder.iterdir():
        if entry.name.endswith(".yaml") and load_pipeline_text(entry.read_text(), entry.name).name == name:
            return entry.read_text(), entry.name
    raise InputError(f"no catalog file for {name}")


def lookup_model(name: str) -> PipelineSpec:
    """A shipped pipeline by name (case-insensitive; `_` and `-` alike)."""
    key = name.strip().lower().replace("_", "-")
    catalog = model_catalog()
    if key not in catalog:
        raise InputError(f"unknown model {name!r}; known models: {', '.join(sorted(catalog))}")
    return catalog[key]


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

"""A catalog stage: what it loads, its geometry, the TP degrees it allows, the defaults of its
memory knobs and the non-memory fields each output schema writes (catalog.py assembles stages
into pipelines)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from ..vllm.facts import in_range
from .catalog_parts import (
    DTYPE_BYTES, PLANNED_KEYS, BatchRule, Component, DiffusionProfile, EncoderProfile, GenerationProfile,
    LegacyOverlay, MemoryDefaults, ServingOutside, Strict, TpEvidence, Transformer, VisionTower,
)

Schema = Literal["deploy", "stage-args"]
SCHEMAS: tuple[str, ...] = ("deploy", "stage-args")

class StageSpec(Strict):
    """One stage of a pipeline."""

    stage_id: int = Field(ge=0, description="0, 1, ... in order.")
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="The stage's role: thinker, talker, code2wav, ...")
    role: Literal["autoregressive", "generation", "diffusion"] = Field(
        description="autoregressive: vLLM attention with a KV cache; generation: no KV cache; diffusion: "
        "no KV cache, and its fraction bounds nothing (diffusion_profile)."
    )
    dtype: str = Field(description="dtype the weights are loaded in.")
    quantization: str | None = Field(default=None, description="A stage read from a quantized checkpoint's "
                                     "config.json: its quant_method (vLLM's `quantization` must match it).")
    linear_layers: str | None = Field(default=None, description="Set (why) where the components `linear` and "
                                      "`experts` are exactly vLLM's linear layers and routed experts (a one-stage LLM "
                                      "read from its config.json or safetensors): what quantization fp8 quantizes at "
                                      "load.")
    components: list[Component] = Field(min_length=1, description="What it loads, block by block.")
    transformer: Transformer = Field(description="The decoder's geometry (KV bytes, profile-run activations, buffers).")
    vision_tower: VisionTower | None = Field(default=None, description="A Qwen-VL tower the profile run encodes.")
    encoder_profile: EncoderProfile | None = Field(default=None, description="An estimate where no tower is derived.")
    generation_profile: GenerationProfile | None = Field(default=None, description="For a generation stage only.")
    diffusion_profile: DiffusionProfile | None = Field(default=None, description="For a diffusion stage only.")
    serving_outside: ServingOutside | None = Field(default=None, description="Serving memory outside its fraction.")
    tp_degrees: list[int] = Field(min_length=1, description="TP degrees vLLM accepts for this stage.")
    tp_tested: list[TpEvidence] = Field(
        min_length=1, description="The degrees upstream runs, with evidence: the only ones planned by default."
    )
    max_num_seqs_limit: int | None = Field(default=None, ge=1, description="The most requests the model can batch.")
    max_num_seqs_limit_source: str | None = Field(default=None, description="Why max_num_seqs_limit (with it).")
    every_request_kv: str | None = Field(
        default=None, description="Set (why): the plan holds KV for max_num_seqs requests of max_model_len by "
        "default, since a preempted request cannot resume.")
    kv_rows_per_request: int = Field(
        default=1, ge=1, description="KV rows of max_model_len one user request takes (2: CFG's conditioned and "
        "unconditioned rows); max_num_seqs and the plan's headroom count rows.")
    kv_rows_source: str | None = Field(default=None, description="Why kv_rows_per_request (with one above 1).")
    runner_hidden_size: int | None = Field(
        default=None, gt=0, description="The width of the model runner's inputs_embeds buffer, the hidden_size of "
        "the text config vLLM reads for this stage, where that is not transformer.hidden_size (a vocoder stage "
        "handed the talker's or thinker's config); the buffer is max_num_batched_tokens of it.")
    runner_hidden_source: str | None = Field(default=None, description="Why runner_hidden_size (with it).")
    logits_every_token: str | None = Field(
        default=None, description="Set (why): the model computes its head's logits over every batched token, and "
        "keeps a copy, in the profile run and every prefill (MiMo-Audio), where vLLM's runner takes only the "
        "sampled rows.")
    whole_prefill: str | None = Field(
        default=None, description="Set (why): the model raises on a prefill split over steps, so chunked prefill "
        "must be off (and max_num_batched_tokens then at least max_model_len, vLLM's rule).")
    batch_rule: BatchRule | None = Field(default=None, description="The model's own max_num_batched_tokens rule.")
    defaults: dict[Schema, MemoryDefaults] = Field(
        description="The memory knobs' defaults per schema: deploy, and stage-args unless legacy_versions is null.")
    deploy_fields: dict[str, Any] = Field(default_factory=dict, description="Non-memory keys of a deploy stage.")
    legacy_fields: dict[str, Any] = Field(default_factory=dict, description="Non-memory keys of a stage_args stage.")
    legacy_engine_args: dict[str, Any] = Field(
        default_factory=dict, description="Non-memory engine_args of a stage_args stage (worker_cls becomes "
        "worker_type where the version reads that).")
    legacy_runtime: dict[str, Any] = Field(default_factory=dict, description="Non-memory runtime keys of it.")
    legacy_overlays: list[LegacyOverlay] = Field(
        default_factory=list, description="engine_args only some versions' bundled files set.")

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

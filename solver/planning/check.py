"""`check`: will an existing stage config start, and how much KV does each stage get?

The file's stages are matched to the pipeline's, the fields it leaves out get vLLM's
defaults for that version and GPU, vLLM's own engine-config checks run per stage, and
then the start-up model (startup.py, the one the planner uses) walks the launch.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from functools import lru_cache

from ..errors import InputError
from ..inputs.catalog import PipelineSpec, StageSpec
from ..inputs.configfile import ConfigFile, StageSetting
from ..inputs.gpus import Gpu, refuses_bf16
from ..memory.stage_memory import StageKnobs, stage_memory, with_quantization
from ..startup.engine_checks import BF16_MESSAGE, engine_config_errors
from ..startup.launch import calibrated, exclusive_indices, launch, stage_run
from ..startup.problems import CheckProblem
from ..startup.residency import resident_sets
from ..startup.simulation import StartupReport
from ..vllm import facts as F
from ..vllm.facts import SCHEMA_VERSIONS, OmniVersion

UTIL_RESOLUTION = 10**6  # a file's gpu_memory_utilization, read to 6 decimals


@dataclass(frozen=True)
class ResolvedSetting:
    """A stage's setting with vLLM's defaults filled in."""

    spec: StageSpec
    devices: tuple[int, ...]
    tensor_parallel_size: int
    gpu_memory_utilization: float
    knobs: StageKnobs
    kv_cache_dtype: str  # as the file says it (checked against vLLM's list)
    chunked_prefill: bool
    explicit_devices: bool
    explicit_tp: bool
    kv_pinned_bytes: int | None = None
    replicas: int = 1
    layout_error: str | None = None  # vLLM-Omni's own message when it cannot split the devices
    dtype: str | None = None  # as the file says it (None: auto)
    sequence_parallel: int = 1  # a diffusion stage's sequence-parallel ranks per TP rank

    @property
    def ranks(self) -> int:
        """GPUs one replica runs on: its TP ranks times its sequence-parallel ranks."""
        return self.tensor_parallel_size * self.sequence_parallel


@dataclass(frozen=True)
class CheckReport:
    config: ConfigFile
    version: OmniVersion
    upstream: bool
    parallel_init: bool
    settings: tuple[ResolvedSetting, ...]
    startup: StartupReport
    problems: tuple[CheckProblem, ...]  # file-level, layout and engine problems, then start-up ones

    @property
    def stages(self):
        return self.startup.stages

    @property
    def gpus(self):
        return self.startup.gpus

    @property
    def errors(self) -> tuple[CheckProblem, ...]:
        return tuple(p for p in self.problems if p.severity == "error")

    @property
    def ok(self) -> bool:
        return not self.errors


def resolve_settings(pipeline: PipelineSpec, config: ConfigFile, version: OmniVersion,
                     gpus: list[Gpu]) -> list[ResolvedSetting]:
    """Match the file's stages to the pipeline's and fill what the file leaves out."""
    by_id: dict[int, StageSetting] = {}
    for st in config.stages:
        if st.stage_id in by_id:
            raise InputError(f"{config.path}: stage_id {st.stage_id} appears twice")
        if not 0 <= st.stage_id < len(pipeline.stages):
            raise InputError(f"{config.path}: stage_id {st.stage_id} is not a stage of {pipeline.name}")
        by_id[st.stage_id] = st
    out = []
    for spec in pipeline.stages:
        st = by_id.get(spec.stage_id)
        if st is None:
            raise InputError(f"{config.path}: no stage {spec.stage_id} ({spec.name}) for {pipeline.name}")
        tp = st.tensor_parallel_size or 1
        replicas = st.num_replicas or 1
        try:  # a quantization vLLM refuses, or one the model cannot tell, is refused naming the file
            with_quantization(spec, st.quantization, version.vllm)
        except InputError as exc:
            raise InputError(f"{config.path}: stage {spec.stage_id} {exc}") from None
        if st.sequence_parallel > 1 and spec.role != "diffusion":
            raise InputError(f"{config.path}: stage {spec.stage_id} ({spec.name}) sets sequence parallelism, which only "
                             "a diffusion stage runs")
        devices, layout_error = split_replicas(st.devices, replicas, tp * st.sequence_parallel, spec.stage_id, version)
        util = st.gpu_memory_utilization
        if util is None:  # a diffusion stage without one declares nothing (its runtime reads none)
            util = F.default_gpu_memory_utilization(version.vllm) if spec.bounded_by_fraction else 0.0
        # A file that leaves it out gets vLLM's default: on for decoder models
        # (vllm/engine/arg_utils.py _set_default_chunked_prefill_and_prefix_caching_args).
        chunked = True if st.enable_chunked_prefill is None else st.enable_chunked_prefill
        mml = st.max_model_len or spec.transformer.max_position
        first = gpus[devices[0]] if devices and 0 <= devices[0] < len(gpus) else gpus[0]
        asked = st.max_num_seqs
        if asked is None and not spec.bounded_by_fraction:
            asked = F.DIFFUSION_DEFAULT_MAX_NUM_SEQS
        seqs, tokens = F.default_batch(version.vllm, first.name, first.total_bytes, mml, chunked,
                                       asked, st.max_num_batched_tokens)
        kv_text = st.kv_cache_dtype or "auto"
        # DeployConfig async_chunk defaults to True; the legacy loader's to False
        streaming = config.async_chunk if config.async_chunk is not None else config.schema == "deploy"
        knobs = StageKnobs(
            max_model_len=mml,
            max_num_seqs=seqs,
            max_num_batched_tokens=tokens,
            enforce_eager=bool(st.enforce_eager),
            kv_cache_dtype="fp8" if kv_text.startswith("fp8") else "auto",
            async_chunk=streaming,
            # vllm 0.30.0 config/vllm.py: some KV connectors (LMCache, FlexKV, HF3FS, ...) turn it off
            hybrid_kv=False if st.disable_hybrid_kv_cache_manager else (None if st.kv_transfer_config else True),
            prefix_caching=True if st.enable_prefix_caching is None else st.enable_prefix_caching,
            mamba_dtypes=(st.mamba_cache_dtype, st.mamba_ssm_cache_dtype),
            dtype=None if st.dtype in (None, "auto") else st.dtype,
            quantization=st.quantization,
            kv_skip_layers=st.kv_skip_layers,
        )
        out.append(ResolvedSetting(spec, devices, tp, util, knobs, kv_text, chunked,
                                   st.devices is not None, st.tensor_parallel_size is not None,
                                   st.kv_cache_memory_bytes if spec.has_kv_cache else None, replicas, layout_error,
                                   st.dtype, st.sequence_parallel))
    return out


def split_replicas(devices: tuple[int, ...] | None, replicas: int, tp: int, stage_id: int,
                   version: OmniVersion) -> tuple[tuple[int, ...], str | None]:
    """The device pool of a stage's replicas as vLLM-Omni splits it (replica r takes a
    consecutive slice of tp ids), and its error message when it cannot. vllm_omni
    engine/stage_init_utils.py split_devices_for_replicas: 0.20 pool only (R x tp ids);
    0.22+ also a template of tp ids that replica r offsets by r x tp. `devices` None: the
    file gives none (a stage of one replica then runs on GPUs 0..tp-1)."""
    if devices is None and replicas > 1:
        if not version.replicas_without_devices:
            return tuple(range(tp)), (f"Stage {stage_id}: num_replicas={replicas} without devices: vLLM-Omni "
                                      f"{version.name} fails to start it (one device slot for {replicas} replicas)")
        return tuple(range(tp)), (f"Stage {stage_id}: num_replicas={replicas} without devices: every replica "
                                  f"would run on GPUs 0..{tp - 1} together; give the pool of devices")
    if devices is None:
        devices = tuple(range(tp))
    if replicas <= 1:
        return devices, None
    if not version.has_replicas:
        return devices, f"Stage {stage_id}: num_replicas is read from vLLM-Omni 0.20; {version.name} runs one replica"
    shown = ",".join(map(str, devices))
    if len(devices) == replicas * tp:
        return devices, None
    if version.replica_template_devices and len(devices) == tp:
        bad = [a for a in devices if not 0 <= a < tp]
        if bad:
            return devices, (f"Stage {stage_id}: template-mode device offset(s) {bad} out of range [0, {tp}); "
                             f"devices={shown!r}")
        return tuple(r * tp + a for r in range(replicas) for a in devices), None
    if not version.replica_template_devices:
        return devices, (f"Stage {stage_id}: num_replicas={replicas}, tensor_parallel_size={tp} requires "
                         f"{replicas * tp} devices, got {len(devices)}: {shown}")
    if version.replica_split_wording == "tp":
        return devices, (f"Stage {stage_id}: devices={shown!r} has {len(devices)} id(s); need either {tp} (template, "
                         f"dp-independent) or {replicas * tp} (pool / legacy). num_replicas={replicas}, "
                         f"tensor_parallel_size={tp}.")
    return devices, (f"Stage {stage_id}: devices={shown!r} has {len(devices)} id(s); need either {tp} (per-replica "
                     f"template) or {replicas * tp} (pool / legacy). num_replicas={replicas}, "
                     f"devices_per_replica={tp}.")


def _layout_problems(rs: ResolvedSetting, num_gpus: int) -> list[CheckProblem]:
    name, tp, devices = rs.spec.name, rs.tensor_parallel_size, rs.devices
    ranks = rs.ranks
    found = []
    if rs.layout_error:
        found.append(CheckProblem("device-layout-invalid", name, None, rs.layout_error, {}))
        return found
    bad = [d for d in devices if not 0 <= d < num_gpus]
    if bad:
        found.append(CheckProblem("unknown-device", name, bad[0],
                                  f"{name}: devices {','.join(map(str, devices))} name GPU {bad[0]}, "
                                  f"but only GPUs 0..{num_gpus - 1} exist", {"device": bad[0], "num_gpus": num_gpus}))
    if len(devices) != ranks * rs.replicas or len(set(devices)) != len(devices):
        found.append(CheckProblem("tp-mismatch", name, None,
                                  f"{name}: {len(devices)} device(s) {','.join(map(str, devices))} for "
                                  f"tensor_parallel_size {tp}" + (f" x sequence parallelism {rs.sequence_parallel}"
                                                                  if rs.sequence_parallel > 1 else "")
                                  + " (vLLM needs one distinct GPU per rank)",
                                  {"devices": len(devices), "tensor_parallel_size": tp}))
    heads = rs.spec.transformer.num_heads
    if heads % tp:
        # vllm/config/model.py verify_with_parallel_config (0.14.1-0.30.0)
        found.append(CheckProblem("tp-not-divisible", name, None,
                                  f"Total number of attention heads ({heads}) must be divisible by tensor "
                                  f"parallel size ({tp}).", {"num_heads": heads, "tensor_parallel_size": tp}))
    return found


def _engine_problems(rs: ResolvedSetting, version: OmniVersion) -> list[CheckProblem]:
    k = rs.knobs
    errors = engine_config_errors(max_model_len=k.max_model_len, max_num_seqs=k.max_num_seqs,
                                  max_num_batched_tokens=k.max_num_batched_tokens, chunked_prefill=rs.chunked_prefill,
                                  kv_cache_dtype=rs.kv_cache_dtype, version=version)
    found = [CheckProblem("engine-config-invalid", rs.spec.name, None, e, {}) for e in errors]
    limit = rs.spec.max_num_seqs_limit
    if limit is not None and k.max_num_seqs > limit:  # the model raises in its __init__
        found.append(CheckProblem("engine-config-invalid", rs.spec.name, None,
                                  f"max_num_seqs {k.max_num_seqs}: {rs.spec.name} batches at most {limit} request(s) "
                                  f"({rs.spec.max_num_seqs_limit_source})", {}))
    rule = rs.spec.batch_rule_error(k.max_num_batched_tokens)
    if rule is not None:  # the model's own requirement: it starts, and its chunks break
        found.append(CheckProblem("stage-batch-rule", rs.spec.name, None, rule, {}))
    if rs.spec.whole_prefill and rs.chunked_prefill:  # it starts; a prompt that overflows a step is then refused
        found.append(CheckProblem("stage-batch-rule", rs.spec.name, None,
                                  f"chunked prefill is on: a prompt that overflows a step's budget ({k.max_num_batched_tokens} "
                                  f"tokens, shared by the requests in it) is split over steps, which {rs.spec.name} "
                                  f"refuses ({rs.spec.whole_prefill.strip()})", {}))
    rows = rs.spec.rows_rule_error(k.max_num_seqs)
    if rows is not None:  # it starts; below one request's rows none completes, else a row waits
        found.append(CheckProblem("cfg-rows-unpaired" if k.max_num_seqs < rs.spec.kv_rows_per_request
                                  else "stage-batch-rule", rs.spec.name, None, rows, {}))
    if rs.spec.has_kv_cache and k.max_model_len > rs.spec.transformer.max_position:
        # vllm/config/model.py _get_and_verify_max_len (0.14.1-0.30.0). vLLM-Omni 0.20+
        # sets VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 for a stage with max_model_len
        # (vllm_omni/engine/stage_init_utils.py), which makes it a warning.
        text = (f"User-specified max_model_len ({k.max_model_len}) is greater than the derived max_model_len "
                f"(max_position_embeddings={rs.spec.transformer.max_position}); positions beyond it give NaN")
        code = "beyond-max-position" if version.vllm >= (0, 20) else "engine-config-invalid"
        found.append(CheckProblem(code, rs.spec.name, None, text, {}))
    return found


KEYS_FALLBACK = "0.30"  # the version whose keys stand for those solver/data/stage_keys.yaml does not list


@lru_cache(maxsize=None)
def known_keys(version: str) -> tuple[str, dict[str, frozenset[str]]]:
    """The keys vLLM-Omni `version` reads (solver/data/stage_keys.yaml, derived from the wheels)
    and the version they were read from."""
    from importlib import resources

    import yaml

    data = yaml.safe_load(resources.files("omni_autoconf.data").joinpath("stage_keys.yaml").read_text())["versions"]
    found = version if version in data else KEYS_FALLBACK
    return found, {part: frozenset(names) for part, names in data[found].items()}


def unknown_keys(config: ConfigFile, version: OmniVersion) -> list[tuple[int | None, str, int | None, str]]:
    """(stage_id, None at the top level; the key as written; its line; the closest known key) for
    each key vLLM-Omni does not read: 0.30 hands a stage's unknown keys to OmniEngineArgs, which
    drops them with a warning (vllm-omni 0.30.0 wheel, config/stage_config.py _parse_stage_deploy,
    entrypoints/utils.py filter_dataclass_kwargs), and never reads unknown top-level keys."""
    _, keys = known_keys(version.name)
    stage = keys["stage"] | keys["engine_args"] | keys["diffusion"]
    out = [(None, k, line, _closest(k, keys["top_level"])) for k, line in config.top_keys if k not in keys["top_level"]]
    for st in config.stages:
        out += [(st.stage_id, f"{section}.{k}" if section else k, line or st.line, _closest(k, stage))
                for section, k, line in st.keys if k not in stage]
    return out


def _closest(key: str, known: frozenset[str]) -> str | None:
    """The known key nearest to `key` (difflib's default 0.6 similarity), or None: no guess."""
    found = difflib.get_close_matches(key, sorted(known), n=1)
    return found[0] if found else None


def _key_problems(pipeline: PipelineSpec, config: ConfigFile, version: OmniVersion) -> list[CheckProblem]:
    source, _ = known_keys(version.name)
    note = "" if source == version.name else f" (the keys of {source}: {version.name}'s were not derived)"
    found = []
    for sid, key, line, closest in unknown_keys(config, version):
        name = pipeline.stages[sid].name if sid is not None and 0 <= sid < len(pipeline.stages) else None
        where = f"stage {sid} ({name})" if name else "the top level"
        found.append(CheckProblem("unknown-key", name, None,
                                  f"{key}: vLLM-Omni {version.name} reads no such key in {where} and drops it, so it "
                                  f"runs as if absent{f'; did you mean {closest}?' if closest else ''}{note}", {},
                                  line))
    return found


def _declared_sum_problems(runs: list, gpus: list[Gpu], pipeline: PipelineSpec, exclusive, version: OmniVersion,
                           upstream: bool, defaulted: set[int]) -> list[CheckProblem]:
    """Declared fractions past 1.0 on one GPU, per co-resident set (vllm_omni 0.30.0
    engine/stage_admission.py refuses them with parallel_stage_init; a sequential start caps or
    refuses the later stage at its snapshot: worker/memory_utils.py request_memory_tolerant)."""
    found = []
    for gpu in gpus:
        on = max(([r for r in (runs[i] for i in members) if gpu.index in r.devices and r.util_steps]
                  for members in resident_sets(len(runs), exclusive_indices(pipeline, exclusive))),
                 key=lambda rs: sum(r.util_steps for r in rs), default=[])
        total = sum(r.util_steps for r in on)
        if total <= UTIL_RESOLUTION:
            continue
        later = ("upstream vLLM refuses a later stage whose request is not free at its snapshot" if upstream else
                 f"vLLM-Omni {version.name} caps a later stage's request to the free memory (less than it declares)")
        found.append(CheckProblem(
            "declared-sum-over-one", None, gpu.index,
            f"{gpu.name}: the stages' gpu_memory_utilization sums to {total / UTIL_RESOLUTION:g} > 1.0 ("
            + ", ".join(f"{r.name} {r.util_steps / UTIL_RESOLUTION:g}" + (" (vLLM's default)" if r.stage_id in defaulted
                                                                           else "") for r in on) + "); vLLM-Omni's "
            "parallel_stage_init admission (0.30+, --parallel-init) refuses this launch; started one after another, "
            + later, {"sum": total / UTIL_RESOLUTION}))
    return found


def _with_lines(problems: list[CheckProblem], pipeline: PipelineSpec, config: ConfigFile) -> tuple[CheckProblem, ...]:
    """Each problem of a stage with the line of its entry in the file (unless it has a line)."""
    lines = {}
    for st in config.stages:
        if 0 <= st.stage_id < len(pipeline.stages):
            lines[pipeline.stages[st.stage_id].name] = lines[f"stage{st.stage_id}"] = st.line
    return tuple(p if p.line is not None or p.stage not in lines else replace(p, line=lines[p.stage]) for p in problems)


def check_config(pipeline: PipelineSpec, gpus: list[Gpu], version: OmniVersion, config: ConfigFile, *,
                 upstream: bool | None = None, parallel_init: bool = False, buffer_bytes: int = 0,
                 exclusive: tuple[tuple[str, ...], ...] = (), calibration=None) -> CheckReport:
    """Predict the start-up of `config` on `gpus` and report every problem.

    `upstream`: True for upstream vLLM's refusal, False for vLLM-Omni's capping; None
    follows the version (capping from vLLM-Omni 0.24)."""
    if upstream is None:
        upstream = not version.caps_to_free_memory
    problems: list[CheckProblem] = []
    if not version.reads(config.schema):
        problems.append(CheckProblem(
            "schema-unsupported", None, None,
            f"vLLM-Omni {version.name} does not read {config.schema} files (read by {SCHEMA_VERSIONS[config.schema]})"))
    expected = (pipeline.deploy_top_at(version.name).get("pipeline") or pipeline.registry_key
                if config.schema == "deploy" else None)
    if config.pipeline is not None and expected is not None and config.pipeline != expected:
        # vllm_omni config_factory.py _get_deploy_override_pipe_config: an unregistered key raises
        problems.append(CheckProblem(
            "pipeline-key-mismatch", None, None,
            f"the file names pipeline {config.pipeline!r}; vLLM-Omni {version.name} serves {pipeline.name} as "
            f"{expected!r} (a key its registry lacks raises KeyError at start-up, another key picks another topology)",
            {}))
    required = pipeline.deploy_top.get("pipeline") if config.schema == "deploy" else None
    if required is not None and config.pipeline is None:
        problems.append(CheckProblem(
            "pipeline-key-mismatch", None, None,
            f"the file names no pipeline; {pipeline.name} runs as pipeline {required!r}, which vLLM-Omni starts only "
            "when a deploy file names it (else the model's default topology)", {}))
    settings = resolve_settings(pipeline, config, version, gpus)
    problems += _key_problems(pipeline, config, version)
    runs = []
    for rs in settings:
        layout = _layout_problems(rs, len(gpus))
        problems += layout + _engine_problems(rs, version)
        if rs.dtype == "bfloat16" and not layout:
            problems += [CheckProblem("engine-config-invalid", rs.spec.name, d, BF16_MESSAGE.format(gpu=gpus[d].name), {})
                         for d in rs.devices if refuses_bf16(gpus[d])][:1]
        memory = None if layout else stage_memory(rs.spec, rs.tensor_parallel_size, rs.knobs, version,
                                                  rs.sequence_parallel)
        memory = calibrated(calibration, pipeline, rs.spec.name, rs.tensor_parallel_size, memory)
        steps = round(rs.gpu_memory_utilization * UTIL_RESOLUTION)
        runs.append(stage_run(rs.spec, version, rs.devices, rs.tensor_parallel_size, steps, UTIL_RESOLUTION, rs.knobs,
                              memory, kv_pinned_bytes=rs.kv_pinned_bytes, replicas=rs.replicas,
                              sequence_parallel=rs.sequence_parallel))
    problems += _declared_sum_problems(runs, gpus, pipeline, exclusive, version, upstream,
                                       {st.stage_id for st in config.stages if st.gpu_memory_utilization is None})
    startup = launch(pipeline, runs, gpus, upstream=upstream, parallel_init=parallel_init, buffer_bytes=buffer_bytes,
                     exclusive=exclusive)
    for outcome in startup.stages:  # a CFG request's rows must all fit the cache at once
        rows = pipeline.stage(outcome.run.name).kv_rows_per_request
        if outcome.run.has_kv and outcome.started and rows > 1 \
                and outcome.kv_cache_tokens < rows * outcome.run.knobs.max_model_len:
            problems.append(CheckProblem(
                "cfg-rows-unpaired", outcome.run.name, None,
                f"its KV cache holds {outcome.kv_cache_tokens} tokens, fewer than the {rows} rows of "
                f"{outcome.run.knobs.max_model_len} one request takes: it starts, and a full-length request never "
                "completes", {"kv_cache_tokens": outcome.kv_cache_tokens}))
    return CheckReport(config, version, upstream, parallel_init, tuple(settings), startup,
                       _with_lines(problems + list(startup.problems), pipeline, config))

"""The request a plan answers, resolved: the pipeline spec, the GPU list, the version and every
option as the planner reads it; and the command line that re-creates it (written into every
plan's header and into each proven fix)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from .. import defaults as D
from ..inputs.catalog import PipelineSpec
from ..inputs.gpus import Gpu, node_names
from ..memory.calibration import Calibration
from ..memory.stage_memory import KvCacheDtype
from ..startup.admission import margin_bytes
from ..errors import InputError
from ..vllm.facts import SCHEMA_VERSIONS, GiB, OmniVersion, range_text


@dataclass(frozen=True)
class Request:
    """Everything a plan depends on. Per-stage maps are keyed by stage name."""

    pipeline: PipelineSpec
    gpus: tuple[Gpu, ...]
    version: OmniVersion
    schema: str
    # the patch release --omni-version named ("0.30.7"), planned as `version` (0.30); None for X.Y
    omni_version_given: str | None = None
    model_ref: str | None = None  # what --model named (a catalog name, a directory, a Hub id)
    model_notes: tuple[str, ...] = ()  # what reading the checkpoint found worth saying
    buffer_gib: float = D.DEFAULT_BUFFER_GIB
    resolution: int = D.DEFAULT_RESOLUTION
    tp: dict[str, int] = field(default_factory=dict)
    devices: dict[str, tuple[int, ...]] = field(default_factory=dict)
    max_model_len: dict[str, int] = field(default_factory=dict)
    max_num_seqs: dict[str, int] = field(default_factory=dict)
    max_num_batched_tokens: dict[str, int] = field(default_factory=dict)
    enforce_eager: dict[str, bool] = field(default_factory=dict)
    dtype: dict[str, str] = field(default_factory=dict)  # --dtype per stage (a VLLM_DTYPES name)
    quantization: dict[str, str] = field(default_factory=dict)  # --quantization per stage
    min_concurrency: dict[str, int] = field(default_factory=dict)
    weight: dict[str, float] = field(default_factory=dict)
    exclusive: tuple[tuple[str, ...], ...] = ()
    kv_cache_dtype: KvCacheDtype = "auto"
    # Options given for every stage (`--max-num-batched-tokens 8192`): each applies to the
    # stages where vLLM and the model accept it; a per-stage value above wins.
    global_values: dict[str, int] = field(default_factory=dict)
    allow_untested_tp: bool = False
    pin_kv: bool = False  # write kv_cache_memory_bytes: vLLM then skips its own KV sizing
    # Replicas per stage: "1" (one copy of each stage), "auto" (the solver chooses per stage),
    # a number N (every stage N times: N whole pipelines), or None: "auto" where the version
    # runs replicas (0.20+), else "1". A replica that adds no headroom is never planned.
    replicas: str | None = None
    calibration: Calibration | None = None  # measured from a start-up log (`calibrate`)
    time_limit_s: float = D.DEFAULT_TIME_LIMIT_S
    workers: int | None = None  # CP-SAT workers; None: defaults.default_workers()

    @property
    def buffer_bytes(self) -> int:
        return int(self.buffer_gib * GiB)

    @property
    def margin_bytes(self) -> int:
        """Kept free on each GPU once all stages are up (admission reserve + buffer)."""
        return margin_bytes(self.buffer_bytes)



def command_line(request: Request) -> str:
    """The options that reproduce `request` (without the program name). Floats are written
    in their shortest exact form, so the command re-creates the same request."""
    r = request
    parts = [inventory_options(r.gpus), f"--model {shlex.quote(r.model_ref or r.pipeline.name)}",
             f"--omni-version {shlex.quote(r.omni_version_given or r.version.name)}"]
    if r.schema != r.version.schema:
        parts.append(f"--schema {r.schema}")
    for flag, mapping in (
        ("--tp", r.tp),
        ("--max-model-len", r.max_model_len),
        ("--max-num-seqs", r.max_num_seqs),
        ("--max-num-batched-tokens", r.max_num_batched_tokens),
        ("--min-concurrency", r.min_concurrency),
        ("--weight", r.weight),
    ):
        option = flag[2:].replace("-", "_")
        terms = [number_text(r.global_values[option])] if option in r.global_values else []
        terms += [f"{k}={number_text(v)}" for k, v in sorted(mapping.items())]
        if terms:
            parts.append(f"{flag} " + ",".join(terms))
    if r.dtype:
        parts.append("--dtype " + ",".join(f"{k}={v}" for k, v in sorted(r.dtype.items())))
    if r.quantization:
        parts.append("--quantization " + ",".join(f"{k}={v}" for k, v in sorted(r.quantization.items())))
    if r.enforce_eager:
        parts.append("--enforce-eager " + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(r.enforce_eager.items())))
    for name, devices in sorted(r.devices.items()):
        parts.append(f"--devices {name}={','.join(map(str, devices))}")
    for group in r.exclusive:
        parts.append("--exclusive " + ",".join(group))
    if r.kv_cache_dtype != "auto":
        parts.append(f"--kv-cache-dtype {r.kv_cache_dtype}")
    if r.allow_untested_tp:
        parts.append("--allow-untested-tp")
    if r.replicas is not None:
        parts.append(f"--replicas {r.replicas}")
    if r.pin_kv:
        parts.append("--pin-kv")
    if r.calibration is not None:
        parts.append(f"--calibration {shlex.quote(r.calibration.path)}")
    if r.buffer_gib != D.DEFAULT_BUFFER_GIB:
        parts.append(f"--buffer {number_text(r.buffer_gib)}")
    if r.resolution != D.DEFAULT_RESOLUTION:
        parts.append(f"--resolution {number_text(1 / r.resolution)}")
    return " ".join(parts)


def given_version(text: str | None) -> str | None:
    """What Request.omni_version_given records for an --omni-version value that
    vllm.facts.omni_version accepted: a patch release ("0.30.7" for "v0.30.7"), else None, so
    that a plain X.Y (or none) leaves every output as it was."""
    if text is None:
        return None
    name = text.strip().lstrip("vV")
    return name if name.count(".") >= 2 or not name.replace(".", "").isdigit() else None


def number_text(v: float) -> str:
    """Integers as such; other floats by repr(), which reads back as the same float."""
    if isinstance(v, int) or float(v).is_integer():
        return str(int(v))
    return repr(float(v))


def inventory_options(gpus) -> str:
    """`--gpus ...` (and `--nodes N`) that re-create an inventory of one or more hosts."""
    hosts = node_names(gpus)
    if len(hosts) == 1:
        return f"--gpus {gpu_terms(gpus)}"
    per_host = [gpu_terms([g for g in gpus if g.node == h]) for h in hosts]
    if hosts == [f"node{i}" for i in range(len(hosts))] and len(set(per_host)) == 1:
        return f"--nodes {len(hosts)} --gpus {per_host[0]}"
    return "--gpus " + shlex.quote(";".join(f"{h}={t}" for h, t in zip(hosts, per_host)))


def gpu_terms(gpus) -> str:
    """`2xH100-80GB,1xA100-40GB` for a GPU list (consecutive equal names grouped)."""
    terms: list[list] = []
    for gpu in gpus:
        if terms and terms[-1][1] == gpu.name:
            terms[-1][0] += 1
        else:
            terms.append([1, gpu.name])
    return ",".join(f"{n}x{name}" for n, name in terms)


def ensure_renderable(request: Request) -> None:
    """Refuse (InputError, exit 2) a schema the chosen version's loader does not read, and
    a legacy file whose stage wiring names functions that version no longer has."""
    v, schema, pipeline = request.version, request.schema, request.pipeline
    if not v.reads(schema):
        raise InputError(
            f"vLLM-Omni {v.name} does not read the {schema} schema (it is read by vLLM-Omni "
            f"{range_text(SCHEMA_VERSIONS[schema])}); choose --schema {'deploy' if schema == 'stage-args' else 'stage-args'}"
            " or another --omni-version"
        )
    hosts = node_names(request.gpus)
    if len(hosts) > 1 and not v.multi_host:
        raise InputError(
            f"a plan over {len(hosts)} hosts is written for vLLM-Omni 0.26+: there each host runs its stages "
            "headless (--stage-id, --omni-dp-size-local) against the head with the file's connectors; 0.22 and 0.24 "
            "headless stages ignore the connectors (run_headless passes async_chunk=False to "
            "get_stage_connector_spec, vllm_omni/entrypoints/cli/serve.py), 0.20's single-stage mode runs no LLM "
            "replicas and 0.18 has no headless mode. Plan one host per pipeline for older versions")
    if len(hosts) > 1 and not all(st.bounded_by_fraction for st in pipeline.stages):
        raise InputError(
            f"a plan of {pipeline.name} over {len(hosts)} hosts is not written: a diffusion stage (its dense runtime, "
            "and BAGEL's KV received from the thinker) is not modelled across hosts; plan one host")
    if len(hosts) > 1 and schema != "deploy":
        raise InputError(f"a plan over {len(hosts)} hosts is written in the deploy schema: use --schema deploy")
    reason = pipeline.unserved_reason(schema, v.name)
    if reason is not None:
        raise InputError(reason)

"""The options of a request, from text to values: one parser for the command line and the
Python API (`omni_autoconf.Request`), so both accept the same values and refuse the rest with
the same one-line messages. Each error names the option it concerns (`OptionError.field`).

Values arrive as the command line gives them: one string per option (`"2xH100-80GB"`), a
tuple of strings for options that may repeat (`("thinker=2", "talker=1")`), or a bool for a
flag. `resolve_request` turns them into the planner's Request.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

from .. import defaults as D
from ..errors import InputError
from ..vllm.facts import NEWEST_OMNI_VERSION
from .request import Request, ensure_renderable, given_version

T = TypeVar("T")

# ASCII only: Python's int() and float() also accept full-width and other Unicode digits.
_INT = re.compile(r"[+-]?[0-9]{1,12}")
_FLOAT = re.compile(r"[+-]?([0-9]{1,12}(\.[0-9]{0,17})?|\.[0-9]{1,17})([eE][+-]?[0-9]{1,3})?")

# Bounds of the per-stage options (the CLI's long option names).
LIMITS = {
    "tp": (1, 64),
    "max-model-len": (16, 10_000_000),
    "max-num-seqs": (1, 65_536),
    "max-num-batched-tokens": (1, 10_000_000),
    "min-concurrency": (1, 100_000),
    "weight": (0.01, 100.0),
}


class OptionError(InputError):
    """An invalid option value; `field` is its name in the Python API (the CLI's long option
    with underscores; None when no one option is at fault)."""

    def __init__(self, field: str | None, message: str):
        super().__init__(message)
        self.field = field


_FLAG = re.compile(r"--([a-z][a-z-]*)")


@contextmanager
def option(field: str | None) -> Iterator[None]:
    """Errors raised inside are about `field` (None: about the option the message starts with,
    if any: the planner's checks across options name the one they refuse)."""
    try:
        yield
    except OptionError:
        raise
    except InputError as exc:
        flag = _FLAG.match(str(exc))
        raise OptionError(field or (flag.group(1).replace("-", "_") if flag else None), str(exc)) from None


def validate_request(request: Request) -> None:
    """The planner's checks of a request across its options (TP and devices against the GPUs
    and the model, knobs against each stage), run before any solver: what the command line
    refuses before it plans."""
    from .planner import build_problem

    with option(None):
        ensure_renderable(request)
        build_problem(request)


def parse_int(text: str, what: str) -> int:
    if not _INT.fullmatch(text.strip()):
        if re.fullmatch(r"[+-]?[0-9]+", text.strip()):  # ASCII digits, too many of them to be a count
            raise InputError(f"{what}: {text.strip()} is out of range")
        raise InputError(f"{what}: {text!r} is not a whole number")
    return int(text.strip())


def parse_float(text: str, what: str) -> float:
    if not _FLOAT.fullmatch(text.strip()):
        raise InputError(f"{what}: {text!r} is not a number")
    value = float(text.strip())
    if value != value or value in (float("inf"), float("-inf")):
        raise InputError(f"{what}: {text!r} is not a finite number")
    return value + 0.0  # -0.0 -> 0.0; the range check says what a negative value may not be


def bounded(value: T, lo, hi, what: str) -> T:
    if not lo <= value <= hi:
        raise InputError(f"{what}: {value} is out of range [{lo}, {hi}]")
    return value


def per_stage(option_name: str, values: tuple[str, ...], pipeline, cast: Callable[[str, str], T], limits, *,
              kv_only: bool = False, allow_global: bool = True) -> tuple[dict[str, T], T | None]:
    """Parse `N` (every stage) and `STAGE=N` terms (STAGE: name or id), joined by commas or
    given as repeated options, into ({stage name: value}, global value or None).

    A stage given twice, or two global values, is a conflict (an error, not last-wins)."""
    what = f"--{option_name}"
    out: dict[str, T] = {}
    everything: T | None = None
    for text in values:
        for term in text.split(","):
            term = term.strip()
            if not term:
                raise InputError(f"{what}: empty term in {text!r}")
            key, sep, raw = term.rpartition("=")
            value = cast(raw, what) if limits is None else bounded(cast(raw, what), *limits, what)
            if sep:
                stage = pipeline.stage(key.strip())
                if kv_only and not stage.has_kv_cache:
                    raise InputError(f"{what} {term}: {stage.name} has no KV cache, so it has no {option_name}")
                if stage.name in out:
                    raise InputError(f"{what}: {stage.name} is given twice ({out[stage.name]} and {value})")
                out[stage.name] = value
            elif not allow_global:
                raise InputError(f"{what}: expected STAGE=VALUE, got {term!r}")
            elif everything is not None:
                raise InputError(f"{what}: given twice for every stage ({everything} and {value})")
            else:
                everything = value
    return out, everything


def expand_global(values: dict[str, T], everything: T | None, pipeline, *, kv_only: bool) -> dict[str, T]:
    """A global value set on every (KV) stage that has no value of its own."""
    out = dict(values)
    if everything is not None:
        for st in pipeline.stages:
            if st.has_kv_cache or not kv_only:
                out.setdefault(st.name, everything)
    return out


def gpus_option(text: str, nodes: int | None = None, hosts: bool = True):
    """The inventory of --gpus (and --nodes); `hosts=False` for commands that judge one host."""
    from ..inputs.gpus import node_names, parse_inventory

    if text.strip().lower() == "local":
        if nodes is not None:
            raise InputError("--gpus local reads this host only; with --nodes name the GPUs of one host")
        from ..inputs.nvml import read_local_gpus

        return tuple(read_local_gpus())
    gpus = tuple(parse_inventory(text, nodes))
    if not hosts and len(node_names(gpus)) > 1:
        raise InputError("--gpus names several hosts, but this command judges the pipeline of one host: give that "
                         "host's GPUs (e.g. --gpus 4xH100-80GB)")
    return gpus


def exclusive_groups(values: tuple[str, ...], pipeline) -> tuple[tuple[str, ...], ...]:
    groups = []
    for text in values:
        names = [pipeline.stage(k.strip()).name for k in text.split(",") if k.strip()]
        if len(names) < 2 or len(set(names)) != len(names):
            raise InputError(f"--exclusive {text!r}: name at least two different stages, e.g. thinker,code2wav")
        groups.append(tuple(names))
    return tuple(groups)


def version_option(text: str | None):
    """--omni-version (absent: the newest; an empty value is refused, never read as absent)."""
    from ..vllm.facts import omni_version

    return omni_version(NEWEST_OMNI_VERSION if text is None else text)


def buffer_option(text: str | None) -> float:
    value = parse_float(text if text is not None else str(D.DEFAULT_BUFFER_GIB), "--buffer")
    return bounded(value, 0.0, D.MAX_BUFFER_GIB, "--buffer")


def time_limit_option(text: str | None) -> float:
    value = parse_float(text if text is not None else str(D.DEFAULT_TIME_LIMIT_S), "--time-limit")
    return bounded(value, D.MIN_TIME_LIMIT_S, D.MAX_TIME_LIMIT_S, "--time-limit")


def resolution_option(text: str | None) -> int:
    if text is None:
        return D.DEFAULT_RESOLUTION
    step = parse_float(text, "--resolution")
    steps = round(1 / step) if step > 0 else 0
    if not 1 <= steps <= D.MAX_RESOLUTION or abs(steps * step - 1) > 1e-9:
        raise InputError(f"--resolution {text}: must be 1/N for a whole N from 1 to {D.MAX_RESOLUTION} (e.g. 0.01, 0.005)")
    return steps


def replicas_option(text: str | None) -> str | None:
    if text is None or text.strip().lower() == "auto":
        return None if text is None else "auto"
    return str(bounded(parse_int(text, "--replicas"), 1, D.MAX_GPUS, "--replicas"))


def workers_option(text: str | None) -> int | None:
    return None if text is None else bounded(parse_int(text, "--workers"), 1, 64, "--workers")


def kv_cache_dtype_option(text: str | None) -> str:
    value = "auto" if text is None else text
    if value not in ("auto", "fp8"):
        raise InputError(f"--kv-cache-dtype {value!r}: choose auto or fp8")
    return value


def schema_option(text: str | None) -> str | None:
    if text is not None and text not in ("deploy", "stage-args"):
        raise InputError(f"--schema {text!r}: choose deploy or stage-args")
    return text


def devices_option(values: tuple[str, ...], pipeline) -> dict[str, tuple[int, ...]]:
    """Parse `--devices STAGE=0,1` (one stage per option) into {name: (0, 1)}."""
    out: dict[str, tuple[int, ...]] = {}
    for text in values:
        key, sep, raw = text.partition("=")
        if not sep:
            raise InputError(f"--devices: expected STAGE=INDEX[,INDEX...], got {text!r}")
        devices = tuple(parse_int(p, f"--devices {text}") for p in raw.split(","))
        name = pipeline.stage(key.strip()).name
        if name in out:
            raise InputError(f"--devices: {name} is given twice")
        out[name] = devices
    return out


def bools_option(option_name: str, values: tuple[str, ...], pipeline) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for text in values:
        for term in text.split(","):
            key, sep, raw = term.partition("=")
            if not sep or raw.strip().lower() not in ("true", "false"):
                raise InputError(f"--{option_name}: expected STAGE=true|false, got {term!r}")
            name = pipeline.stage(key.strip()).name
            if name in out:
                raise InputError(f"--{option_name}: {name} is given twice")
            out[name] = raw.strip().lower() == "true"
    return out


def _dtype_name(text: str, what: str) -> str:
    from ..vllm.facts import VLLM_DTYPES

    name = text.strip().lower()
    if name not in VLLM_DTYPES:
        raise InputError(f"{what}: {text.strip()!r} is not a dtype vLLM accepts ({', '.join(VLLM_DTYPES)})")
    return name


def dtype_option(values: tuple[str, ...], pipeline) -> dict[str, str]:
    """`--dtype [STAGE=]NAME` (a name vLLM accepts: vllm.facts.VLLM_DTYPES) per stage; a value for
    every stage applies to the LLM stages (a diffusion stage keeps its own dtype)."""
    out = _llm_stages(*per_stage("dtype", values, pipeline, _dtype_name, None), pipeline)
    return {k: v for k, v in out.items() if v != "auto"}


def _llm_stages(out: dict[str, str], everything: str | None, pipeline) -> dict[str, str]:
    """Per-stage values, with a value given for every stage applied to each LLM stage (one bounded by
    its fraction: a diffusion stage keeps its own) that has none of its own."""
    return {**out, **{st.name: everything for st in pipeline.stages
                      if everything is not None and st.bounded_by_fraction and st.name not in out}}


def _method_name(text: str, what: str) -> str:
    if not text.strip():
        raise InputError(f"{what}: a method is missing (fp8, or the checkpoint's own)")
    return text.strip().lower()


def quantization_option(values: tuple[str, ...], pipeline, version) -> dict[str, str]:
    """`--quantization [STAGE=]METHOD` per stage, a value for every stage applying to the LLM stages;
    each checked against its stage at once (stage_memory.with_quantization), an error naming it."""
    from ..memory.stage_memory import with_quantization

    out = _llm_stages(*per_stage("quantization", values, pipeline, _method_name, None), pipeline)
    for name, method in out.items():
        try:
            with_quantization(pipeline.stage(name), method, version.vllm)
        except InputError as exc:
            raise InputError(f"--quantization {name}={method}: {str(exc).split(': ', 1)[-1]}") from None
    return out


def calibration_option(path: str | None, pipeline, version, gpus):
    if path is None:
        return None
    from ..memory.calibration import load

    cal = load(path, [st.name for st in pipeline.stages])
    if cal.model != pipeline.name:
        raise InputError(f"--calibration {path}: measured for {cal.model}, not {pipeline.name}")
    # It holds for the vLLM-Omni version it was measured on (the memory accounting
    # differs by version) and, for its non-torch and graph terms, the GPU.
    if cal.omni_version != version.name:
        raise InputError(f"--calibration {cal.path}: measured on vLLM-Omni {cal.omni_version}, planning for "
                         f"{version.name}: calibrate a start-up log of {version.name} (or pass --omni-version "
                         f"{cal.omni_version})")
    kinds = sorted({g.name for g in gpus})
    if cal.gpu not in kinds:
        raise InputError(f"--calibration {cal.path}: measured on {cal.gpu}, planning for {', '.join(kinds)}: "
                         "calibrate a start-up log from that GPU")
    return cal


def resolve_request(o: dict[str, Any]) -> Request:
    """The planner's Request from the plan options (every value checked, in the order the
    command line has always checked them). Keys are the API's field names; single options
    hold a string or None, repeatable ones a tuple of strings, flags a bool."""
    from ..inputs.model_source import resolve

    if not o.get("gpus") or not o.get("model"):
        raise OptionError("gpus" if not o.get("gpus") else "model", "both --gpus and --model are required (see --help)")
    with option("model"):
        source = resolve(o["model"])
    pipeline = source.pipeline
    with option("omni_version"):
        version = version_option(o.get("omni_version"))
    with option("buffer"):
        buffer_gib = buffer_option(o.get("buffer"))

    def stagewise(name: str, cast, *, kv_only: bool = False, allow_global: bool = True):
        with option(name):
            flag = name.replace("_", "-")
            return per_stage(flag, tuple(o.get(name) or ()), pipeline, cast, LIMITS[flag], kv_only=kv_only,
                             allow_global=allow_global)

    tp, _ = stagewise("tp", parse_int, allow_global=False)
    globals_: dict[str, int] = {}
    knob_values = {}
    for name, kv_only in (("max_model_len", True), ("max_num_seqs", False), ("max_num_batched_tokens", False)):
        values, everything = stagewise(name, parse_int, kv_only=kv_only)
        knob_values[name] = values
        if everything is not None:
            globals_[name] = everything
    min_conc, min_conc_all = stagewise("min_concurrency", parse_int, kv_only=True)
    weight, weight_all = stagewise("weight", parse_float, kv_only=True)
    with option("nodes"):
        nodes = o.get("nodes")
        nodes = None if nodes is None else bounded(parse_int(nodes, "--nodes"), 1, D.MAX_GPUS, "--nodes")
    with option("gpus"):
        gpus = gpus_option(o["gpus"], nodes)
    with option("schema"):
        schema = schema_option(o.get("schema"))
    with option("resolution"):
        resolution = resolution_option(o.get("resolution"))
    with option("devices"):
        devices = devices_option(tuple(o.get("devices") or ()), pipeline)
    with option("enforce_eager"):
        eager = bools_option("enforce-eager", tuple(o.get("enforce_eager") or ()), pipeline)
    with option("dtype"):
        dtype = dtype_option(tuple(o.get("dtype") or ()), pipeline)
    with option("quantization"):
        quantization = quantization_option(tuple(o.get("quantization") or ()), pipeline, version)
    with option("exclusive"):
        exclusive = exclusive_groups(tuple(o.get("exclusive") or ()), pipeline)
    with option("kv_cache_dtype"):
        kv_cache_dtype = kv_cache_dtype_option(o.get("kv_cache_dtype"))
    with option("replicas"):
        replicas = replicas_option(o.get("replicas"))
    with option("calibration"):
        calibration = calibration_option(o.get("calibration"), pipeline, version, gpus)
    with option("time_limit"):
        time_limit = time_limit_option(o.get("time_limit"))
    with option("workers"):
        workers = workers_option(o.get("workers"))
    return Request(
        pipeline=pipeline,
        model_ref=source.reference,
        model_notes=source.notes,
        gpus=gpus,
        version=version,
        omni_version_given=given_version(o.get("omni_version")),
        # several hosts are written in the deploy schema (the only one with headless stages)
        schema=schema or ("deploy" if len({g.node for g in gpus}) > 1 and version.reads("deploy") else version.schema),
        buffer_gib=buffer_gib,
        resolution=resolution,
        tp=tp,
        devices=devices,
        enforce_eager=eager,
        dtype=dtype,
        quantization=quantization,
        max_model_len=knob_values["max_model_len"],
        max_num_seqs=knob_values["max_num_seqs"],
        max_num_batched_tokens=knob_values["max_num_batched_tokens"],
        global_values=globals_,
        min_concurrency=expand_global(min_conc, min_conc_all, pipeline, kv_only=True),
        weight=expand_global(weight, weight_all, pipeline, kv_only=True),
        exclusive=exclusive,
        kv_cache_dtype=kv_cache_dtype,
        allow_untested_tp=bool(o.get("allow_untested_tp")),
        pin_kv=bool(o.get("pin_kv")),
        replicas=replicas,
        calibration=calibration,
        time_limit_s=time_limit,
        workers=workers,
    )

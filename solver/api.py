"""The Python API: `Request`, `plan` and `check`, the same answers as the command line.

    from omni_autoconf import Request, plan
    result = plan(Request(gpus="2xH100-80GB", model="qwen3-omni-moe"))
    result.status, result.files["deploy.yaml"]

A Request is validated when it is built: it accepts what the command line accepts (field
names are the long options with underscores; per-stage options take `{"thinker": 2}`, a
value for every stage, or the command line's text, `"thinker=2,talker=1"`), and an invalid
value raises pydantic's ValidationError naming the field, with the command line's message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, PrivateAttr, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from .errors import NoPlanError
from .planning import options
from .planning.request import Request as ResolvedRequest, number_text

PerStageInt = Union[StrictInt, dict[StrictStr, StrictInt], StrictStr, list[StrictStr], tuple[StrictStr, ...], None]
PerStageFloat = Union[StrictFloat, StrictInt, dict[StrictStr, Union[StrictFloat, StrictInt]], StrictStr,
                      list[StrictStr], tuple[StrictStr, ...], None]
Number = Union[StrictFloat, StrictInt, StrictStr, None]


def _texts(value: Any) -> tuple[str, ...]:
    """A per-stage value in the command line's form: a tuple of `N` / `STAGE=N` terms."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)):
        return tuple(value)
    if isinstance(value, dict):
        return tuple(f"{k}={_text(v)}" for k, v in value.items())
    return (_text(value),)


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return number_text(value) if isinstance(value, float) else str(value)


def _invalid(title: str, field_name: str | None, value: Any, message: str) -> ValidationError:
    """pydantic's error for one option (field_name None: the request as a whole)."""
    error = PydanticCustomError("invalid_option", "{message}", {"message": message})
    loc = (field_name,) if field_name else ()
    return ValidationError.from_exception_data(title, [InitErrorDetails(type=error, loc=loc, input=value)])


class Request(BaseModel):
    """A planning request, validated at construction (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: StrictStr
    model: Union[StrictStr, Path]
    omni_version: Union[StrictStr, None] = None
    nodes: Union[StrictInt, StrictStr, None] = None
    schema_: Union[Literal["deploy", "stage-args"], None] = None
    tp: PerStageInt = None
    devices: Union[dict[StrictStr, Union[list[StrictInt], tuple[StrictInt, ...], StrictStr]], list[StrictStr], None] = None
    enforce_eager: Union[dict[StrictStr, StrictBool], StrictStr, list[StrictStr], None] = None
    dtype: Union[dict[StrictStr, StrictStr], StrictStr, list[StrictStr], None] = None
    quantization: Union[dict[StrictStr, StrictStr], StrictStr, list[StrictStr], None] = None
    max_model_len: PerStageInt = None
    max_num_seqs: PerStageInt = None
    max_num_batched_tokens: PerStageInt = None
    min_concurrency: PerStageInt = None
    weight: PerStageFloat = None
    exclusive: Union[list[Union[list[StrictStr], tuple[StrictStr, ...], StrictStr]], None] = None
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    allow_untested_tp: StrictBool = False
    replicas: Union[StrictInt, StrictStr, None] = None
    pin_kv: StrictBool = False
    calibration: Union[StrictStr, Path, None] = None
    buffer: Number = None
    resolution: Number = None
    time_limit: Number = None
    workers: Union[StrictInt, StrictStr, None] = None

    _resolved: ResolvedRequest = PrivateAttr()

    def __init__(self, schema: str | None = None, **data: Any):
        if schema is not None:
            data["schema_"] = schema
        super().__init__(**data)
        try:
            self._resolved = options.resolve_request(self.option_texts())
            options.validate_request(self._resolved)
        except options.OptionError as exc:
            name = "schema_" if exc.field == "schema" else exc.field
            value = getattr(self, name, None) if name else None
            raise _invalid(type(self).__name__, exc.field, value, str(exc)) from None

    def option_texts(self) -> dict[str, Any]:
        """The fields in the command line's form (what plan.options parses)."""
        out: dict[str, Any] = {
            "gpus": self.gpus, "model": str(self.model), "omni_version": self.omni_version,
            "nodes": _text(self.nodes), "schema": self.schema_, "kv_cache_dtype": self.kv_cache_dtype,
            "allow_untested_tp": self.allow_untested_tp, "pin_kv": self.pin_kv, "replicas": _text(self.replicas),
            "calibration": None if self.calibration is None else str(self.calibration),
            "buffer": _text(self.buffer), "resolution": _text(self.resolution),
            "time_limit": _text(self.time_limit), "workers": _text(self.workers),
        }
        for name in ("tp", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "min_concurrency", "weight",
                     "enforce_eager", "dtype", "quantization"):
            out[name] = _texts(getattr(self, name))
        devices = self.devices
        out["devices"] = tuple(f"{k}={_text(v)}" for k, v in devices.items()) if isinstance(devices, dict) \
            else tuple(devices or ())
        out["exclusive"] = tuple(g if isinstance(g, str) else ",".join(g) for g in self.exclusive or ())
        return out

    @property
    def resolved(self) -> ResolvedRequest:
        """The request as the planner reads it (pipeline spec, GPU list, version, knobs)."""
        return self._resolved


@dataclass(frozen=True)
class PlanResult:
    """The answer to a Request: a plan (status optimal or feasible) with the files the command
    line writes, or none (infeasible: proven, with the conflict; unknown: the time limit came
    first)."""

    status: str
    request: Request
    plan: Any = None  # plan.planner.Plan
    files: dict[str, str] = field(default_factory=dict)
    error: NoPlanError | None = None

    @property
    def stages(self) -> tuple:
        """Each stage's plan (plan.planner.StagePlan): devices, TP, fraction, knobs, KV."""
        return self.plan.stages if self.plan is not None else ()

    @property
    def gpus(self) -> tuple:
        """The per-GPU memory map (startup.simulation.GpuOutcome per GPU)."""
        return self.plan.gpus if self.plan is not None else ()

    @property
    def gap(self) -> float | None:
        return self.plan.gap if self.plan is not None else None

    @property
    def reasons(self) -> list[str]:
        """Why no plan fits (empty for a plan)."""
        return list(self.error.reasons) if self.error is not None else []

    def to_dict(self) -> dict[str, Any]:
        """The `--format json` report of this result."""
        from .emit.summary import no_plan_dict, plan_dict

        return plan_dict(self.plan) if self.plan is not None else no_plan_dict(self.error)


def plan(request: Request, *, fixes: bool = False, fmt: str = "yaml",
         render_options: dict[str, str] | None = None) -> PlanResult:
    """The best plan for `request`, proven optimal where CP-SAT finishes. With no plan, the
    result's status says why (`reasons`); `fixes=True` also searches the proven fixes
    (`result.error.fixes`). `fmt` picks the files rendered (a `--format` value);
    `render_options` are its options (`{"image": ..., "namespace": ...}` for "k8s"), checked
    before planning (errors.InputError)."""
    from .emit.targets import check_options, render_files
    from .planning.planner import plan as solve

    resolved = request.resolved
    render_options = check_options(fmt, resolved, render_options)
    try:
        result = solve(resolved)
    except NoPlanError as exc:
        if fixes and exc.status == "infeasible":
            from .planning.fixes import propose_fixes

            exc.fixes, exc.fix_search_note = propose_fixes(resolved)
        return PlanResult(exc.status, request, error=exc)
    return PlanResult(result.status, request, result, render_files(result, fmt, render_options))


def check(config: str | Path, *, gpus: str, model: str | Path, omni_version: str | None = None,
          platform: str = "cuda", upstream: bool = False, parallel_init: bool = False,
          exclusive: list[str] | tuple[str, ...] = (), buffer: float | None = None,
          calibration: str | Path | None = None):
    """Predict whether an existing stage config starts: plan.check.CheckReport (`ok`,
    `problems` with stable codes, each stage's KV, each GPU's map). Invalid input raises
    errors.InputError with the command line's one-line message."""
    from .planning.check import check_config
    from .planning.check_options import resolve_check
    from .vllm.facts import GiB

    inputs = resolve_check({
        "config": str(config), "gpus": gpus, "model": str(model), "omni_version": omni_version,
        "platform": platform, "buffer": _text(buffer), "exclusive": tuple(exclusive),
        "calibration": None if calibration is None else str(calibration)})
    return check_config(inputs.pipeline, list(inputs.gpus), inputs.version, inputs.config,
                        upstream=True if upstream else None, parallel_init=parallel_init,
                        buffer_bytes=int(inputs.buffer_gib * GiB), exclusive=inputs.exclusive,
                        calibration=inputs.calibration)

"""The inputs of `check`, from its options (the same parsers as a plan's: options.py): the file,
read, and the pipeline, GPUs, version, buffer, exclusive groups and calibration around it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import InputError
from ..inputs.catalog import PipelineSpec
from ..inputs.configfile import ConfigFile
from ..inputs.gpus import Gpu
from ..memory.calibration import Calibration
from ..vllm.facts import OmniVersion
from .options import OptionError, buffer_option, calibration_option, exclusive_groups, gpus_option, option, version_option


@dataclass(frozen=True)
class CheckInputs:
    """What `check` judges: an existing config file, read, and the request around it."""

    config: ConfigFile
    pipeline: PipelineSpec
    gpus: tuple[Gpu, ...]
    version: OmniVersion
    buffer_gib: float
    exclusive: tuple[tuple[str, ...], ...]
    calibration: Calibration | None


def resolve_check(o: dict[str, Any], before_reading: Callable[[], None] | None = None) -> CheckInputs:
    """The inputs of `check` from its options (keys as in resolve_request, plus `config` and
    `platform`); `before_reading` runs once the options are valid, before the file is read."""
    from ..inputs.configfile import read_config
    from ..inputs.model_source import resolve

    if not o.get("gpus") or not o.get("model"):
        raise OptionError("gpus" if not o.get("gpus") else "model", "check needs --gpus and --model (see check --help)")
    with option("gpus"):
        gpus = gpus_option(o["gpus"], hosts=False)
    with option("model"):
        pipeline = resolve(o["model"]).pipeline
    with option("omni_version"):
        version = version_option(o.get("omni_version"))
    with option("buffer"):
        buffer_gib = buffer_option(o.get("buffer"))
    with option("exclusive"):
        exclusive = exclusive_groups(tuple(o.get("exclusive") or ()), pipeline)
    if before_reading is not None:
        before_reading()
    with option("config"):
        config = read_config(o["config"], o.get("platform") or "cuda", engine_extras=version.deploy_reads_engine_extras)
        unjudged = pipeline.judged_reason(config.schema, version)
        if unjudged is not None:  # a version the catalog does not model for this pipeline
            raise InputError(unjudged)
    with option("calibration"):
        calibration = calibration_option(o.get("calibration"), pipeline, version, gpus)
    return CheckInputs(config, pipeline, gpus, version, buffer_gib, exclusive, calibration)

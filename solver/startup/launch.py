"""One launch of a pipeline's stages, built the same way for a plan (the planner's decisions)
and for an existing file (`check`): each stage as a StageRun, the calibration applied once,
and the start-up model walked with the pipeline's margin, exclusive groups and API process."""

from __future__ import annotations

from ..inputs.catalog import PipelineSpec, StageSpec
from ..inputs.gpus import Gpu
from ..memory.stage_memory import StageKnobs, StageMemory
from ..vllm.facts import OmniVersion
from .admission import margin_bytes
from .simulation import StageRun, StartupReport, simulate


def stage_run(spec: StageSpec, version: OmniVersion, devices: tuple[int, ...], tensor_parallel_size: int,
              util_steps: int, resolution: int, knobs: StageKnobs, memory: StageMemory | None, *,
              kv_pinned_bytes: int | None = None, replicas: int = 1, sequence_parallel: int = 1) -> StageRun:
    """A stage of `spec` as launched: the catalog decides its name, id, KV and whether its
    fraction bounds it; the caller where it runs and how large its fraction is."""
    return StageRun(spec.stage_id, spec.name, spec.has_kv_cache, devices, tensor_parallel_size, util_steps,
                    resolution, knobs, memory, kv_pinned_bytes, replicas, bounded=spec.bounded_by_fraction,
                    vllm=version.vllm, sequence_parallel=sequence_parallel)


def calibrated(calibration, pipeline: PipelineSpec, stage: str, tp: int, memory: StageMemory | None) -> StageMemory | None:
    """The memory terms with a calibration applied when it was measured for this model
    (memory.calibration.Calibration; None: none given)."""
    if calibration is None or memory is None or calibration.model != pipeline.name:
        return memory
    return calibration.apply(stage, memory, tp)


def exclusive_indices(pipeline: PipelineSpec, groups: tuple[tuple[str, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """Exclusive groups of stage names as stage indices (what the models read)."""
    index = {st.name: i for i, st in enumerate(pipeline.stages)}
    return tuple(tuple(index[name] for name in group) for group in groups)


def launch(pipeline: PipelineSpec, runs: list[StageRun], gpus: list[Gpu] | tuple[Gpu, ...], *, upstream: bool,
           parallel_init: bool, buffer_bytes: int, exclusive: tuple[tuple[str, ...], ...] = ()) -> StartupReport:
    """The start-up model over one launch of `runs` (stage i of the pipeline at index i)."""
    return simulate(list(runs), list(gpus), upstream=upstream, parallel_init=parallel_init,
                    margin=margin_bytes(buffer_bytes), exclusive_groups=exclusive_indices(pipeline, exclusive),
                    frontend=pipeline.frontend_gpu_bytes)

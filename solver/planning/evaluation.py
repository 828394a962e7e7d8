"""Figures for placements the solver did not choose: a given config (a bundled file) under
the same memory and start-up model as `plan`, and a finished plan re-checked."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import InputError
from ..opt import cpsat
from ..startup.simulation import StartupReport
from .planner import Plan, build_problem, stage_plan, stage_runs, startup_report
from .request import Request


@dataclass(frozen=True)
class Placement:
    """A stage's placement as a config file states it."""

    devices: tuple[int, ...]
    tensor_parallel_size: int
    gpu_memory_utilization: float


EVALUATION_RESOLUTION = 1000  # fractions in hand-written configs have up to 3 decimals


def evaluate(request: Request, placements: dict[str, Placement]) -> tuple[Plan, list[str]]:
    """A given placement (e.g. a bundled config) under the same model as `plan`.

    Returns the plan with every figure computed, and the errors the start-up model finds
    (empty when it would start; warnings such as a thin margin are not errors)."""
    missing = [st.name for st in request.pipeline.stages if st.name not in placements]
    if missing:
        raise InputError(f"no placement given for stage(s) {', '.join(missing)}")
    fixed = replace(
        request,
        tp={name: p.tensor_parallel_size for name, p in placements.items()},
        devices={name: p.devices for name, p in placements.items()},
        resolution=EVALUATION_RESOLUTION,
        allow_untested_tp=True,
    )
    problem, knobs = build_problem(fixed)
    assignments = []
    for st, sp in zip(fixed.pipeline.stages, problem.stages):
        p = placements[st.name]
        steps = round(p.gpu_memory_utilization * EVALUATION_RESOLUTION)
        if abs(steps - p.gpu_memory_utilization * EVALUATION_RESOLUTION) > 1e-6:
            raise InputError(f"{st.name}: gpu_memory_utilization {p.gpu_memory_utilization} has more than 3 decimals")
        assignments.append(cpsat.StageAssignment(sp.option_index(sp.pinned_tp), sp.pinned_devices, steps))
    runs = stage_runs(fixed, problem, knobs, tuple(assignments))
    report = startup_report(fixed, runs)
    stage_plans = tuple(stage_plan(st, sp, r, o)
                        for st, sp, r, o in zip(fixed.pipeline.stages, problem.stages, runs, report.stages))
    result = Plan(fixed, "given", 0.0, 0.0, stage_plans, report.gpus)
    return result, [p.message for p in report.errors]


def recheck(plan_: Plan) -> StartupReport:
    """The start-up model run once more on a finished plan's decisions (tests, tools)."""
    problem, knobs = build_problem(plan_.request)
    assignments = tuple(
        cpsat.StageAssignment(sp_problem.option_index(sp.tensor_parallel_size), sp.devices, sp.util_steps,
                              sp.num_replicas)
        for sp, sp_problem in zip(plan_.stages, problem.stages)
    )
    return startup_report(plan_.request, stage_runs(plan_.request, problem, knobs, assignments))

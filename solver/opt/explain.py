"""Why no plan fits: a minimal set of conflicting requirements, in words and GiB.

CP-SAT names the conflict (`infeasible_core`: one assumption literal per
requirement group, then a deletion pass to make the set minimal); this module turns each
group into a sentence with the figures behind it, and adds, for the stages involved, what
each needs at best against what the GPUs offer.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from ..memory.stage_memory import requested_bytes
from ..vllm.facts import gib_text
from . import cpsat
from .problem import Problem, StageProblem, TpOption


@dataclass(frozen=True)
class Requirement:
    """One requirement group of the conflict."""

    group: str  # capacity, fits, max-model-len, min-concurrency, replicas, pinned-tp, pinned-devices
    subject: str  # a stage name, or "gpuN"
    text: str

    def as_dict(self) -> dict[str, str]:
        return {"group": self.group, "subject": self.subject, "text": self.text}


def _gib(nbytes: float) -> str:
    return f"{gib_text(nbytes)} GiB"


def _stage(problem: Problem, name: str) -> StageProblem:
    return next(st for st in problem.stages if st.name == name)


def _cheapest(st: StageProblem) -> TpOption:
    """The pinned option, else the one whose per-rank need (inside + one request) is smallest."""
    options = [o for o in st.options if st.pinned_tp in (None, o.tp)]
    return min(options, key=lambda o: (o.memory.inside_bytes + st.min_kv_bytes_for(o, 1), o.tp))


def _describe(problem: Problem, group: str, subject: str) -> str:
    if group == "capacity":  # subject: the first GPU of a class of interchangeable ones
        first = int(subject[3:])
        members = next(c for c in problem.gpu_classes() if c[0] == first)
        gpu = problem.gpus[first]
        who = f"GPU {gpu.index} ({gpu.name}) holds" if len(members) == 1 else (
            f"GPUs {','.join(map(str, members))} ({gpu.name}) each hold")
        return (
            f"{who} at most {_gib(problem.usable_bytes(gpu))} of stage memory "
            f"(total {_gib(gpu.total_bytes)} less the {_gib(problem.reserve_bytes)} margin"
            + (f" and the API process's {_gib(problem.frontend_bytes)})"
               if problem.usable_bytes(gpu) < gpu.total_bytes - problem.reserve_bytes else ")")
        )
    st = _stage(problem, subject)
    opt = _cheapest(st)
    m = opt.memory
    if group == "fits":
        return (
            f"{st.name} needs {_gib(m.inside_bytes)} per rank inside its fraction at TP={opt.tp} "
            f"(weights {_gib(m.weights_bytes)}, activations {_gib(m.activation_bytes)}, other "
            f"{_gib(m.inside_bytes - m.weights_bytes - m.activation_bytes)}) plus {_gib(m.outside_bytes)} outside it"
        )
    if group == "max-model-len":
        return (
            f"{st.name} must hold one request of max_model_len {st.max_model_len}: "
            f"{_gib(st.min_kv_bytes_for(opt, 1))} of KV per rank at TP={opt.tp}"
        )
    if group == "min-concurrency":
        return (
            f"{st.name} must hold {st.min_requests} requests of {st.max_model_len} tokens: "
            f"{_gib(st.min_kv_bytes(opt))} of KV per rank at TP={opt.tp}"
        )
    if group == "replicas":
        return f"{st.name} runs {st.fixed_replicas} replicas (--replicas {st.fixed_replicas})"
    if group == "rate":
        return f"{st.name} needs at least {st.min_replicas} replicas to serve the target rate (--target-rate)"
    if group == "pinned-tp":
        return f"{st.name} is pinned to tensor_parallel_size {st.pinned_tp}"
    if group == "pinned-devices":
        return f"{st.name} is pinned to devices {','.join(map(str, st.pinned_devices or ()))}"
    return f"{group}[{subject}]"


def infeasible_core(problem: Problem, time_limit_s: float) -> tuple[list[str] | None, bool]:
    """Names of a set of requirement groups of `problem` that conflict, and whether the set
    is minimal. Groups: capacity[gpuN] (N: the first GPU of its class), fits[stage], max-model-len[stage],
    min-concurrency[stage], pinned-tp[stage], pinned-devices[stage]. None when no conflict
    was proven within `time_limit_s` (the whole search shares that budget)."""
    model = cpsat.Model(problem, explain=True)
    names = list(model.assume)
    deadline = time.perf_counter() + time_limit_s

    def infeasible(subset: list[str]) -> tuple[bool | None, list[str]]:
        left = deadline - time.perf_counter()
        if left <= 0:
            return None, []
        model.m.ClearAssumptions()
        model.m.AddAssumptions([model.assume[n] for n in subset])
        result, solver = cpsat.run_solver(model.m, left, workers=1)  # cores are single-threaded
        if result == model.cp.INFEASIBLE:
            index = {model.assume[n].Index(): n for n in subset}
            core = [index[i] for i in solver.SufficientAssumptionsForInfeasibility() if i in index]
            return True, core or subset
        return (False if result in (model.cp.OPTIMAL, model.cp.FEASIBLE) else None), []

    found, core = infeasible(names)
    if not found:
        return None, False
    # Deletion pass: drop every group the conflict does not need.
    core = [n for n in names if n in core]
    minimal = True
    for name in list(core):
        trial = [n for n in core if n != name]
        if not trial:
            continue
        verdict, _ = infeasible(trial)
        if verdict is None:
            minimal = False  # out of time: the set is a conflict, perhaps not a minimal one
            break
        if verdict:
            core = trial
    return core, minimal


def conflict(problem: Problem, time_limit_s: float) -> tuple[list[Requirement], bool]:
    """The conflicting requirements of an infeasible problem (empty when none was isolated
    in time), and whether the set is minimal."""
    names, minimal = infeasible_core(problem, time_limit_s)
    out = []
    for name in names or []:
        m = re.fullmatch(r"([a-z-]+)\[(.+)\]", name)
        group, subject = (m.group(1), m.group(2)) if m else (name, "")
        out.append(Requirement(group, subject, _describe(problem, group, subject)))
    return out, minimal


def shortfalls(problem: Problem, stages: set[str] | None = None) -> list[str]:
    """For each stage (or those named), what it needs per GPU at its most frugal TP on the
    largest GPUs, and by how much that exceeds what one such GPU offers; then, if every
    stage fits alone, what they need together against all GPUs."""
    lines: list[str] = []
    R = problem.resolution
    least_total = 0
    for st in problem.stages:
        best = None
        for opt in [o for o in st.options if st.pinned_tp in (None, o.tp)]:
            need = opt.memory.inside_bytes + st.min_kv_bytes(opt)
            worst = sorted(problem.gpus, key=lambda g: (-problem.usable_bytes(g), g.index))[opt.tp - 1]
            steps = -(-need * R // worst.total_bytes)  # a whole number of fraction steps
            footprint = requested_bytes(worst.total_bytes, steps, R) + opt.memory.outside_bytes
            short = footprint - problem.usable_bytes(worst)
            if best is None or (short, footprint * opt.tp) < (best[0], best[1] * best[2].tp):
                best = (short, footprint, opt, worst)
        short, footprint, opt, worst = best
        least_total += min(
            (o.memory.inside_bytes + st.min_kv_bytes(o) + o.memory.outside_bytes) * o.tp
            for o in st.options
            if st.pinned_tp in (None, o.tp)
        )
        if short > 0 and (stages is None or st.name in stages):
            kv = f", KV {_gib(st.min_kv_bytes(opt))}" if st.has_kv else ""
            lines.append(
                f"{st.name} at best (TP={opt.tp}) needs {_gib(footprint)} per GPU (weights "
                f"{_gib(opt.memory.weights_bytes)}, activations {_gib(opt.memory.activation_bytes)}{kv}, "
                f"overheads {_gib(opt.memory.overhead_bytes)}); GPU {worst.index} ({worst.name}) offers "
                f"{_gib(problem.usable_bytes(worst))}: short by {_gib(short)}"
            )
    if not lines:
        usable = sum(problem.usable_bytes(g) for g in problem.gpus)
        if least_total > usable:
            lines.append(
                f"together the stages need at least {_gib(least_total)} against {_gib(usable)} on "
                f"{len(problem.gpus)} GPU(s): short by {_gib(least_total - usable)}"
            )
        else:
            lines.append(
                f"together the stages need at least {_gib(least_total)} of the {_gib(usable)} the GPUs offer, "
                "but no split of them over the GPUs works (a stage's ranks need one GPU each)"
            )
    if len(problem.nodes()) > 1:
        lines.append(f"over {len(problem.nodes())} hosts a tensor-parallel group stays on one host and each GPU "
                     "holds one stage (each host's stage is a process of its own there)")
    return lines


def reasons(problem: Problem, time_limit_s: float) -> tuple[list[Requirement], list[str]]:
    """The conflict and the shortfall lines, for an infeasible problem."""
    core, minimal = conflict(problem, time_limit_s)
    involved = {r.subject for r in core if not r.subject.startswith("gpu")}
    lines = [f"cannot hold together: {r.text}" for r in core]
    if not core:
        lines.append(f"the conflicting requirements were not isolated within the time limit ({time_limit_s:g} s)")
    elif not minimal:
        lines.append("(the time limit ended the search before this set was shown to be minimal)")
    lines += shortfalls(problem, involved or None)
    return core, lines

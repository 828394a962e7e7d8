"""Solve time and status at scale, CP-SAT against the brute-force enumerator, and the CLI's
own start-up cost: rerunnable (`make bench`), figures from one run on this machine.

    python benchmarks/solve_times.py            # print the tables
    python benchmarks/solve_times.py --readme   # and write them into docs/speed.md
    python benchmarks/solve_times.py --models qwen3-omni-moe,qwen2.5-omni-3b   # some models only

Rows print as they are solved; the whole report follows at the end.

Every plan is solved with the default options (replicas as the default picks them), the
default worker count and the default time limit; "solver s" is the CP-SAT time the plan
reports, "wall s" includes building the model and the start-up re-check.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- solve-times:start -->", "<!-- solve-times:end -->"

# (label, --gpus[, --nodes]): 1, 2, 8, 16 and 64 GPUs, one kind and mixed, one host or 8; every model.
INVENTORIES = [
    ("1 GPU", "1xH100-80GB"),
    ("2 GPUs", "2xH100-80GB"),
    ("2 GPUs mixed", "1xH100-80GB,1xA100-80GB"),
    ("8 GPUs", "8xH100-80GB"),
    ("8 GPUs mixed", "4xH100-80GB,4xL40S"),
    ("16 GPUs", "16xH100-80GB"),
    ("16 GPUs mixed", "8xH100-80GB,8xA100-80GB"),
    ("64 GPUs", "64xH100-80GB"),
    ("64 GPUs mixed", "32xH100-80GB,16xA100-80GB,16xL40S"),
    ("8 hosts x 8 GPUs", "8xH100-80GB", 8),
]


# Fleets, for the flagship only: 512 GPUs over 64 identical hosts, 32 + 32 hosts of two kinds,
# and 64 GPUs of 8 kinds on one host.
FLEETS = [
    ("64 hosts x 8 GPUs", "8xH100-80GB", 64),
    ("32 + 32 hosts mixed", ";".join([f"node{i}=8xH100-80GB" for i in range(32)]
                                     + [f"node{i}=8xL40S" for i in range(32, 64)])),
    ("64 GPUs of 8 kinds", "8xH100-80GB,8xH200,8xA100-80GB,8xA100-40GB,8xL40S,8xH20,8xRTXPRO6000,8xB200"),
]
FLAGSHIP = "qwen3-omni-moe"
SCALE_HEADER = ["model", "GPUs", "status", "smallest headroom", "GPUs used", "replicas", "solver s", "wall s"]


def _request(model: str, gpus: str, nodes: int | None = None, **kw):
    from omni_autoconf.inputs.catalog import lookup_model
    from omni_autoconf.inputs.gpus import parse_inventory
    from omni_autoconf.planning.planner import Request
    from omni_autoconf.vllm.facts import omni_version

    version = omni_version("0.30")
    return Request(pipeline=lookup_model(model), gpus=tuple(parse_inventory(gpus, nodes)), version=version,
                   schema=version.schema, **kw)


def scale_row(model: str, label: str, gpus: str, *nodes: int) -> list[str]:
    """One plan as a table row; every documented refusal (an input the tool refuses, no plan,
    nothing found in time) is a row too, its status the kind of refusal."""
    from omni_autoconf.errors import InputError, NoPlanError
    from omni_autoconf.planning.planner import plan

    t0 = time.perf_counter()
    try:
        result = plan(_request(model, gpus, *nodes))
    except NoPlanError as exc:
        return [model, label, exc.status, "-", "-", "-", "-", f"{time.perf_counter() - t0:.2f}"]
    except InputError as exc:  # e.g. a pipeline that needs more GPUs than given, or no bf16
        why = str(exc).replace("|", "/")
        return [model, label, f"refused: {why[:60]}{'...' if len(why) > 60 else ''}", "-", "-", "-", "-",
                f"{time.perf_counter() - t0:.2f}"]
    wall = time.perf_counter() - t0
    used = len({d for sp in result.stages for d in sp.devices})
    replicas = "/".join(str(sp.num_replicas) for sp in result.stages)
    status = result.status if result.status == "optimal" else f"{result.status} (gap {result.gap:.2%})"
    return [model, label, status, f"{result.min_kv_requests:.2f}", f"{used}/{len(result.gpus)}", replicas,
            f"{result.solve_seconds:.2f}", f"{wall:.2f}"]


def scale_rows(models: list[str] | None = None, inventories=None, fleets: bool = True, emit=print) -> list[list[str]]:
    """Every catalog model (or `models`) on every inventory, and the fleets for the flagship;
    each row is passed to `emit` as soon as it is solved."""
    from omni_autoconf.inputs.catalog import catalog_names

    rows = []
    for model in models or catalog_names():
        cases = list(inventories or INVENTORIES) + (FLEETS if fleets and model == FLAGSHIP else [])
        for label, gpus, *nodes in cases:
            rows.append(scale_row(model, label, gpus, *nodes))
            emit("| " + " | ".join(rows[-1]) + " |")
    return rows


def brute_force_rows() -> list[list[str]]:
    """Small real instances (coarse fractions) that the enumerator finishes."""
    from omni_autoconf.opt import cpsat as cpsat
    from omni_autoconf.opt.bruteforce import best_objective
    from omni_autoconf.planning.planner import build_problem

    rows = []
    for model, gpus, replicas in [("qwen2.5-omni-3b", "2xL40S", "1"), ("qwen2.5-omni-7b", "1xH100-80GB,1xL40S", "1"),
                                  ("qwen2.5-omni-3b", "3xL40S", "auto")]:
        problem, _ = build_problem(_request(model, gpus, resolution=10, replicas=replicas))
        t0 = time.perf_counter()
        expected = best_objective(problem)
        brute = time.perf_counter() - t0
        t0 = time.perf_counter()
        solution = cpsat.solve(problem)
        fast = time.perf_counter() - t0
        got = None
        if solution.status is cpsat.SolveStatus.OPTIMAL:
            headroom = sum(h for h, st in zip(solution.headroom_milli, problem.stages) if st.has_kv)
            got = (solution.objective, headroom, sum(a.util_steps for a in solution.assignments))
        rows.append([model, gpus, replicas, "yes" if got == expected else f"NO: {got} vs {expected}",
                     f"{brute:.3f}", f"{fast:.3f}", f"{brute / fast:.2g}x"])
    return rows


def tuning_rows() -> list[list[str]]:
    """The solver parameters of solving.py against CP-SAT's defaults, same model, same run."""
    from omni_autoconf.opt import cpsat as cpsat
    from omni_autoconf.opt import solving as solving
    from omni_autoconf.planning.planner import build_problem

    rows = []
    for gpus, workers in [("8xH100-80GB", 1), ("8xH100-80GB", 2), ("16xH100-80GB", 2), ("64xH100-80GB", 2)]:
        problem, _ = build_problem(_request("qwen3-omni-moe", gpus, replicas="auto"))
        cells = []
        for tuned in (True, False):
            solving.TUNED = tuned
            try:
                solution = cpsat.solve(problem, time_limit_s=30, workers=workers)
            finally:
                solving.TUNED = True
            cells.append(solution)
        ours, default = cells
        rows.append([gpus, str(workers), f"{ours.status.value}, {ours.solve_seconds:.2f}",
                     f"{default.status.value}, {default.solve_seconds:.2f}",
                     f"{default.solve_seconds / ours.solve_seconds:.1f}x"])
    return rows


def _seconds(cmd: list[str], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        best = min(best, time.perf_counter() - t0)
    return best


def cli_rows() -> list[list[str]]:
    exe = [sys.executable, "-m", "omni_autoconf"]
    plan_s = _seconds([*exe, "--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "-q"])
    imports_s = _seconds([sys.executable, "-c", "import omni_autoconf.cli.main, omni_autoconf.planning.planner, "
                          "omni_autoconf.emit.render, ortools.sat.python.cp_model"])
    python_s = _seconds([sys.executable, "-c", "pass"])
    help_s = _seconds([*exe, "--help"])
    loaded = subprocess.run([sys.executable, "-c", "import sys\nfrom omni_autoconf.cli.main import main\n"
                             "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
                             "print('ortools' in sys.modules)"], capture_output=True, text=True).stdout.split()[-1]
    return [["plan, 2xH100-80GB (end to end)", f"{plan_s:.2f}",
             f"imports {imports_s - python_s:.2f} s ({(imports_s - python_s) / plan_s:.0%}), "
             f"Python itself {python_s:.2f} s"],
            ["--help", f"{help_s:.2f}", f"ortools imported: {loaded}"]]


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    from ortools import __version__ as ortools_version

    return f"{cores} cores ({cpu}), Python {platform.python_version()}, OR-Tools {ortools_version}"


def report(models: list[str] | None = None, emit=print) -> str:
    from omni_autoconf.defaults import default_workers

    head = (f"Machine: {machine()}; {default_workers()} CP-SAT workers; one run, "
            f"{time.strftime('%Y-%m-%d', time.gmtime())}.")
    emit(head)
    emit("")
    emit(_table(SCALE_HEADER, []))
    scale = scale_rows(models, emit=emit)
    parts = [
        head,
        "",
        _table(SCALE_HEADER, scale),
        "",
        "CP-SAT against the brute-force enumerator (fractions in steps of 0.1):",
        "",
        _table(["model", "GPUs", "--replicas", "same optimum", "brute force s", "CP-SAT s", "ratio"],
               brute_force_rows()),
        "",
        "Solver parameters (solving.py) against CP-SAT's defaults, Qwen3-Omni with `--replicas auto`, "
        "time limit 30 s:",
        "",
        _table(["GPUs", "workers", "tuned: status, s", "CP-SAT defaults: status, s", "ratio"], tuning_rows()),
        "",
        "The command line (best of 3 runs):",
        "",
        _table(["command", "s", "of which"], cli_rows()),
    ]
    return "\n".join(parts) + "\n"


def main() -> None:
    args = sys.argv[1:]
    models = args[args.index("--models") + 1].split(",") if "--models" in args else None
    text = report(models, emit=lambda line: print(line, flush=True))
    print()
    print(text, flush=True)
    if "--readme" in args:
        readme = ROOT / "docs" / "speed.md"
        body = readme.read_text()
        if START not in body:
            raise SystemExit(f"docs/speed.md has no {START} block")
        new = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: f"{START}\n{text}{END}", body, flags=re.S)
        readme.write_text(new)
        print("wrote docs/speed.md", file=sys.stderr)


if __name__ == "__main__":
    main()

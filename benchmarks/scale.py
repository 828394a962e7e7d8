"""Issue 22's acceptance figures, as ratios measured in one run on this machine (rerun to check):

    python benchmarks/scale.py            # all of them (a few minutes on 2 cores)
    python benchmarks/scale.py --quick    # the start-up ratio only
    python benchmarks/scale.py --baseline HEAD   # the same figures for a git revision too, same run

1. CPU seconds of the 2-GPU flagship end to end (`-q -o FILE`, `--workers 2`) against those of
   `python -c "from ortools.sat.python import cp_model"` (the floor of any CP-SAT tool): the
   median of N runs of each, interleaved.
2. `--gpus 8xH100-80GB --nodes 64` (512 GPUs): status, gap, CPU and wall seconds, peak RSS, and
   its smallest headroom against `--nodes 8`'s.
3. 32 hosts of 8xH100-80GB + 32 of 8xL40S.
4. 64 GPUs of 8 kinds on one host: status and CPU seconds.

Each plan runs as its own process (`omni-autoconf ... --format json`), so CPU time and peak RSS
are the process's own (resource.getrusage of the child).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

PY = sys.executable
FLAGSHIP = ["--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "-q", "--workers", "2"]
EIGHT_KINDS = "8xH100-80GB,8xH200,8xA100-80GB,8xA100-40GB,8xL40S,8xH20,8xRTXPRO6000,8xB200"
MIXED_FLEET = ";".join([f"node{i}=8xH100-80GB" for i in range(32)] + [f"node{i}=8xL40S" for i in range(32, 64)])


ENV: dict[str, str] | None = None  # the baseline tree's PYTHONPATH, when measuring it


def baseline_tree(rev: str, where: str) -> dict[str, str]:
    """The package as it was at git revision `rev` (git archive: reads the repository only),
    importable as omni_autoconf ahead of the editable install."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run(f"git -C {root} archive {rev} solver models | tar -x -C {where}", shell=True, check=True)
    pkg = os.path.join(where, "pkg")
    os.makedirs(pkg)
    shutil.move(os.path.join(where, "solver"), os.path.join(pkg, "omni_autoconf"))
    shutil.move(os.path.join(where, "models"), os.path.join(pkg, "omni_autoconf", "models"))
    return {**os.environ, "PYTHONPATH": pkg}


def child(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float, float, int]:
    """(result, CPU s, wall s, peak RSS MiB) of one child process."""
    with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f:  # no pipe to fill
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out_f, stderr=err_f, text=True, env=ENV)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read(), err_f.read()
    code = os.waitstatus_to_exitcode(status)
    return (subprocess.CompletedProcess(cmd, code, out, err), usage.ru_utime + usage.ru_stime, wall,
            usage.ru_maxrss // 1024)


def startup_ratio(runs: int = 7) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        plan_cmd = [PY, "-m", "omni_autoconf", *FLAGSHIP, "-o", os.path.join(tmp, "deploy.yaml")]
        floor_cmd = [PY, "-c", "from ortools.sat.python import cp_model"]
        plans, floors = [], []
        for _ in range(runs):
            result, cpu, _, _ = child(plan_cmd)
            if result.returncode:
                raise SystemExit(f"flagship failed: {result.stderr.strip()}")
            plans.append(cpu)
            floors.append(child(floor_cmd)[1])
    p, f = statistics.median(plans), statistics.median(floors)
    return (f"flagship (2xH100-80GB, qwen3-omni-moe, -q -o FILE) {p:.2f} s CPU, cp_model import {f:.2f} s CPU "
            f"(medians of {runs}): ratio {p / f:.2f}x")


def plan_json(gpus: str, nodes: int | None = None, model: str = "qwen3-omni-moe") -> tuple[dict | str, float, float, int]:
    cmd = [PY, "-m", "omni_autoconf", "--gpus", gpus, "--model", model, "--workers", "2", "--format", "json", "-q"]
    if nodes:
        cmd += ["--nodes", str(nodes)]
    result, cpu, wall, rss = child(cmd)
    if result.returncode:
        return f"exit {result.returncode}: {result.stderr.strip()[:200]}", cpu, wall, rss
    return json.loads(result.stdout), cpu, wall, rss


def describe(label: str, got) -> str:
    data, cpu, wall, rss = got
    if isinstance(data, str):
        return f"{label}: {data} ({cpu:.2f} s CPU, {wall:.2f} s wall)"
    return (f"{label}: {data['status']}, gap {data.get('gap', 0):.4f}, smallest headroom "
            f"{data['objective_min_kv_requests']:.2f}, {cpu:.2f} s CPU, {wall:.2f} s wall, peak RSS {rss} MiB")


def main() -> None:
    global ENV
    args = sys.argv[1:]
    if "--baseline" in args:
        rev = args[args.index("--baseline") + 1]
        with tempfile.TemporaryDirectory() as tmp:
            ENV = baseline_tree(rev, tmp)
            print(f"== baseline: git {rev}", flush=True)
            run(args)
            ENV = None
    print("== this tree", flush=True)
    run(args)


def run(args: list[str]) -> None:
    print(startup_ratio(), flush=True)
    if "--quick" in args:
        return
    eight = plan_json("8xH100-80GB", 8)
    print(describe("8 hosts x 8xH100-80GB", eight), flush=True)
    big = plan_json("8xH100-80GB", 64)
    print(describe("64 hosts x 8xH100-80GB", big), flush=True)
    if not isinstance(big[0], str) and not isinstance(eight[0], str):
        print(f"  headroom ratio 64 hosts / 8 hosts: {big[0]['objective_min_kv_requests'] / eight[0]['objective_min_kv_requests']:.2f}x",
              flush=True)
    print(describe("32 hosts x 8xH100-80GB + 32 x 8xL40S", plan_json(MIXED_FLEET)), flush=True)
    print(describe("64 GPUs of 8 kinds, one host", plan_json(EIGHT_KINDS)), flush=True)


if __name__ == "__main__":
    main()

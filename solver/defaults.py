"""Defaults and bounds of the tool's own knobs, in one home.

vLLM's and vLLM-Omni's defaults (what vLLM does when a field is absent) live in
`vllm_facts`; this module holds the planner's: margins, solver settings and the sizes
the tool accepts before doing any work.
"""

from __future__ import annotations

import os

# --buffer: GiB kept free per GPU on top of vLLM-Omni's 2 GiB admission reserve. GPU totals
# move by up to ~0.2 GiB between drivers (the catalog takes the low end of the observed
# range) and allocator fragmentation grows over hours of serving; 0.5 GiB covers both.
DEFAULT_BUFFER_GIB = 0.5
MAX_BUFFER_GIB = 64.0

# --resolution: gpu_memory_utilization is planned in steps of 1/R.
DEFAULT_RESOLUTION = 100
MAX_RESOLUTION = 1000

# --time-limit, seconds: one budget for the plan's solve, and one each for the
# explanation and the fix search of a request that has no plan.
DEFAULT_TIME_LIMIT_S = 30.0
MIN_TIME_LIMIT_S = 0.01
MAX_TIME_LIMIT_S = 3600.0

# Solver seed, fixed so that the same input yields the same plan.
RANDOM_SEED = 0
MAX_WORKERS = 8

# The largest inventory `--gpus` accepts (128 nodes of 8).
MAX_GPUS = 1024
# Above this many GPUs over several hosts, identical hosts are solved as one host type with
# a multiplicity (opt/hosts.py); up to it each host is its own (the plans of 64 GPUs and
# fewer are the same as before fleets were planned).
HOST_PATTERN_ABOVE_GPUS = 64

# Input files: only regular files, at most this large, with bounded YAML structure.
MAX_CONFIG_BYTES = 1 << 20
MAX_YAML_DEPTH = 64
MAX_YAML_NODES = 100_000  # after expanding aliases
MAX_BASE_CONFIG_DEPTH = 8


def default_workers() -> int:
    """CP-SAT workers: the cores this process may run on, at most MAX_WORKERS.

    The plan does not depend on it (every objective phase is solved to optimality and the
    tie-breaks are total), only the time it takes."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cores))

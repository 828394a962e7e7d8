"""Which stages are on the GPUs at the same time.

Every stage of a pipeline is a process that stays resident from launch to shutdown
(vllm-omni 0.30.0 wheel, vllm_omni/config/omni_config.py: no stage is unloaded while
the pipeline serves), so by default all stages are co-resident. `--exclusive A,B` declares
that A and B never are (separate launches, sleep mode). Nothing else is assumed: with
groups (A,B) and (C,D), A may meet C or D. The co-resident sets are therefore the
maximal sets of stages that hold no two members of one group; each GPU must fit every
one of them. The planner and `check` both read this one definition.
"""

from __future__ import annotations

from itertools import combinations


def resident_sets(num_stages: int, exclusive_groups: tuple[tuple[int, ...], ...] = ()) -> tuple[tuple[int, ...], ...]:
    """The maximal sets of stage indices that may be resident together, in a fixed order."""
    apart = {frozenset(pair) for group in exclusive_groups for pair in combinations(group, 2)}
    grouped = sorted({s for group in exclusive_groups for s in group})
    always = [s for s in range(num_stages) if s not in grouped]
    independent = []
    for mask in range(1 << len(grouped)):
        chosen = [s for i, s in enumerate(grouped) if mask >> i & 1]
        if not any(frozenset(pair) in apart for pair in combinations(chosen, 2)):
            independent.append(frozenset(chosen))
    maximal = [c for c in independent if not any(c < other for other in independent)]
    return tuple(sorted(tuple(sorted([*always, *c])) for c in maximal))

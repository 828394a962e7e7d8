"""Co-location patterns: the sets of stages one GPU may hold, as bit masks (stage s = bit
s), in the order the CP-SAT model lays them out on a class of GPUs; and a lexicographic
objective over counts, in as few phases as 64-bit weights allow."""

from __future__ import annotations

from .problem import Problem


def patterns(num_stages: int) -> list[int]:
    """The non-empty sets of stages a GPU may hold, as bit masks, stage 0's sets first
    (the bits read with stage 0 as the most significant): the order GPUs are laid out in."""
    def key(P: int) -> int:
        return sum(1 << (num_stages - 1 - s) for s in range(num_stages) if P >> s & 1)

    return sorted(range(1, 1 << num_stages), key=key, reverse=True)


def stages_of(P: int) -> list[int]:
    return [s for s in range(P.bit_length()) if P >> s & 1]


def pattern_name(problem: Problem, P: int) -> str:
    return "+".join(problem.stages[s].name for s in stages_of(P))


def span(gpus: list[int]) -> str:
    return ",".join(map(str, gpus))


def lexicographic_phases(name: str, values: list, most: int) -> list[tuple[str, object, bool]]:
    """Maximise `values` (each 0..most) lexicographically: one phase with weights
    (most+1)^i where they fit CP-SAT's 64-bit arithmetic, else one phase per group."""
    out, group = [], []
    for v in values:
        if (most + 1) ** (len(group) + 1) * (most + 1) >= 2 ** 60:
            out.append(group)
            group = []
        group.append(v)
    if group:
        out.append(group)
    return [(name, sum((most + 1) ** (len(g) - 1 - i) * v for i, v in enumerate(g)), True) for g in out]

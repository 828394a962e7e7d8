"""The CP-SAT model's objective and its answer: the lexicographic phases (what is
optimised, in which order, down to a total tie-break) and the reading of a solution into
per-stage assignments. A mixin of cpsat.Model, which holds the variables."""

from __future__ import annotations

from ..vllm.facts import MiB
from .patterns import lexicographic_phases, span, stages_of
from .problem import MILLI, Problem
from .solving import StageAssignment


class Objective:
    """Needs the Model's m, pb, classes, patterns, x, n, y, u, h, counts, max_c and gpu_count."""

    def phases(self) -> list[tuple[str, object, bool]]:
        """(name, expression, maximise) in the order they are optimised."""
        pb = self.pb
        kv_stages = [s for s, st in enumerate(pb.stages) if st.has_kv]
        z_max = max([0, *(100 * pb.stages[s].replica_counts()[-1] * max_milli(pb, s, self.max_c * MiB)
                          for s in kv_stages)])
        z = self.m.NewIntVar(0, z_max, "z")
        for s in kv_stages:
            self.m.Add(pb.stages[s].weight_pct * z <= 100 * self.h[s])
        if not kv_stages:
            self.m.Add(z == 0)
        out: list[tuple[str, object, bool]] = [
            ("smallest weighted headroom", z, True),
            ("total headroom", sum(self.h[s] for s in kv_stages), True),
        ]
        if self.y:
            out.append(("fewest replicas", sum(k * v for (_, k), v in self.y.items()), False))
        out.append(("fractions given back", sum(self.u.values()), False))
        for s, st in enumerate(pb.stages):
            most = st.replica_counts()[-1] + 1
            replicas = sum(k * v for (ss, k), v in self.y.items() if ss == s)
            out.append((f"GPUs, then replicas of {st.name}", most * self.gpu_count(s) + replicas, False))
            out.append((f"fraction of {st.name}", self.u[s], True))
        for c, members in enumerate(self.classes):  # which GPUs share which stages
            out.extend(lexicographic_phases(f"layout of GPUs {span(members)}", [self.n[c, P] for P in self.patterns],
                                      len(members)))
        return out

    def hint(self, solver) -> None:
        """Start the next phase from this solution."""
        self.m.ClearHints()
        for var in [*self.x.values(), *self.n.values(), *self.u.values(), *self.y.values()]:
            self.m.AddHint(var, solver.Value(var))

    def read(self, solver) -> tuple[tuple[StageAssignment, ...], tuple[int, ...]]:
        """The assignments and h[s] of a solution."""
        # Within a class, patterns take GPUs in the order of self.patterns (stage 0's first).
        stage_gpus: dict[int, list[int]] = {s: [] for s in range(len(self.pb.stages))}
        for c, members in enumerate(self.classes):
            free = iter(members)
            for P in self.patterns:
                for _ in range(solver.Value(self.n[c, P])):
                    g = next(free)
                    for s in stages_of(P):
                        stage_gpus[s].append(g)
        out = []
        for s, st in enumerate(self.pb.stages):
            option = next(o for o in range(len(st.options)) if solver.BooleanValue(self.x[s, o]))
            counts = st.replica_counts()
            replicas = next((k for k in counts if (s, k) in self.y and solver.BooleanValue(self.y[s, k])), counts[0])
            out.append(StageAssignment(option_index=option, gpus=tuple(sorted(stage_gpus[s])),
                                       util_steps=solver.Value(self.u[s]), replicas=replicas))
        return tuple(out), tuple(solver.Value(self.h[s]) for s in range(len(self.pb.stages)))


def max_milli(problem: Problem, s: int, max_bytes: int) -> int:
    """Upper bound of m[s]: the whole largest GPU as KV cache at the cheapest TP option."""
    st = problem.stages[s]
    if not st.has_kv:
        return 0
    cheapest = min(opt.memory.kv_bytes_per_token for opt in st.options)
    return MILLI * max_bytes // (cheapest * st.max_model_len)

r"""The CP-SAT model: place stages on GPUs and size their fractions.

Notation (the code uses the same names):
    s in S      stages;  c in K  classes of interchangeable GPUs (same host, kind and total
                C_c, pinned by the same stages: Problem.gpu_classes), |c| GPUs each;  h  hosts
    P in 2^S    patterns: the set of stages one GPU holds (a bit mask, stage 0 = bit 0)
    R           resolution (fraction steps per 1.0)
    o in O_s    TP options of stage s, with per-rank memory: in_o (inside the fraction),
                out_o (outside: context, NCCL, graph reserve), b_o KV bytes per token
    M in CO     co-resident sets: the maximal sets of stages that may be resident together
                (all stages, unless --exclusive groups say otherwise; see residency.py)
    L_s         max_model_len;  n_s  minimum requests;  w_s  weight (x100)
    q_s         max_num_seqs where KV beyond q_s requests is no headroom (no prefix caching)

Variables:
    x[s,o] in {0,1}    stage s runs at TP option o               sum_o x[s,o] = 1
    n[c,P] in 0..|c|   GPUs of class c holding exactly the stages P  sum_P n[c,P] <= |c|
                       (one stage per GPU over several hosts: n[c,P] = 0 for |P| > 1)
                       (GPUs are counted, never named: swapping two GPUs of a class is no
                       new plan, so no symmetry is left to break; _read lays the counts out)
    on[s,c] in {0,1}   stage s has a rank on class c (n[c,P] <= |c| on[s,c] for P containing s)
    u[s]   in 1..R     gpu_memory_utilization = u[s] / R
    kv[s]  >= 0        KV MiB per rank (the smallest over the stage's GPUs)
    m[s]   >= 0        KV capacity in thousandths of a max-length request
    h[s]   >= 0        headroom: m[s], capped at 1000 q_s where q_s applies
    y[s,k] in {0,1}    stage s runs k replicas (vLLM-Omni 0.20+ num_replicas; a stage that
                       may have more than one): h[s] <= k min(m[s], 1000 q_s): each replica
                       holds at least the pool's smallest KV (its GPUs share one fraction;
                       on a larger GPU a replica holds more, which is not counted)

Constraints, one function each:
    _add_choice          exactly one TP option (and replica count); the stage's GPU count
                         sum_{c,P containing s} n[c,P] = sum_o tp_o r[s,o], with r[s,o] in
                         0..k_max the replicas at option o: r[s,o] <= k_max x[s,o],
                         r[s,o] >= k_min x[s,o], sum_o r[s,o] = sum_k k y[s,k] (linear: no
                         Boolean per option and count)
    _add_hosts           with several hosts (classes never span one): on host h stage s holds
                         whole TP groups, sum_{c on h, P containing s} n[c,P] = sum_o tp_o r[s,h,o],
                         r[s,h,o] <= k_max x[s,o] (k_max: its largest replica count), and
                         sum_{h,o} r[s,h,o] = its replica count;
                         identical hosts in order: their pattern-count vectors are
                         lexicographically non-increasing (one weighted sum per pair)
    _add_pins            a TP degree or GPU set fixed by the user (--tp, --devices); a pinned
                         stage is on every GPU of the classes it names and on no other
    _add_gpu_capacity    for every class c, pattern P in use (n[c,P] >= 1) and co-resident M:
                         sum_{s in P and M} d[s,c] <= R (C_c - reserve),
                         d[s,c] >= C_c u[s] + 2R + R out_o  if x[s,o]
                         (R x requested + outside; the start-up checks of startup.py follow)
    _add_kv              R kv[s] <= C_c u[s] - R in_o   if on[s,c] and x[s,o]
                         generation stages: C_c u[s] >= R in_o
    _add_min_kv          kv[s] >= blocks(L_s) b_o and kv[s] >= blocks(n_s L_s) b_o  if x[s,o]
    _add_min_replicas    a target rate (--target-rate): sum_k k y[s,k] >= its minimum replicas
    _add_capacity_units  m[s] b_o L_s <= 1000 kv[s] MiB if x[s,o] (divided by their gcd);
                         h[s] <= m[s], h[s] <= 1000 q_s
    add_memory_bound     redundant cuts (bounds.py) for the LP bound of the max-min phase (all stages
                         co-resident only): the KV a stage counts, G[s,c] kv[s] per class,
                         plus every rank's other needs fits the classes' usable memory; h[s]
                         is held in it; kv[s] is at most the smallest class's room

Units: the model counts memory in whole MiB so that its coefficients stay small (CP-SAT's
presolve mishandled byte-sized coefficients here: it declared a feasible model
infeasible). Every rounding goes the safe way: capacities are floored, needs are rounded
up, and the 2R term in the demand covers vLLM's ceil() and the floored capacity. The
plan's reported figures are then recomputed in bytes and re-checked by `startup`.

Objective, lexicographic (each phase fixes the optimum of the one before; objective.py):
    1. maximise z with w_s z <= 100 h[s] for KV stages (the smallest weighted headroom)
    2. maximise sum_s h[s]
    2b. with replicas: minimise sum_s k y[s,k] (no replica that adds no headroom)
    3. minimise sum_s u[s]: what no stage can use goes back to the GPU as free memory
    4. canonical tie-break, per stage in order: the fewest GPUs, then the fewest replicas,
       then the largest u[s]; then per class the counts n[c,.] lexicographically largest
       in the pattern order (stage 0's patterns first), which _read lays out on the
       class's GPUs in index order: the plan is unique, whatever the worker count.
"""

from __future__ import annotations

from math import gcd

from .. import defaults as D
from ..vllm.facts import MiB
from .objective import Objective, max_milli
from .bounds import add_memory_bound
from .patterns import pattern_name, patterns, stages_of
from .problem import MILLI, Problem, mib_down as _down, mib_up as _up
from .solving import Solution, SolveStatus, StageAssignment, lexicographic, run_solver

__all__ = ["Model", "Solution", "SolveStatus", "StageAssignment", "feasibility", "run_solver", "solve"]


class Model(Objective):
    """Variables and constraints around one CpModel (built once, re-solved per phase).

    With `explain=True` every requirement group is enforced by an assumption literal
    (named as in `self.assume`) and the objective's variables are left out: the model is
    then only used to ask which requirements cannot hold together (explain.py).
    """

    def __init__(self, problem: Problem, explain: bool = False):
        from ortools.sat.python import cp_model

        self.cp = cp_model
        self.pb = problem
        self.explain = explain
        self.assume: dict[str, object] = {}
        self.m = cp_model.CpModel()
        S = range(len(problem.stages))
        R = problem.resolution
        self.max_c = max(_down(gpu.total_bytes) for gpu in problem.gpus)
        self.classes = problem.gpu_classes()
        self.patterns = patterns(len(problem.stages))
        self.x = {
            (s, o): self.m.NewBoolVar(f"x[{st.name}][tp={opt.tp}]")
            for s, st in enumerate(problem.stages)
            for o, opt in enumerate(st.options)
        }
        # n[c,P]: GPUs of class c that hold exactly the stages of pattern P
        self.n = {
            (c, P): self.m.NewIntVar(0, len(members), f"n[class{c}][{pattern_name(problem, P)}]")
            for c, members in enumerate(self.classes) for P in self.patterns
        }
        for c, members in enumerate(self.classes):
            self.m.Add(sum(self.n[c, P] for P in self.patterns) <= len(members))
        if not problem.shared_gpus:  # one stage per GPU (Problem.shared_gpus says why)
            for (c, P), var in self.n.items():
                if P & (P - 1):
                    self.m.Add(var == 0)
        # on[s,c]: stage s may have a rank on class c (forced by any of its patterns there)
        self.on = {(s, c): self.m.NewBoolVar(f"on[{problem.stages[s].name}][class{c}]")
                   for s in S for c in range(len(self.classes))}
        for (c, P), var in self.n.items():
            for s in stages_of(P):
                self.m.Add(var <= len(self.classes[c]) * self.on[s, c])
        # y[s,k]: stage s runs k replicas (only stages that may have more than one)
        self.counts = {s: self._replica_options(st) for s, st in enumerate(problem.stages)}
        self.y = {
            (s, k): self.m.NewBoolVar(f"replicas[{problem.stages[s].name}]={k}")
            for s, counts in self.counts.items() if counts != [1]
            for k in counts
        }
        self.r: dict[int, dict] = {}  # r[s][o]: replicas at TP option o (stages in y only; _add_choice)
        self.u = {s: self.m.NewIntVar(1, R, f"util[{problem.stages[s].name}]") for s in S}
        # When explaining, kv may go negative (a fraction short of the weights) so that
        # only the `fits` assumption, not the variable's domain, rules that out.
        low = -max(_up(o.memory.inside_bytes) for st in problem.stages for o in st.options) if explain else 0
        self.kv = {s: self.m.NewIntVar(low, self.max_c, f"kv[{problem.stages[s].name}]") for s in S}
        self._add_choice()
        self._add_hosts()
        self._add_pins()
        self._add_gpu_capacity()
        self._add_kv()
        self._add_min_kv()
        self._add_min_replicas()
        if not explain:
            self.mr = {
                s: self.m.NewIntVar(0, max_milli(problem, s, self.max_c * MiB), f"requests_milli[{problem.stages[s].name}]")
                for s in S
            }
            self.h = {s: self.m.NewIntVar(0, problem.stages[s].replica_counts()[-1] * max_milli(problem, s, self.max_c * MiB),
                                          f"headroom[{problem.stages[s].name}]")
                      for s in S}
            self._add_capacity_units()
            add_memory_bound(self)

    def _replica_options(self, st) -> list[int]:
        """The replica counts stage `st` may take. A count fixed by --replicas N is, when
        explaining, one requirement among others: 1 stays possible, N is required."""
        counts = list(st.replica_counts())
        if self.explain and st.fixed_replicas is not None and st.fixed_replicas > 1:
            return [1, st.fixed_replicas]
        return counts

    def _require(self, group: str, constraint) -> None:
        """Make `constraint` part of requirement `group` (an assumption when explaining)."""
        if self.explain:
            if group not in self.assume:
                self.assume[group] = self.m.NewBoolVar(group)
            constraint.OnlyEnforceIf(self.assume[group])

    def gpu_count(self, s: int):
        """The number of GPUs stage s holds: the sum of n over the patterns that contain it."""
        return sum(v for (c, P), v in self.n.items() if P >> s & 1)

    # --- constraint families ---------------------------------------------------

    def _add_choice(self) -> None:
        for s, st in enumerate(self.pb.stages):
            self.m.AddExactlyOne(self.x[s, o] for o in range(len(st.options)))
            counts = self.counts[s]
            if (s, counts[0]) not in self.y:
                self.m.Add(self.gpu_count(s) == sum(opt.tp * self.x[s, o] for o, opt in enumerate(st.options)))
                continue
            self.m.AddExactlyOne(self.y[s, k] for k in counts)
            if counts != list(st.replica_counts()):  # explaining a fixed --replicas N
                self._require(f"replicas[{st.name}]", self.m.Add(self.y[s, st.fixed_replicas] == 1))
            # r[s,o]: the replica count at TP option o (0 unless x[s,o]), linear in x and y
            # (no Boolean per option and count): the pool holds sum_o tp_o r[s,o] GPUs
            r = {o: self.m.NewIntVar(0, counts[-1], f"replicas[{st.name}][tp={opt.tp}]")
                 for o, opt in enumerate(st.options)}
            for o, v in r.items():
                self.m.Add(v <= counts[-1] * self.x[s, o])
                self.m.Add(v >= counts[0] * self.x[s, o])
            self.m.Add(sum(r.values()) == sum(k * self.y[s, k] for k in counts))
            self.r[s] = r
            self.m.Add(self.gpu_count(s) == sum(st.options[o].tp * v for o, v in r.items()))

    def replica_count(self, s: int):
        """The number of replicas of stage s: a variable's sum, or the one fixed count."""
        counts = self.counts[s]
        if (s, counts[0]) not in self.y:
            return counts[0]
        return sum(k * self.y[s, k] for k in counts)

    def _add_hosts(self) -> None:
        """A TP group never spans hosts: on each host a stage holds whole replicas,
        r[s,h,o] of them at TP option o (tp_o GPUs each), and they add up to its count."""
        if len(self.pb.nodes()) < 2:
            return
        nodes = self.pb.host_types()  # the hosts, or types of identical hosts (merge_hosts)
        host_classes = {h: [c for c, members in enumerate(self.classes)
                            if self.pb.host_type(self.pb.gpus[members[0]]) == h] for h in nodes}
        for s, st in enumerate(self.pb.stages):
            most = self.counts[s][-1]
            per_host = []
            for h in nodes:
                held = sum(v for (c, P), v in self.n.items() if c in host_classes[h] and P >> s & 1)
                r = {o: self.m.NewIntVar(0, most, f"replicas_on[{st.name}][{h if isinstance(h, str) else nodes.index(h)}]"
                                         f"[tp={opt.tp}]")
                     for o, opt in enumerate(st.options)}
                for o in r:
                    self.m.Add(r[o] <= most * self.x[s, o])
                    if not isinstance(h, str):  # a host type of m hosts: each holds at most G // tp groups
                        hosts = len({self.pb.gpus[g].node for c in host_classes[h] for g in self.classes[c]})
                        size = sum(len(self.classes[c]) for c in host_classes[h]) // hosts
                        self.m.Add(r[o] <= hosts * (size // st.options[o].tp))
                self.m.Add(held == sum(st.options[o].tp * v for o, v in r.items()))
                per_host.extend(r.values())
            self.m.Add(sum(per_host) == self.replica_count(s))
        self._add_host_symmetry(nodes, host_classes)

    def _add_host_symmetry(self, nodes: list[str], host_classes: dict[str, list[int]]) -> None:
        """Identical hosts (the same GPUs in the same order, no pins) are used in order:
        each one's pattern counts are lexicographically at least the next one's, so
        relabelling hosts makes no new plan. Encoded as one weighted sum per pair where
        the weights fit in 62 bits; beyond that the pair is left to the search."""
        def shape(h: str):
            return [(self.pb.gpus[self.classes[c][0]].name, self.pb.gpus[self.classes[c][0]].total_bytes,
                     len(self.classes[c]),
                     any(st.pinned_devices and self.classes[c][0] in st.pinned_devices for st in self.pb.stages))
                    for c in host_classes[h]]

        # only the patterns a GPU may hold (one stage each when GPUs are not shared)
        usable = [P for P in self.patterns if self.pb.shared_gpus or not P & (P - 1)]
        for a, b in zip(nodes, nodes[1:]):
            if shape(a) != shape(b) or any(pinned for *_, pinned in shape(a)):
                continue
            most = max(len(self.classes[c]) for c in host_classes[a]) + 1
            length = len(host_classes[a]) * len(usable)
            if most ** length >= 2 ** 62:
                continue

            def weighted(h: str):
                values = [self.n[c, P] for c in host_classes[h] for P in usable]
                return sum(most ** (length - 1 - i) * v for i, v in enumerate(values))
            self.m.Add(weighted(a) >= weighted(b))

    def _add_pins(self) -> None:
        for s, st in enumerate(self.pb.stages):
            if st.pinned_tp is not None:
                self._require(f"pinned-tp[{st.name}]", self.m.Add(self.x[s, st.option_index(st.pinned_tp)] == 1))
            if st.pinned_devices is not None:
                for c, members in enumerate(self.classes):  # a class is all pinned GPUs or none
                    on_class = sum(v for (cc, P), v in self.n.items() if cc == c and P >> s & 1)
                    wanted = len(members) if members[0] in st.pinned_devices else 0
                    self._require(f"pinned-devices[{st.name}]", self.m.Add(on_class == wanted))

    def _add_gpu_capacity(self) -> None:
        pb, R = self.pb, self.pb.resolution
        for c, members in enumerate(self.classes):
            gpu = pb.gpus[members[0]]
            demand = {}
            for s, st in enumerate(pb.stages):
                most = R * (_down(gpu.total_bytes) + 2 + max(_up(opt.memory.outside_bytes) for opt in st.options))
                d = self.m.NewIntVar(0, most, f"demand[{st.name}][class{c}]")
                for o, opt in enumerate(st.options):
                    need = _down(gpu.total_bytes) * self.u[s] + 2 * R + R * _up(opt.memory.outside_bytes)
                    self.m.Add(d >= need).OnlyEnforceIf(self.x[s, o])
                demand[s] = d
            capacity = R * _down(pb.usable_bytes(gpu))
            for P in self.patterns:
                active = self.m.NewBoolVar(f"active[class{c}][{pattern_name(pb, P)}]")
                self.m.Add(self.n[c, P] <= len(members) * active)
                for group in pb.coresident:
                    resident = [s for s in group if P >> s & 1]
                    if len(resident) < 1:
                        continue
                    fits = self.m.Add(sum(demand[s] for s in resident) <= capacity)
                    fits.OnlyEnforceIf(active)
                    self._require(f"capacity[gpu{members[0]}]", fits)

    def _add_kv(self) -> None:
        R = self.pb.resolution
        for s, st in enumerate(self.pb.stages):
            for c, members in enumerate(self.classes):
                gpu = self.pb.gpus[members[0]]
                for o, opt in enumerate(st.options):
                    lits = [self.on[s, c], self.x[s, o]]
                    budget = _down(gpu.total_bytes) * self.u[s] - R * _up(opt.memory.inside_bytes)
                    if st.has_kv:
                        self.m.Add(R * self.kv[s] <= budget).OnlyEnforceIf(lits)
                    else:
                        fits = self.m.Add(budget >= 0)
                        fits.OnlyEnforceIf(lits)
                        self._require(f"fits[{st.name}]", fits)
            if st.has_kv:
                self._require(f"fits[{st.name}]", self.m.Add(self.kv[s] >= 0))
            else:
                self.m.Add(self.kv[s] == 0)

    def _add_min_kv(self) -> None:
        for s, st in enumerate(self.pb.stages):
            if not st.has_kv:
                continue
            for o, opt in enumerate(st.options):
                one = self.m.Add(self.kv[s] >= _up(st.min_kv_bytes_for(opt, 1)))
                one.OnlyEnforceIf(self.x[s, o])
                self._require(f"max-model-len[{st.name}]", one)
                if st.min_requests > 1:
                    more = self.m.Add(self.kv[s] >= _up(st.min_kv_bytes(opt)))
                    more.OnlyEnforceIf(self.x[s, o])
                    self._require(f"min-concurrency[{st.name}]", more)

    def _add_min_replicas(self) -> None:
        """A target request rate's minimum (--target-rate, planning/rate.py): replicas >= min_replicas."""
        for s, st in enumerate(self.pb.stages):
            if st.min_replicas > 1:
                count = self.replica_count(s)
                count = self.m.NewConstant(count) if isinstance(count, int) else count
                self._require(f"rate[{st.name}]", self.m.Add(count >= st.min_replicas))

    def _add_capacity_units(self) -> None:
        for s, st in enumerate(self.pb.stages):
            if not st.has_kv:
                self.m.Add(self.mr[s] == 0)
                self.m.Add(self.h[s] == 0)
                continue
            for o, opt in enumerate(st.options):
                per_request = opt.memory.kv_bytes_per_token * st.max_model_len
                d = gcd(per_request, MILLI * MiB)
                self.m.Add(self.mr[s] * (per_request // d) <= (MILLI * MiB // d) * self.kv[s]).OnlyEnforceIf(
                    self.x[s, o]
                )
            counts = st.replica_counts()
            if (s, counts[0]) not in self.y:
                self.m.Add(self.h[s] <= self.mr[s])
                if st.headroom_cap_requests is not None:
                    self.m.Add(self.h[s] <= MILLI * st.headroom_cap_requests)
                continue
            # every replica holds at least the pool's smallest KV: k x capacity, each capped
            per_replica = self.m.NewIntVar(0, max_milli(self.pb, s, self.max_c * MiB), f"per_replica[{st.name}]")
            self.m.Add(per_replica <= self.mr[s])
            if st.headroom_cap_requests is not None:
                self.m.Add(per_replica <= MILLI * st.headroom_cap_requests)
            for k in counts:
                self.m.Add(self.h[s] <= k * per_replica).OnlyEnforceIf(self.y[s, k])

    # --- solving -----------------------------------------------------------------

    def solve_lexicographic(self, time_limit_s: float, workers: int) -> Solution:
        return lexicographic(self, time_limit_s, workers)

def feasibility(problem: Problem, time_limit_s: float, workers: int | None = None) -> SolveStatus:
    """Whether any plan satisfies `problem` (one solve, no objective): OPTIMAL when one
    exists, INFEASIBLE when proven impossible, UNKNOWN when time ran out first."""
    model = Model(problem)
    result, _ = run_solver(model.m, time_limit_s, workers or D.default_workers())
    if result in (model.cp.OPTIMAL, model.cp.FEASIBLE):
        return SolveStatus.OPTIMAL
    return SolveStatus.INFEASIBLE if result == model.cp.INFEASIBLE else SolveStatus.UNKNOWN


def solve(problem: Problem, time_limit_s: float = D.DEFAULT_TIME_LIMIT_S, workers: int | None = None) -> Solution:
    """Build the CP-SAT model of `problem` and solve it lexicographically. Pure: no I/O.
    Identical hosts merged (Problem.merge_hosts): solved as host types, laid out by hosts.py."""
    workers = workers or D.default_workers()
    if problem.merge_hosts:
        from .hosts import solve_merged

        return solve_merged(problem, time_limit_s, workers,
                            lambda pb, left, w: Model(pb).solve_lexicographic(left, w))
    return Model(problem).solve_lexicographic(time_limit_s, workers)

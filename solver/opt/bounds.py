"""Redundant cuts for the CP-SAT model (cpsat.Model): constraints every plan satisfies, added
only to bound the LP relaxation that the max-min phase's proof rests on."""

from __future__ import annotations

from math import gcd

from ..vllm.facts import MiB
from .problem import MILLI, mib_down, mib_up


def add_memory_bound(model) -> None:
    """Redundant cuts (every plan satisfies them; they only bound the LP relaxation, which
    the max-min phase's proof rests on). With all stages co-resident, every GPU's stages
    fit in it: sum over them of kv + in + out + 2 <= its usable MiB (from _add_kv and
    _add_gpu_capacity), so per class, with V[s,c] the KV MiB stage s counts on class c
    (G[s,c] kv[s], G[s,c] its GPUs there) and e_s its smallest per-rank need in + out + 2:
        V[s,c] <= G[s,c] (usable_c - e_s),  sum_s V[s,c] + e_s G[s,c] <= |c| usable_c,
    over all classes with each option's own need (tp_o r[s,o] GPUs at need e_o):
        sum_s sum_c V[s,c] + sum_{s,o} e_o tp_o r[s,o] <= sum_c |c| usable_c,
    and the headroom is held in it: h[s] min_o(tp_o b_o) L_s <= 1000 MiB sum_c V[s,c]
    (h[s] <= k m[s], m[s] b_o L_s <= 1000 MiB kv[s], k tp_o kv[s] = sum_c V[s,c]);
    kv[s] is the pool's smallest, so on class c at option o (on[s,c], x[s,o]):
        sum_c V[s,c] <= (usable_c - e_o) x (the stage's GPUs);
    each replica counts at most 1000 q_s: h[s] <= 1000 q_s k.
    Without them the max-min phase's LP bound started at the domain's top (10x the optimum
    on 64 GPUs of 8 kinds) and its proof took most of the solve (docs/speed.md)."""
    pb = model.pb
    if len(pb.coresident) != 1 or len(pb.coresident[0]) != len(pb.stages):
        return
    need = {s: [mib_up(opt.memory.inside_bytes) + mib_up(opt.memory.outside_bytes) + 2 for opt in st.options]
            for s, st in enumerate(pb.stages)}
    V: dict[tuple[int, int], object] = {}
    total = 0
    for c, members in enumerate(model.classes):
        usable = mib_down(pb.usable_bytes(pb.gpus[members[0]]))
        total += len(members) * usable
        terms = []
        for s, st in enumerate(pb.stages):
            held = sum(v for (cc, P), v in model.n.items() if cc == c and P >> s & 1)
            if st.has_kv:
                top = max(0, usable - min(need[s]))
                V[s, c] = model.m.NewIntVar(0, len(members) * top, f"kv_held[{st.name}][class{c}]")
                model.m.Add(V[s, c] <= top * held)
                terms.append(V[s, c])
            terms.append(min(need[s]) * held)
        model.m.Add(sum(terms) <= len(members) * usable)
    overall = []
    for s, st in enumerate(pb.stages):
        per_option = model.r.get(s) or {o: model.x[s, o] for o in range(len(st.options))}
        overall.append(sum(st.options[o].tp * need[s][o] * v for o, v in per_option.items()))
        if not st.has_kv:
            continue
        held = sum(V[s, c] for c in range(len(model.classes)))
        overall.append(held)
        gpus = model.gpu_count(s)
        for c, members in enumerate(model.classes):  # kv[s] is the smallest over the pool's classes
            for o in range(len(st.options)):
                top = max(0, mib_down(pb.usable_bytes(pb.gpus[members[0]])) - need[s][o])
                model.m.Add(held <= top * gpus).OnlyEnforceIf([model.on[s, c], model.x[s, o]])
        per_request = min(opt.tp * opt.memory.kv_bytes_per_token for opt in st.options) * st.max_model_len
        d = gcd(per_request, MILLI * MiB)
        model.m.Add(model.h[s] * (per_request // d) <= (MILLI * MiB // d) * held)
        if st.headroom_cap_requests is not None:
            model.m.Add(model.h[s] <= MILLI * st.headroom_cap_requests * model.replica_count(s))
    model.m.Add(sum(overall) <= total)

"""The planning problem as plain data: what the CP-SAT model and the brute-force oracle read.

Built by `planner.build_problem` from a request; holds only numbers (bytes, steps), so
the solvers never see catalogs, YAML or the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..inputs.gpus import Gpu, first_on_each_host
from ..vllm.facts import MiB
from ..memory.stage_memory import StageMemory, tokens_needed
from ..startup.residency import resident_sets

MILLI = 1000  # KV capacity is counted in thousandths of a max-length request


@dataclass(frozen=True)
class TpOption:
    """One TP degree a stage may run at, with its per-rank memory at that degree."""

    tp: int
    memory: StageMemory


@dataclass(frozen=True)
class StageProblem:
    """One stage's part of the problem."""

    stage_id: int
    name: str
    has_kv: bool
    options: tuple[TpOption, ...]
    max_model_len: int
    min_requests: int = 1  # KV stages: requests of max_model_len the cache must hold
    weight_pct: int = 100  # objective weight x 100 (--weight thinker=2 -> 200)
    pinned_tp: int | None = None  # --tp, or a config file's tensor_parallel_size kept by --fix
    pinned_devices: tuple[int, ...] | None = None  # --devices, or a config file's devices
    # KV capacity beyond this many requests is not headroom (None: every token counts).
    # Without prefix caching a request's blocks are freed when it ends, so at most
    # max_num_seqs requests can ever use the cache.
    headroom_cap_requests: int | None = None
    # Replicas: copies of the stage, each with its own TP group of GPUs (vLLM-Omni 0.20+
    # num_replicas); they share the TP degree and the fraction. 1..max_replicas.
    max_replicas: int = 1
    fixed_replicas: int | None = None
    # The fewest replicas a target request rate needs (--target-rate, planning/rate.py):
    # replicas >= min_replicas, one constraint in cpsat.py and a filter in bruteforce.py.
    min_replicas: int = 1

    @property
    def may_replicate(self) -> bool:
        """Whether the stage may run (or must run) more than one replica."""
        return self.replica_counts()[-1] > 1

    def replica_counts(self) -> range:
        if self.fixed_replicas is not None:
            return range(self.fixed_replicas, self.fixed_replicas + 1)
        return range(1, self.max_replicas + 1)

    def option_index(self, tp: int) -> int:
        return next(i for i, opt in enumerate(self.options) if opt.tp == tp)

    def min_kv_bytes_for(self, option: TpOption, requests: int) -> int:
        """KV bytes per rank that hold `requests` requests of max_model_len (whole blocks)."""
        if not self.has_kv:
            return 0
        return tokens_needed(self.max_model_len * requests) * option.memory.kv_bytes_per_token

    def min_kv_bytes(self, option: TpOption) -> int:
        """KV bytes per rank that hold `min_requests` requests of max_model_len."""
        return self.min_kv_bytes_for(option, self.min_requests)

    def milli_requests(self, kv_bytes: int, option: TpOption) -> int:
        """KV capacity in thousandths of a max-length request: the objective's unit."""
        if not self.has_kv or kv_bytes <= 0:
            return 0
        return MILLI * kv_bytes // (option.memory.kv_bytes_per_token * self.max_model_len)

    def headroom_milli(self, milli_requests: int, replicas: int = 1) -> int:
        """The part of `replicas` replicas' capacity (each `milli_requests`) that counts as
        headroom (each replica capped at max_num_seqs requests)."""
        if self.headroom_cap_requests is None:
            return replicas * milli_requests
        return replicas * min(milli_requests, MILLI * self.headroom_cap_requests)


@dataclass(frozen=True)
class Problem:
    """GPUs, stages, and the rules that bind them."""

    gpus: tuple[Gpu, ...]
    stages: tuple[StageProblem, ...]
    resolution: int  # gpu_memory_utilization steps per 1.0 (100 -> steps of 0.01)
    reserve_bytes: int  # per GPU, outside every fraction: admission reserve + margin + buffer
    # Each group lists stage indices that are never resident at the same time.
    exclusive_groups: tuple[tuple[int, ...], ...] = ()
    # Whether two stages may share a GPU. Not over several hosts: there each (host, stage)
    # is its own process, started without vLLM-Omni's per-GPU init locks, and vLLM sizes
    # its KV cache from what the GPU has free, neighbours' loading included.
    shared_gpus: bool = True
    # Memory the pipeline's API process takes on its host's first GPU once serving (a
    # model's front-end encoder), outside every stage: that GPU's usable memory is less by it.
    frontend_bytes: int = 0
    # Identical hosts (the same GPUs in the same order, no pinned stage) solved as one host
    # type with a multiplicity: its classes span those hosts and a stage holds whole TP groups
    # over the type (a relaxation of per host); hosts.py lays the answer out host by host.
    merge_hosts: bool = False
    coresident: tuple[tuple[int, ...], ...] = field(init=False)
    host_keys: dict[str, object] = field(init=False, repr=False, compare=False)
    first_gpus: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "coresident", resident_sets(len(self.stages), self.exclusive_groups))
        object.__setattr__(self, "first_gpus", frozenset(first_on_each_host(self.gpus)))
        keys: dict[str, object] = {}
        for node in dict.fromkeys(gpu.node for gpu in self.gpus):
            keys[node] = node
            if self.merge_hosts:
                on = [g for g in self.gpus if g.node == node]
                pins = any(st.pinned_devices and g.index in st.pinned_devices for st in self.stages for g in on)
                if not pins:
                    keys[node] = ("host type", tuple((g.name, g.total_bytes, self.usable_bytes(g)) for g in on))
        object.__setattr__(self, "host_keys", keys)

    def usable_bytes(self, gpu: Gpu) -> int:
        front = self.frontend_bytes if gpu.index in self.first_gpus else 0
        return gpu.total_bytes - self.reserve_bytes - front

    def gpu_classes(self) -> list[list[int]]:
        """GPU indices that no rule tells apart: on the same host (or host type), of the same kind and
        total, and named by exactly the same pinned stages; swapping two of them changes
        no figure. In the order of their first GPU."""
        classes: dict[tuple, list[int]] = {}
        for g, gpu in enumerate(self.gpus):
            pins = tuple(s for s, st in enumerate(self.stages) if st.pinned_devices and g in st.pinned_devices)
            classes.setdefault((self.host_keys[gpu.node], gpu.name, self.usable_bytes(gpu), pins), []).append(g)
        return list(classes.values())

    def nodes(self) -> list[str]:
        return list(dict.fromkeys(gpu.node for gpu in self.gpus))

    def host_types(self) -> list[object]:
        """The hosts as the model sees them: one per host, or one per type of identical hosts
        (merge_hosts), in the order of their first GPU."""
        return list(dict.fromkeys(self.host_keys[gpu.node] for gpu in self.gpus))

    def host_type(self, gpu: Gpu) -> object:
        return self.host_keys[gpu.node]


def mib_down(nbytes: int) -> int:
    return nbytes // MiB


def mib_up(nbytes: int) -> int:
    return -(-nbytes // MiB)

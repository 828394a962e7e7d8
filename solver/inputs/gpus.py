"""GPU catalog and the `--gpus` inventory syntax.

A GPU is a name and the total memory CUDA reports, in bytes. Catalog entries, NVML
readings and manual overrides all become the same `Gpu`, so the planner cannot tell
where a figure came from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..defaults import MAX_GPUS
from ..errors import CatalogError, InputError, closest_names
from ..vllm.facts import GiB


class GpuSpec(BaseModel):
    """One catalog entry (solver/data/gpus.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="Canonical name, as used in --gpus.")
    nvml_names: list[str] = Field(description="Names NVML reports for this part.")
    aliases: list[str] = Field(default_factory=list, description="Other accepted names.")
    gpu_product_labels: list[str] = Field(
        default_factory=list,
        description="Values of the node label nvidia.com/gpu.product that NVIDIA GPU feature discovery sets for this "
                    "part (its NVML names, sanitised as k8s-device-plugin v0.20.0 internal/lm/resource.go does); "
                    "empty: unknown, and `--format k8s` writes no node selector.")
    total_gib: float | None = Field(default=None, gt=0, lt=4096, description="CUDA total, GiB, 2 decimals.")
    total_bytes: int | None = Field(default=None, gt=0, description="CUDA total in bytes, when known exactly.")
    nvlink: bool = Field(description="Whether the part has NVLink between GPUs of a node.")
    estimated: bool = Field(default=False, description="No direct evidence for the total.")
    bf16: bool = Field(default=True, description="Compute capability 8.0 or more: vLLM runs dtype bfloat16.")

    @model_validator(mode="after")
    def _one_total(self) -> "GpuSpec":
        if (self.total_gib is None) == (self.total_bytes is None):
            raise ValueError("give exactly one of total_gib and total_bytes")
        return self

    @property
    def capacity_bytes(self) -> int:
        """The smallest byte count consistent with the catalog figure."""
        if self.total_bytes is not None:
            return self.total_bytes
        # A total printed as 79.11 GiB is at least 79.105 GiB.
        return int((self.total_gib - 0.005) * GiB)


DEFAULT_NODE = "node0"


@dataclass(frozen=True)
class Gpu:
    """One physical GPU of the inventory: its index over all hosts (hosts in the order
    given, each in CUDA order), name, total bytes, and the host it is on."""

    index: int
    name: str
    total_bytes: int
    node: str = DEFAULT_NODE


def node_names(gpus) -> list[str]:
    """The hosts of an inventory, in order."""
    return list(dict.fromkeys(g.node for g in gpus))


def refuses_bf16(gpu: Gpu) -> bool:
    """Whether vLLM refuses an explicit dtype bfloat16 on this GPU (compute capability
    below 8.0: vllm 0.30.0 platforms/cuda.py check_if_supports_dtype). A name the catalog
    does not know is taken as able."""
    try:
        return not lookup_gpu(gpu.name).bf16
    except InputError:
        return False


def first_on_each_host(gpus) -> set[int]:
    """The index of each host's first GPU: where an API process lands (cuda:0 of its host;
    which host is the head is chosen after the plan, so every host's counts)."""
    return {next(g.index for g in gpus if g.node == node) for node in node_names(gpus)}


def local_index(gpus, gpu: Gpu) -> int:
    """The GPU's index on its own host: what a deploy file on that host names it by."""
    return sum(1 for g in gpus[:gpu.index] if g.node == gpu.node)


def _key(name: str) -> str:
    """Case- and punctuation-insensitive lookup key: 'NVIDIA H100 80GB HBM3' -> 'h10080gbhbm3'."""
    k = re.sub(r"[^a-z0-9]", "", name.lower())
    for prefix in ("nvidia", "geforce", "tesla"):
        if k.startswith(prefix) and len(k) > len(prefix):
            k = k[len(prefix):]
    return k


@lru_cache(maxsize=1)
def gpu_catalog() -> dict[str, GpuSpec]:
    """Load and validate the shipped GPU catalog, keyed by canonical name."""
    text = resources.files("omni_autoconf.data").joinpath("gpus.yaml").read_text()
    raw = yaml.safe_load(text)
    specs: dict[str, GpuSpec] = {}
    for i, entry in enumerate(raw.get("gpus", [])):
        try:
            spec = GpuSpec.model_validate(entry)
        except ValidationError as exc:
            raise CatalogError(f"gpus.yaml: entry {i}: {exc.errors()[0]['msg']}") from None
        specs[spec.name] = spec
    return specs


@lru_cache(maxsize=1)
def _alias_index() -> dict[str, GpuSpec]:
    index: dict[str, GpuSpec] = {}
    for spec in gpu_catalog().values():
        for name in [spec.name, *spec.nvml_names, *spec.aliases]:
            index.setdefault(_key(name), spec)
    return index


def lookup_gpu(name: str) -> GpuSpec:
    """Find a GPU by canonical name, alias or NVML name, ignoring case and punctuation."""
    spec = _alias_index().get(_key(name))
    if spec is None:
        raise InputError(f"unknown GPU {name!r}{closest_names(name, sorted(gpu_catalog()), '`omni-autoconf gpus`')}")
    return spec


# ASCII digits only (\d would take full-width and other Unicode digits); a few of them.
_TERM = re.compile(r"^\s*(?:([0-9]{1,6})\s*[xX*]\s*)?([A-Za-z0-9][A-Za-z0-9 _.-]*?)\s*$", re.ASCII)


def parse_gpus(text: str) -> list[Gpu]:
    """Parse `2xH100-80GB,1xA100-40GB` into GPUs indexed in the order written."""
    if not text or not text.strip():
        raise InputError("--gpus is empty; expected terms like 2xH100-80GB joined by commas")
    if len(text) > 4096:
        raise InputError("--gpus is longer than 4096 characters")
    gpus: list[Gpu] = []
    for term in text.split(","):
        shown = term.strip()[:40]
        lead = re.match(r"\s*([0-9]+)\s*[xX*]", term)
        if lead and (len(lead.group(1)) > 6 or int(lead.group(1)) > MAX_GPUS):
            raise InputError(f"--gpus term {shown!r}: more than {MAX_GPUS} GPUs, the most this tool plans")
        m = _TERM.match(term)
        if not m or re.fullmatch(r"\s*[0-9]+\s*[xX*]?\s*", term):
            raise InputError(f"malformed --gpus term {shown!r}; expected NxNAME, e.g. 2xH100-80GB")
        count = int(m.group(1)) if m.group(1) is not None else 1
        if count < 1:
            raise InputError(f"--gpus term {shown!r}: the count must be at least 1")
        if len(gpus) + count > MAX_GPUS:
            raise InputError(f"--gpus lists more than {MAX_GPUS} GPUs, the most this tool plans")
        spec = lookup_gpu(m.group(2))
        for _ in range(count):
            gpus.append(Gpu(index=len(gpus), name=spec.name, total_bytes=spec.capacity_bytes))
    return gpus


# A DNS label's letters (names go into files and into launch.sh): 1 to 63 characters,
# starting and ending with a letter or digit.
_NODE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?", re.ASCII)


def parse_inventory(text: str, nodes: int | None = None) -> list[Gpu]:
    """The GPUs of one host (`2xH100-80GB`), of N identical hosts (`nodes`=N, named
    node0..), or of named hosts: `node0=8xH100-80GB;node1=4xL40S`. Indices run over all
    hosts in order; a tensor-parallel group never spans two of them."""
    if text and ("=" in text or ";" in text):
        if nodes is not None:
            raise InputError("--nodes repeats one host's --gpus; with named hosts (NAME=...;NAME=...) leave it out")
        hosts = []
        for part in text.split(";"):
            name, sep, terms = part.partition("=")
            name = name.strip()
            if not sep:
                raise InputError(f"--gpus host {part.strip()[:40]!r}: expected NAME=TERMS, e.g. node0=8xH100-80GB")
            if not _NODE_NAME.fullmatch(name):
                raise InputError(f"--gpus host name {name[:40]!r}: 1 to 63 letters, digits, '.', '_' or '-', "
                                 "starting and ending with a letter or digit")
            if name.lower() in (h.lower() for h, _ in hosts):  # their files would collide where case does not count
                raise InputError(f"--gpus names host {name!r} twice (host names are compared ignoring case)")
            hosts.append((name, terms))
    else:
        count = 1 if nodes is None else nodes
        if not 1 <= count <= MAX_GPUS:
            raise InputError(f"--nodes {count}: must be 1 to {MAX_GPUS}")
        hosts = [(DEFAULT_NODE if count == 1 else f"node{i}", text) for i in range(count)]
    gpus: list[Gpu] = []
    for name, terms in hosts:
        try:
            local = parse_gpus(terms)
        except InputError as exc:
            raise InputError(f"{exc} (host {name})" if len(hosts) > 1 else str(exc)) from None
        if len(gpus) + len(local) > MAX_GPUS:
            raise InputError(f"--gpus lists more than {MAX_GPUS} GPUs over all hosts, the most this tool plans")
        gpus += [Gpu(len(gpus) + g.index, g.name, g.total_bytes, name) for g in local]
    return gpus

"""A plan over several hosts: one deploy file per host and the commands that start it.

How vLLM-Omni 0.22-0.30 runs a pipeline over hosts (vllm_omni/entrypoints/cli/serve.py,
engine/stage_engine_startup.py of those wheels):

- One host runs the head: `vllm serve MODEL --omni --deploy-config FILE --stage-id K
  --omni-master-address A --omni-master-port P --omni-dp-size-local N`. It serves the API,
  runs N replicas of its own stage K and the master (OmniMasterServer) that the other
  stages register with. For every other stage it pre-allocates as many replica slots as
  the file's `num_replicas` (at least 1) and waits for them; registrations beyond those get
  fresh replica ids and are attached as they come (`_next_free_replica_id`).
- Every other (host, stage) runs `vllm serve MODEL --omni --deploy-config FILE --headless
  --stage-id J -oma A -omp P --omni-dp-size-local n`: n local replicas of stage J, their
  devices split from the file's `devices` by `split_devices_for_replicas(devices, n, tp)`
  (a pool of n x tp ids of that host), and from 0.28 checked by `check_device_layout`
  against the file's `num_replicas`. So each host gets its own file: its local pool and
  count per stage it runs, and no placement for stages it does not run.
- Stages talk through connectors; SharedMemoryConnector is local to one host
  (distributed/omni_connectors/connectors/shm_connector.py). An edge whose stages are
  not all on one host uses MooncakeStoreConnector, vLLM-Omni's documented multi-node
  connector ("TCP-based, requires Mooncake Master + metadata server",
  https://docs.vllm.ai/projects/vllm-omni/en/latest/design/feature/disaggregated_inference/).

The plan itself (which GPUs, TP groups within one host) is the planner's; this module only
writes it out.
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass, field

from .gpus import local_index, node_names
from .planner import Plan

MASTER_PORT = 29600  # a default for --omni-master-port; any free TCP port on the head host
MOONCAKE_RPC_PORT = 50051  # mooncake_master --rpc_port, the docs' value
MOONCAKE_METADATA_PORT = 8080  # mooncake_master --http_metadata_server_port, the docs' value
CROSS_HOST_CONNECTOR = "connector_across_hosts"


@dataclass(frozen=True)
class HostLayout:
    """What one host's deploy file says: per stage id, its local devices and replica
    count there (absent: the stage runs elsewhere), and the connector of each edge."""

    node: str
    devices: dict[int, tuple[int, ...]]
    replicas: dict[int, int]
    connectors: dict[str, dict] = field(default_factory=dict)  # top-level `connectors:` entries to add
    inputs: dict[int, dict[str, str]] = field(default_factory=dict)  # stage id -> input_connectors


def edges(plan: Plan) -> list[tuple[int, int]]:
    """(from, to) stage ids of the pipeline's data flow (engine_input_source)."""
    out = []
    for sp in plan.stages:
        for source in sp.stage.legacy_fields.get("engine_input_source") or []:
            out.append((int(source), sp.stage.stage_id))
    return out


def stage_hosts(plan: Plan) -> dict[int, set[str]]:
    gpus = [g.gpu for g in plan.gpus]
    return {sp.stage.stage_id: {gpus[d].node for d in sp.devices} for sp in plan.stages}


def cross_host_edges(plan: Plan) -> list[tuple[int, int]]:
    """Edges whose two stages are not all on one and the same host: a request may then
    leave one host (the head routes each request to any replica)."""
    hosts = stage_hosts(plan)
    return [(a, b) for a, b in edges(plan) if len(hosts[a] | hosts[b]) > 1]


def _cross_host_connector(plan: Plan, node: str, head: str) -> dict:
    """MooncakeStoreConnector with the keys its docs name; the local connector's stage-side
    keys (codec chunking) are kept. `host` is this host's name as --gpus gave it."""
    local = (plan.request.pipeline.deploy_top.get("connectors") or {})
    extra = {}
    for spec in local.values():
        extra.update(copy.deepcopy(spec.get("extra") or {}))
    extra.update(host=node, metadata_server=f"http://{head}:{MOONCAKE_METADATA_PORT}/metadata",
                 master=f"{head}:{MOONCAKE_RPC_PORT}", proto="tcp")
    return {"name": "MooncakeStoreConnector", "extra": extra}


def head_of(plan: Plan) -> tuple[str, int]:
    """(host, stage id) of the head: the first host that runs a stage, its first stage."""
    hosts = stage_hosts(plan)
    for node in node_names([g.gpu for g in plan.gpus]):
        for sp in plan.stages:
            if node in hosts[sp.stage.stage_id]:
                return node, sp.stage.stage_id
    raise ValueError("a plan without stages")  # the planner never makes one


def layouts(plan: Plan) -> list[HostLayout]:
    gpus = [g.gpu for g in plan.gpus]
    head, _ = head_of(plan)
    crossing = cross_host_edges(plan)
    out = []
    for node in node_names(gpus):
        devices, replicas = {}, {}
        for sp in plan.stages:
            local = tuple(local_index(gpus, gpus[d]) for d in sp.devices if gpus[d].node == node)
            if local:
                devices[sp.stage.stage_id] = local
                replicas[sp.stage.stage_id] = len(local) // sp.tensor_parallel_size
        connectors, inputs = {}, {}
        if crossing:
            connectors[CROSS_HOST_CONNECTOR] = _cross_host_connector(plan, node, head)
            for a, b in crossing:
                inputs.setdefault(b, {})[f"from_stage_{a}"] = CROSS_HOST_CONNECTOR
        out.append(HostLayout(node, devices, replicas, connectors, inputs))
    return out


def file_name(node: str) -> str:
    return f"{node}.yaml"


def commands(plan: Plan, layout: HostLayout) -> list[str]:
    """The processes of one host, head first where it runs: `vllm serve` per stage."""
    request = plan.request
    # a catalog name is no model vLLM can load: its Hugging Face id is
    reference = request.model_ref if request.model_ref not in (None, request.pipeline.name) else request.pipeline.hf_id
    model = shlex.quote(reference)
    head, head_stage = head_of(plan)
    out = []
    for stage_id in sorted(layout.replicas, key=lambda s: (s != head_stage or layout.node != head, s)):
        n = layout.replicas[stage_id]
        role = "" if (layout.node, stage_id) == (head, head_stage) else " --headless"
        out.append(f"vllm serve {model} --omni --deploy-config {file_name(layout.node)}{role} --stage-id {stage_id} "
                   f"--omni-master-address \"$OMNI_MASTER_ADDR\" --omni-master-port \"$OMNI_MASTER_PORT\" "
                   f"--omni-dp-size-local {n}")
    return out


def launch_script(plan: Plan, header: str) -> str:
    """A POSIX shell script: `launch.sh HOST` starts that host's processes."""
    head, head_stage = head_of(plan)
    lines = [
        "#!/bin/sh",
        header.rstrip("\n"),
        f"# Run `sh launch.sh HOST` on each host, in the folder of its deploy file; {head} (the head, stage "
        f"{head_stage}, which serves the API) first.",
        f"# OMNI_MASTER_ADDR: an address of {head} that every host reaches; OMNI_MASTER_PORT: a free TCP port there.",
    ]
    if cross_host_edges(plan):
        lines.append(f"# Cross-host edges use MooncakeStoreConnector over TCP: start `mooncake_master --rpc_port="
                     f"{MOONCAKE_RPC_PORT} --enable_http_metadata_server=true --http_metadata_server_port="
                     f"{MOONCAKE_METADATA_PORT}` on {head} first (pip install mooncake-transfer-engine on every "
                     "host); the files name hosts by their --gpus names, which must resolve on every host.")
    lines += [
        "set -eu",
        f": \"${{OMNI_MASTER_ADDR:={head}}}\"",
        f": \"${{OMNI_MASTER_PORT:={MASTER_PORT}}}\"",
        "export OMNI_MASTER_ADDR OMNI_MASTER_PORT",
        'case "${1:-}" in',
    ]
    for layout in layouts(plan):
        lines.append(f"  {layout.node})")
        host_commands = commands(plan, layout)
        if not host_commands:  # a GPU that adds no headroom is left idle, a host likewise
            lines += [f'    echo "launch.sh: this plan runs nothing on {layout.node}" >&2', "    ;;"]
            continue
        for command in host_commands:
            lines.append(f"    {command} &")
        lines += ["    wait", "    ;;"]
    names = " ".join(node_names([g.gpu for g in plan.gpus]))
    lines += [f'  *) echo "usage: sh launch.sh HOST (one of: {names})" >&2; exit 2 ;;', "esac"]
    return "\n".join(lines) + "\n"

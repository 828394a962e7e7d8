"""A plan over several hosts: the deploy files and the commands that start it.

How vLLM-Omni 0.26-0.30 runs a pipeline over hosts, as its code reads (vllm-omni wheels,
vllm_omni/entrypoints/cli/serve.py, engine/stage_engine_startup.py, engine/stage_runtime.py):

- One process is the head: `vllm serve MODEL --omni --deploy-config head.yaml --stage-id K
  --omni-master-address A --omni-master-port P --omni-dp-size-local N`. It serves the API,
  runs N replicas of its stage K and the master (OmniMasterServer) the other stages
  register with. For every other stage it pre-allocates as many replica slots as head.yaml's
  `num_replicas` and waits for them. A registration beyond those slots is attached only
  once the head's init is done, while the registering engine gives up its handshake after
  5 minutes; so head.yaml pre-allocates every replica of every other stage, and replicas of
  stage K on other hosts (never pre-allocated) start once the head answers /health.
- head.yaml gives each other stage the devices template 0..TP-1: the head splits every
  stage's devices, and 0.26 fails (IndexError) on `num_replicas` > 1 without devices; the
  values are never used, remote replicas drop their runtime.
- Every other (host, stage) runs `vllm serve MODEL --omni --deploy-config host-<host>.yaml
  --headless --stage-id J -oma A -omp P --omni-dp-size-local n`: n local replicas of stage J,
  their devices split from the file's `devices` (a pool of n x TP local ids) by
  `split_devices_for_replicas`, checked from 0.28 by `check_device_layout` against the
  file's `num_replicas` (n).
- A stage worker uses one connector, its first inbound edge's, to receive and to send; so
  once any edge crosses hosts, every edge uses MooncakeStoreConnector, vLLM-Omni's
  documented multi-node connector ("TCP-based, requires Mooncake Master + metadata
  server", https://docs.vllm.ai/projects/vllm-omni/en/latest/design/feature/disaggregated_inference/).
  SharedMemoryConnector is local to one host. Before 0.26 headless stages pass
  async_chunk=False to get_stage_connector_spec and so ignore the file's connectors: no edge
  can cross hosts there.
- Each (host, stage) is its own process without vLLM-Omni's per-GPU init locks, and vLLM
  sizes KV from the GPU's free memory: the planner gives every GPU one stage
  (Problem.shared_gpus).

Nothing of this has run on a real cluster: it is read from the code.
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass, field

from ..inputs.gpus import local_index, node_names
from ..planning.planner import Plan

MASTER_PORT = 29600  # a default for --omni-master-port; any free TCP port on the head host
API_PORT = 8000  # vLLM's own default --port, written out so that launch.sh can poll /health
# Model loading, compilation and graph capture of every stage before the head is ready can
# pass vLLM-Omni's defaults (--stage-init-timeout 300 s, --init-timeout 600 s): an estimate.
STAGE_INIT_TIMEOUT_S = 1800
INIT_TIMEOUT_S = 3600
MOONCAKE_RPC_PORT = 50051  # mooncake_master --rpc_port, the docs' value
MOONCAKE_METADATA_PORT = 8080  # mooncake_master --http_metadata_server_port, the docs' value
CROSS_HOST_CONNECTOR = "connector_across_hosts"
HEAD_FILE = "head.yaml"


@dataclass(frozen=True)
class HostLayout:
    """What one deploy file says: per stage id, its devices and replica count (absent: no
    placement), and the connectors of its edges."""

    node: str
    devices: dict[int, tuple[int, ...]]
    replicas: dict[int, int]
    connectors: dict[str, dict] = field(default_factory=dict)  # top-level `connectors:` entries to add
    inputs: dict[int, dict[str, str]] = field(default_factory=dict)  # stage id -> input_connectors
    head: bool = False  # the head's file (head.yaml)


def edges(plan: Plan) -> list[tuple[int, int]]:
    """(from, to) stage ids of the pipeline's data flow."""
    return [(source, sp.stage.stage_id) for sp in plan.stages for source in sp.stage.input_stage_ids]


def stage_hosts(plan: Plan) -> dict[int, set[str]]:
    gpus = [g.gpu for g in plan.gpus]
    return {sp.stage.stage_id: {gpus[d].node for d in sp.devices} for sp in plan.stages}


def crosses_hosts(plan: Plan) -> bool:
    """Whether a request may leave a host: some edge's stages are not all on one host
    (the head routes each request to any replica)."""
    hosts = stage_hosts(plan)
    return any(len(hosts[a] | hosts[b]) > 1 for a, b in edges(plan))


def head_of(plan: Plan) -> tuple[str, int]:
    """(host, stage id) of the head. Its host builds a vLLM config for every stage, so it
    needs the largest TP degree's GPUs; among those, a stage held by that host alone comes
    first (nothing of it has to wait for the head), then host order, then stage order."""
    gpus = [g.gpu for g in plan.gpus]
    hosts = stage_hosts(plan)
    widest = max(sp.tensor_parallel_size for sp in plan.stages)
    candidates = []
    for h, node in enumerate(node_names(gpus)):
        if sum(1 for g in gpus if g.node == node) < widest:
            continue
        for s, sp in enumerate(plan.stages):
            if node in hosts[sp.stage.stage_id]:
                candidates.append((hosts[sp.stage.stage_id] != {node}, h, s, node, sp.stage.stage_id))
    if not candidates:
        raise ValueError("no host holds the widest TP group")  # never: that group is on some host
    *_, node, stage_id = min(candidates)
    return node, stage_id


def _connector(plan: Plan, node: str, master: str) -> dict:
    """MooncakeStoreConnector with the keys its docs name; the local connector's stage-side
    keys (codec chunking) are kept. `host` is this host's name as --gpus gave it."""
    extra = {}
    for spec in (plan.request.pipeline.deploy_top.get("connectors") or {}).values():
        extra.update(copy.deepcopy(spec.get("extra") or {}))
    extra.update(host=node, metadata_server=f"http://{master}:{MOONCAKE_METADATA_PORT}/metadata",
                 master=f"{master}:{MOONCAKE_RPC_PORT}", proto="tcp")
    return {"name": "MooncakeStoreConnector", "extra": extra}


def _wiring(plan: Plan, node: str, master: str, crossing: bool) -> tuple[dict, dict]:
    if not crossing:
        return {}, {}
    inputs: dict[int, dict[str, str]] = {}
    for a, b in edges(plan):
        inputs.setdefault(b, {})[f"from_stage_{a}"] = CROSS_HOST_CONNECTOR
    return {CROSS_HOST_CONNECTOR: _connector(plan, node, master)}, inputs


def layouts(plan: Plan) -> list[HostLayout]:
    """The head's file, then one file per host for its headless processes."""
    gpus = [g.gpu for g in plan.gpus]
    head, head_stage = head_of(plan)
    crossing = crosses_hosts(plan)
    per_host = []
    for node in node_names(gpus):
        devices, replicas = {}, {}
        for sp in plan.stages:
            local = tuple(local_index(gpus, gpus[d]) for d in sp.devices if gpus[d].node == node)
            if local:
                devices[sp.stage.stage_id] = local
                replicas[sp.stage.stage_id] = len(local) // sp.tensor_parallel_size
        connectors, inputs = _wiring(plan, node, head, crossing)
        per_host.append(HostLayout(node, devices, replicas, connectors, inputs))
    own = next(h for h in per_host if h.node == head)
    devices = {sp.stage.stage_id: tuple(range(sp.tensor_parallel_size)) for sp in plan.stages}
    replicas = {sp.stage.stage_id: sp.num_replicas for sp in plan.stages}
    devices[head_stage], replicas[head_stage] = own.devices[head_stage], own.replicas[head_stage]
    connectors, inputs = _wiring(plan, head, head, crossing)
    return [HostLayout(head, devices, replicas, connectors, inputs, head=True), *per_host]


def file_name(layout: HostLayout) -> str:
    """head.yaml, or host-NAME.yaml: no host name can make the head's file name."""
    return HEAD_FILE if layout.head else f"host-{layout.node}.yaml"


def _model(plan: Plan) -> str:
    request = plan.request
    # a catalog name is no model vLLM can load: its Hugging Face id is
    reference = request.model_ref if request.model_ref not in (None, request.pipeline.name) else request.pipeline.hf_id
    return shlex.quote(reference)


def commands(plan: Plan, node: str, all_layouts: list[HostLayout]) -> list[tuple[str, bool]]:
    """The processes of one host, the head first where it runs there: (command, whether
    it waits for the head's /health first). `all_layouts`: layouts(plan)."""
    head, head_stage = head_of(plan)
    master = '--omni-master-address "$OMNI_MASTER_ADDR" --omni-master-port "$OMNI_MASTER_PORT"'
    out = []
    if node == head:
        n = all_layouts[0].replicas[head_stage]
        out.append((f"vllm serve {_model(plan)} --omni --deploy-config {HEAD_FILE} --stage-id {head_stage} {master} "
                    f"--omni-dp-size-local {n} --port \"$OMNI_API_PORT\" --stage-init-timeout {STAGE_INIT_TIMEOUT_S} "
                    f"--init-timeout {INIT_TIMEOUT_S}", False))
    layout = next(h for h in all_layouts[1:] if h.node == node)
    for stage_id in sorted(layout.replicas):
        if (node, stage_id) == (head, head_stage):
            continue
        out.append((f"vllm serve {_model(plan)} --omni --deploy-config {file_name(layout)} --headless "
                    f"--stage-id {stage_id} {master} --omni-dp-size-local {layout.replicas[stage_id]}",
                    stage_id == head_stage))
    return out


def launch_script(plan: Plan, header: str, all_layouts: list[HostLayout]) -> str:
    """A POSIX shell script: `sh launch.sh HOST` starts that host's processes.
    `all_layouts`: layouts(plan)."""
    head, head_stage = head_of(plan)
    lines = [
        "#!/bin/sh",
        header.rstrip("\n"),
        f"# Run `sh launch.sh HOST` on each host, in the folder of these files; on {head} (the head: stage "
        f"{head_stage}, the API on port $OMNI_API_PORT) first.",
        f"# OMNI_MASTER_ADDR: an IP address of {head} that every host reaches (its name only if it resolves to that "
        "interface everywhere); OMNI_MASTER_PORT: a free TCP port there.",
        "# The start-up sequence is read from vLLM-Omni's code; no cluster has run it yet.",
    ]
    if crosses_hosts(plan):
        lines.append(f"# Every edge uses MooncakeStoreConnector over TCP: start `mooncake_master --rpc_port="
                     f"{MOONCAKE_RPC_PORT} --enable_http_metadata_server=true --http_metadata_server_port="
                     f"{MOONCAKE_METADATA_PORT}` on {head} first (pip install mooncake-transfer-engine on every "
                     "host); the files name hosts by their --gpus names, which must resolve on every host.")
    names = node_names([g.gpu for g in plan.gpus])
    lines += [
        "set -eu",
        'case "${1:-}" in',
        f"  {'|'.join(names)}) ;;",
        f'  *) echo "usage: sh launch.sh HOST (one of: {" ".join(names)})" >&2; exit 2 ;;',
        "esac",
        f': "${{OMNI_MASTER_ADDR:?set OMNI_MASTER_ADDR to an IP address of {head}}}"',
        f': "${{OMNI_MASTER_PORT:={MASTER_PORT}}}"',
        f': "${{OMNI_API_PORT:={API_PORT}}}"',
        f': "${{OMNI_HEAD_WAIT_S:={INIT_TIMEOUT_S}}}"',
        "export OMNI_MASTER_ADDR OMNI_MASTER_PORT OMNI_API_PORT",
        'cd "$(dirname "$0")"  # the deploy files lie beside this script',
        'pids=""',
        "trap 'kill $pids 2>/dev/null; exit 130' INT  # stopping the script stops its processes",
        "trap 'kill $pids 2>/dev/null; exit 143' TERM",
        'start() { "$@" & pids="$pids $!"; }',
        "wait_for_head() {  # replicas of the head's stage register only once the head serves",
        "  waited=0",
        '  until curl -fsS "http://$OMNI_MASTER_ADDR:$OMNI_API_PORT/health" >/dev/null 2>&1; do',
        '    [ "$waited" -lt "$OMNI_HEAD_WAIT_S" ] || { echo "launch.sh: the head did not answer in time" >&2; exit 1; }',
        "    sleep 10; waited=$((waited + 10))",
        "  done",
        "}",
        'case "$1" in',
    ]
    for node in names:
        lines.append(f"  {node})")
        host_commands = commands(plan, node, all_layouts)
        if not host_commands:  # a GPU that adds no headroom is left idle, a host likewise
            lines += [f'    echo "launch.sh: this plan runs nothing on {node}" >&2', "    ;;"]
            continue
        for command, after_head in host_commands:
            lines.append(f'    (wait_for_head && exec {command}) & pids="$pids $!"' if after_head else f"    start {command}")
        lines += ["    ;;"]
    lines += ["esac", "status=0  # the first failure among this host's processes, if any",
              'for pid in $pids; do wait "$pid" || { code=$?; [ "$status" -ne 0 ] || status=$code; }; done',
              'exit "$status"']
    return "\n".join(lines) + "\n"


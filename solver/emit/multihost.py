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

Host addresses are no names fixed in the files: each MooncakeStoreConnector address is an
OmegaConf environment interpolation (`${oc.env:OMNI_MASTER_ADDR,'node0'}`), which every
version from 0.26 resolves when it loads a deploy file (vllm_omni/config/stage_config.py
resolve_deploy_yaml: `to_dict(load_yaml_config(path))`, OmegaConf.load then
OmegaConf.to_container(resolve=True); `oc.env` with a default is OmegaConf 2.1+'s,
https://omegaconf.readthedocs.io/en/2.3_branch/custom_resolvers.html#oc-env). The default,
the host's --gpus name, is what a bare host without the variable gets (as before);
launch.sh and the Kubernetes manifests always set the variables.

Nothing of this has run on a real cluster: it is read from the code.
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass, field

from ..inputs.checkpoint import looks_like_hub_id
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
# The environment a host's processes read (launch.sh and the Kubernetes manifests set them):
MASTER_ADDR_ENV = "OMNI_MASTER_ADDR"  # an address of the head host: the omni master and Mooncake's master
HOST_ADDR_ENV = "OMNI_HOST_ADDR"  # this host's own address, which Mooncake's transfer engine announces
MODEL_ENV = "OMNI_MODEL"  # the model vLLM loads (launch.sh)


class Env(str):
    """A word of a command that is an environment variable's value: launch.sh writes it
    "$NAME", a Kubernetes container $(NAME), the JSON report ${NAME}."""

    def __new__(cls, name: str) -> "Env":
        word = super().__new__(cls, "${" + name + "}")
        word.name = name
        return word


def _from_env(name: str, default: str) -> str:
    """An OmegaConf interpolation: the variable's value, else `default` (a host name)."""
    return "${oc.env:" + name + ",'" + default + "'}"


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
    keys (codec chunking) are kept. Addresses come from the environment (OMNI_HOST_ADDR:
    this host's; OMNI_MASTER_ADDR: the head host's, where Mooncake's master runs), with the
    --gpus names as defaults."""
    extra = {}
    for spec in (plan.request.pipeline.deploy_top.get("connectors") or {}).values():
        extra.update(copy.deepcopy(spec.get("extra") or {}))
    master_addr = _from_env(MASTER_ADDR_ENV, master)
    extra.update(host=_from_env(HOST_ADDR_ENV, node),
                 metadata_server=f"http://{master_addr}:{MOONCAKE_METADATA_PORT}/metadata",
                 master=f"{master_addr}:{MOONCAKE_RPC_PORT}", proto="tcp")
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


SCHEMA_FILE_NAMES = {"deploy": "deploy.yaml", "stage-args": "stage_args.yaml"}  # a single host's file


def deploy_files(plan: Plan) -> dict[str, str]:
    """The stage config file(s) vLLM-Omni reads: one, or head.yaml and one per host (what
    `--format yaml` writes, launch.sh aside)."""
    from .render import RENDERERS, render_deploy

    if len(node_names([g.gpu for g in plan.gpus])) > 1:
        return {file_name(layout): render_deploy(plan, layout) for layout in layouts(plan)}
    return {SCHEMA_FILE_NAMES[plan.request.schema]: RENDERERS[plan.request.schema](plan)}


def file_name(layout: HostLayout) -> str:
    """head.yaml, or host-NAME.yaml: no host name can make the head's file name."""
    return HEAD_FILE if layout.head else f"host-{layout.node}.yaml"


def hub_model(plan: Plan) -> str | None:
    """The Hub id vLLM loads, or None where the plan read a local model directory (whose
    path on the planning machine is no path on a serving host)."""
    request = plan.request
    if request.model_ref in (None, request.pipeline.name):  # a catalog name: its Hugging Face id
        return request.pipeline.hf_id
    return request.model_ref if looks_like_hub_id(request.model_ref) else None


def model_reference(plan: Plan) -> str:
    """What --model named, as vLLM loads it (a catalog name is no model vLLM can load: its
    Hugging Face id is)."""
    return hub_model(plan) or plan.request.model_ref


def host_order(plan: Plan) -> list[str]:
    """The hosts with the head first, the others in inventory order: launch.sh's indices and
    a LeaderWorkerSet's worker indices (the leader is index 0)."""
    head, _ = head_of(plan)
    return [head, *(node for node in node_names([g.gpu for g in plan.gpus]) if node != head)]


def argv(plan: Plan, node: str, all_layouts: list[HostLayout], model: str | None = None,
         config_dir: str = "") -> list[tuple[list[str], bool]]:
    """The processes of one host as argument lists, the head first where it runs there:
    (argv, whether it waits for the head's /health first). `all_layouts`: layouts(plan);
    `model`: what vLLM loads (default: model_reference); `config_dir`: the folder of the
    deploy files ("" : the working directory). Env words are environment variables."""
    head, head_stage = head_of(plan)
    model = model_reference(plan) if model is None else model
    master = ["--omni-master-address", Env(MASTER_ADDR_ENV), "--omni-master-port", Env("OMNI_MASTER_PORT")]
    out = []
    if node == head:
        n = all_layouts[0].replicas[head_stage]
        out.append((["vllm", "serve", model, "--omni", "--deploy-config", config_dir + HEAD_FILE, "--stage-id",
                     str(head_stage), *master, "--omni-dp-size-local", str(n), "--port", Env("OMNI_API_PORT"),
                     "--stage-init-timeout", str(STAGE_INIT_TIMEOUT_S), "--init-timeout", str(INIT_TIMEOUT_S)], False))
    layout = next(h for h in all_layouts[1:] if h.node == node)
    for stage_id in sorted(layout.replicas):
        if (node, stage_id) == (head, head_stage):
            continue
        out.append((["vllm", "serve", model, "--omni", "--deploy-config", config_dir + file_name(layout), "--headless",
                     "--stage-id", str(stage_id), *master, "--omni-dp-size-local", str(layout.replicas[stage_id])],
                    stage_id == head_stage))
    return out


def shell_words(words: list[str]) -> str:
    """An argv as one POSIX shell command: Env words as "$NAME", the others quoted."""
    return " ".join(f'"${w.name}"' if isinstance(w, Env) else shlex.quote(w) for w in words)


def commands(plan: Plan, node: str, all_layouts: list[HostLayout], model: str | None = None,
             config_dir: str = "") -> list[tuple[str, bool]]:
    """argv(...) as shell commands: (command, whether it waits for the head's /health first)."""
    return [(shell_words(words), wait) for words, wait in argv(plan, node, all_layouts, model, config_dir)]


def launch_script(plan: Plan, header: str, all_layouts: list[HostLayout]) -> str:
    """A POSIX shell script: `sh launch.sh HOST` (or the host's index, 0 the head, as
    host_order) starts that host's processes. `all_layouts`: layouts(plan)."""
    head, head_stage = head_of(plan)
    order = host_order(plan)
    hub = hub_model(plan)
    crossing = crosses_hosts(plan)
    lines = [
        "#!/bin/sh",
        header.rstrip("\n"),
        f"# Run `sh launch.sh HOST` (or its index: 0 is {head}, the head: stage {head_stage}, the API on port "
        "$OMNI_API_PORT) on each host, in the folder of these files; the head first.",
        f"# {MASTER_ADDR_ENV}: an IP address of {head} that every host reaches; OMNI_MASTER_PORT: a free TCP port there; "
        f"{HOST_ADDR_ENV}: this host's address that the others reach (default: its --gpus name); {MODEL_ENV}: the "
        "model on this host (" + ("default: the Hub id" if hub else "required: the plan read a local directory") + ").",
        "# The start-up sequence is read from vLLM-Omni's code; no cluster has run it yet.",
    ]
    if crossing:
        lines.append(f"# Every edge uses MooncakeStoreConnector over TCP (pip install mooncake-transfer-engine on every "
                     f"host): on {head}, launch.sh starts `mooncake_master` where it is installed and none answers; "
                     "every host checks that it answers before starting.")
    names = node_names([g.gpu for g in plan.gpus])
    lines += ["set -eu", 'case "${1:-}" in']
    numbered = not any(node.isdigit() for node in names)  # a host named by a number keeps its name only
    lines += [f"  {node}{f'|{i}' if numbered else ''}) host={node} ;;" for i, node in enumerate(order)]
    lines += [
        f'  *) echo "usage: sh launch.sh HOST (one of: {" ".join(names)}) or its index (0: {head}, the head)" >&2; '
        "exit 2 ;;",
        "esac",
        f': "${{{MASTER_ADDR_ENV}:?set {MASTER_ADDR_ENV} to an IP address of {head}}}"',
        f': "${{OMNI_MASTER_PORT:={MASTER_PORT}}}"',
        f': "${{OMNI_API_PORT:={API_PORT}}}"',
        f': "${{OMNI_HEAD_WAIT_S:={INIT_TIMEOUT_S}}}"',
        f': "${{{HOST_ADDR_ENV}:=$host}}"',
        f'[ -n "${{{MODEL_ENV}:-}}" ] || ' + (f"{MODEL_ENV}={shlex.quote(hub)}" if hub else
                                             f'{{ echo "launch.sh: set {MODEL_ENV} to the model directory on this host" '
                                             ">&2; exit 2; }"),
        f"export {MASTER_ADDR_ENV} OMNI_MASTER_PORT OMNI_API_PORT {HOST_ADDR_ENV} {MODEL_ENV}",
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
    ]
    if crossing:
        metadata = f"http://$OMNI_MASTER_ADDR:{MOONCAKE_METADATA_PORT}/metadata"
        lines += [
            f'mooncake_up() {{ curl -sS -o /dev/null "{metadata}" >/dev/null 2>&1; }}  # any HTTP answer',
            f'if [ "$host" = {head} ] && ! mooncake_up && command -v mooncake_master >/dev/null 2>&1; then',
            f"  start mooncake_master --rpc_port={MOONCAKE_RPC_PORT} --enable_http_metadata_server=true "
            f"--http_metadata_server_port={MOONCAKE_METADATA_PORT}",
            "fi",
            "waited=0",
            "until mooncake_up; do",
            f'  [ "$waited" -lt 120 ] || {{ echo "launch.sh: Mooncake\'s master does not answer at {metadata}: '
            f'start mooncake_master on {head}" >&2; kill $pids 2>/dev/null; exit 1; }}',
            "  sleep 5; waited=$((waited + 5))",
            "done",
        ]
    lines.append('case "$host" in')
    for node in order:
        lines.append(f"  {node})")
        host_commands = commands(plan, node, all_layouts, model=Env(MODEL_ENV))
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

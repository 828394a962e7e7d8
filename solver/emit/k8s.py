"""`--format k8s`: the plan as Kubernetes objects, one multi-document YAML for `kubectl apply -f`.

- A ConfigMap holds the deploy file(s) exactly as `--format yaml` writes them (for several
  hosts: head.yaml and host-*.yaml; launch.sh is a bare host's), mounted at CONFIG_DIR.
- One host: a Deployment (replicas 1, strategy Recreate: two pods never hold one node's GPUs
  at once) and a Service for the API. Several hosts: a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1,
  https://github.com/kubernetes-sigs/lws/tree/v0.10.0, size = hosts; the leader is index 0, the
  head's host, the workers the others in host_order, each choosing its commands by
  LWS_WORKER_INDEX), a Service for the API and one for the omni master port, and Mooncake's
  master as a container of the leader's pod where an edge crosses hosts. The master address is
  LWS_LEADER_ADDRESS, which LWS sets in every container (site/content/en/docs/reference/
  labels-annotations-and-environment-variables.md, v0.10.0); OMNI_HOST_ADDR is the pod's IP.
- Each vLLM container requests and limits nvidia.com/gpu = its host's GPU count (the deploy
  files name a host's GPUs by local index), mounts a memory-medium emptyDir at /dev/shm, and
  loads the model from a PVC (--model-pvc, mounted read-only at MODEL_DIR) or by its Hub id
  (HF_TOKEN from a Secret's key `token`, the key vLLM-Omni's chart uses: examples/online_serving/
  chart-helm/templates/_helpers.tpl, vllm-project/vllm-omni@10dcb98b). Nodes are selected by the
  GPU feature discovery label nvidia.com/gpu.product (GpuSpec.gpu_product_labels).
- The container that serves HTTP (the head) has a startupProbe on /health sized by
  startup_window_s and a readinessProbe; headless workers serve no HTTP and get no probe.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import yaml

from ..errors import InputError
from ..inputs.gpus import lookup_gpu, node_names
from ..planning.planner import Plan
from . import multihost
from .render import header

CONFIG_DIR = "/etc/omni-autoconf/"
MODEL_DIR = "/models"
GPU_LABEL = "nvidia.com/gpu.product"
# Docker Hub vllm/vllm-omni (https://hub.docker.com/r/vllm/vllm-omni/tags): tags seen in public
# deployment files, found through a code-search index in 2026 (no URL: the index does not expose
# repositories): v0.14.0, v0.18.0, v0.22.0, v0.26.0, v0.28.0, v0.30.0. Other versions need --image.
IMAGE_REPOSITORY = "vllm/vllm-omni"
IMAGE_TAGS = {"0.14": "v0.14.0", "0.18": "v0.18.0", "0.22": "v0.22.0", "0.26": "v0.26.0", "0.28": "v0.28.0",
              "0.30": "v0.30.0"}
# The start-up window, erring long: every stage's weights read one after another at 125 MiB/s,
# the baseline throughput of an AWS EBS gp3 volume, a common floor for a PVC
# (https://docs.aws.amazon.com/ebs/latest/userguide/general-purpose.html, "gp3 ... baseline
# ... 125 MiB/s"), plus per stage vLLM-Omni's default stage init timeout (300 s, which covers
# profiling, compilation and graph capture); for several hosts at least the head's --init-timeout.
LOAD_BYTES_PER_S = 125 * 2**20
STAGE_ALLOWANCE_S = 300
PROBE_PERIOD_S = 10
_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
NAME_MAX = 40  # room for "-config", "-master" and LWS's pod names ({name}-0-N) in 63 characters


@dataclass(frozen=True)
class Options:
    """What the manifests take besides the plan (the command line's --image, --namespace,
    --name, --model-pvc, --hf-token-secret); None: the default."""

    image: str | None = None
    namespace: str | None = None
    name: str | None = None
    model_pvc: str | None = None
    hf_token_secret: str | None = None


OPTION_FLAGS = {"image": "--image", "namespace": "--namespace", "name": "--name", "model_pvc": "--model-pvc",
                "hf_token_secret": "--hf-token-secret"}


def default_name(pipeline_name: str) -> str:
    name = re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", pipeline_name.lower())).lstrip("-0123456789")
    return name[:NAME_MAX].rstrip("-") or "omni"


def resolve(request, options: Options | dict | None) -> Options:
    """The options validated, defaults filled in; InputError with one line otherwise."""
    o = Options(**(options or {})) if not isinstance(options, Options) else options
    rules = [("name", _LABEL, NAME_MAX, "a lower-case letter, then letters, digits or '-'"),
             ("namespace", _DNS_LABEL, 63, "lower-case letters, digits or '-'"),
             ("model_pvc", _SUBDOMAIN, 253, "a DNS subdomain name"),
             ("hf_token_secret", _SUBDOMAIN, 253, "a DNS subdomain name")]
    for field, pattern, most, what in rules:
        value = getattr(o, field)
        if value is not None and (len(value) > most or not pattern.fullmatch(value)):
            raise InputError(f"{OPTION_FLAGS[field]} {value!r}: a Kubernetes name of at most {most} characters: {what}")
    if o.image is not None and (not o.image or any(ch.isspace() or not ch.isprintable() for ch in o.image)):
        raise InputError(f"--image {o.image!r}: an image reference holds no blank or control character")
    version = request.version.name
    image = o.image
    if image is None:
        if version not in IMAGE_TAGS:
            raise InputError(f"no {IMAGE_REPOSITORY} image tag is known for vLLM-Omni {version}: give --image")
        image = f"{IMAGE_REPOSITORY}:{IMAGE_TAGS[version]}"
    if o.model_pvc is None and request.model_ref not in (None, request.pipeline.name) \
            and not multihost.looks_like_hub_id(request.model_ref):
        raise InputError("the plan read a local model directory, which no pod has: give --model-pvc, a volume that "
                         "holds it at its root")
    return replace(o, image=image, name=o.name or default_name(request.pipeline.name))


def startup_window_s(plan: Plan) -> int:
    """Seconds the head may take to answer /health (see LOAD_BYTES_PER_S)."""
    weights = sum((sp.memory.weights_bytes - sp.memory.load_buffer_bytes) * sp.tensor_parallel_size * sp.num_replicas
                  for sp in plan.stages)
    window = math.ceil(weights / LOAD_BYTES_PER_S) + STAGE_ALLOWANCE_S * len(plan.stages)
    if len(node_names([g.gpu for g in plan.gpus])) > 1:
        window = max(window, multihost.INIT_TIMEOUT_S)
    return PROBE_PERIOD_S * math.ceil(window / PROBE_PERIOD_S)


def _gpu_selector(plan: Plan, node: str, notes: list[str]) -> dict:
    """nodeSelector (one label) or affinity (several) for the host's GPUs; {} where unknown."""
    names = sorted({g.gpu.name for g in plan.gpus if g.gpu.node == node})
    labels: list[str] = []
    if len(names) == 1:
        try:
            labels = list(lookup_gpu(names[0]).gpu_product_labels)
        except InputError:
            labels = []
    if not labels:
        notes.append(f"no {GPU_LABEL} node selector for {node} ({', '.join(names)}): no GPU feature discovery label "
                     "is known for it; add one that picks nodes with these GPUs")
        return {}
    if len(labels) == 1:
        return {"nodeSelector": {GPU_LABEL: labels[0]}}
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": GPU_LABEL, "operator": "In", "values": labels}]}]}}}}


def _probes(plan: Plan) -> dict:
    get = {"path": "/health", "port": "http"}
    return {"startupProbe": {"httpGet": get, "periodSeconds": PROBE_PERIOD_S,
                             "failureThreshold": startup_window_s(plan) // PROBE_PERIOD_S},
            "readinessProbe": {"httpGet": dict(get), "periodSeconds": PROBE_PERIOD_S, "failureThreshold": 3}}


def _env(o: Options, extra: list[dict]) -> list[dict]:
    env = list(extra)
    if o.hf_token_secret:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": o.hf_token_secret, "key": "token"}}})
    return env


def _vllm_container(o: Options, gpus: int, command: list[str], env: list[dict], serves: bool, plan: Plan) -> dict:
    mounts = [{"name": "config", "mountPath": CONFIG_DIR.rstrip("/"), "readOnly": True},
              {"name": "shm", "mountPath": "/dev/shm"}]
    if o.model_pvc:
        mounts.append({"name": "model", "mountPath": MODEL_DIR, "readOnly": True})
    container = {"name": "vllm", "image": o.image, "command": command}
    if env:
        container["env"] = env
    if serves:
        container["ports"] = [{"name": "http", "containerPort": multihost.API_PORT}]
    container["resources"] = {"requests": {"nvidia.com/gpu": gpus}, "limits": {"nvidia.com/gpu": gpus}}
    container["volumeMounts"] = mounts
    if serves:
        container.update(_probes(plan))
    return container


def _pod(o: Options, containers: list[dict], selector: dict) -> dict:
    volumes = [{"name": "config", "configMap": {"name": f"{o.name}-config"}},
               {"name": "shm", "emptyDir": {"medium": "Memory"}}]
    if o.model_pvc:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": o.model_pvc, "readOnly": True}})
    return {"containers": containers, **selector, "volumes": volumes}


def _meta(o: Options, name: str, labels: dict) -> dict:
    meta = {"name": name}
    if o.namespace:
        meta["namespace"] = o.namespace
    meta["labels"] = labels
    return meta


def _service(o: Options, name: str, labels: dict, selector: dict, port_name: str, port: int, target) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(o, name, labels),
            "spec": {"selector": selector, "ports": [{"name": port_name, "port": port, "targetPort": target}]}}


def _host_script(plan: Plan, nodes: list[str], model: str, all_layouts, by_index: bool) -> str:
    """A shell script that starts the processes of a host (by LWS_WORKER_INDEX where
    `by_index`) and waits; the commands are multihost.argv's, with the mounted files."""
    order = multihost.host_order(plan)
    lines = ["set -eu", f'export {multihost.MASTER_ADDR_ENV}="$LWS_LEADER_ADDRESS"', 'pids=""',
             'start() { "$@" & pids="$pids $!"; }',
             "wait_for_head() {  # replicas of the head's stage register only once the head serves",
             '  until python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" '
             '"http://$OMNI_MASTER_ADDR:$OMNI_API_PORT/health" >/dev/null 2>&1; do sleep 10; done',
             "}"]
    if by_index:
        lines.append('case "$LWS_WORKER_INDEX" in')
    for node in nodes:
        body = [f'(wait_for_head && exec {c}) & pids="$pids $!"' if after else f"start {c}"
                for c, after in multihost.commands(plan, node, all_layouts, model=model, config_dir=CONFIG_DIR)]
        body = body or [f'echo "this plan runs nothing on {node}" >&2; exec sleep infinity']
        if by_index:
            lines += [f"  {order.index(node)})  # {node}", *(f"    {b}" for b in body), "    ;;"]
        else:
            lines += body
    if by_index:
        lines += ['  *) echo "no host for LWS_WORKER_INDEX=$LWS_WORKER_INDEX" >&2; exit 2 ;;', "esac"]
    lines += ["status=0", 'for pid in $pids; do wait "$pid" || { code=$?; [ "$status" -ne 0 ] || status=$code; }; done',
              'exit "$status"']
    return "\n".join(lines) + "\n"


def _host_gpus(plan: Plan, node: str) -> int:
    return sum(1 for g in plan.gpus if g.gpu.node == node)


def objects(plan: Plan, options: Options | dict | None = None) -> tuple[list[dict], list[str]]:
    """The Kubernetes objects of `plan` and the notes that go above them."""
    o = resolve(plan.request, options)
    notes: list[str] = []
    labels = {"app.kubernetes.io/name": o.name, "app.kubernetes.io/managed-by": "omni-autoconf"}
    files = multihost.deploy_files(plan)
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(o, f"{o.name}-config", labels),
              "data": files}
    model = MODEL_DIR if o.model_pvc else multihost.hub_model(plan)
    hosts = node_names([g.gpu for g in plan.gpus])
    head_labels = {**labels, "app.kubernetes.io/component": "head"}
    api = _service(o, f"{o.name}-api", labels, {k: head_labels[k] for k in ("app.kubernetes.io/name",
                                                                            "app.kubernetes.io/component")},
                   "http", multihost.API_PORT, "http")
    if len(hosts) == 1:
        flag = "--deploy-config" if plan.request.schema == "deploy" else "--stage-configs-path"
        command = ["vllm", "serve", model, "--omni", flag, CONFIG_DIR + next(iter(files)), "--port",
                   str(multihost.API_PORT)]
        pod = _pod(o, [_vllm_container(o, _host_gpus(plan, hosts[0]), command, _env(o, []), True, plan)],
                   _gpu_selector(plan, hosts[0], notes))
        deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(o, o.name, labels),
                      "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                               "selector": {"matchLabels": api["spec"]["selector"]},
                               "template": {"metadata": {"labels": head_labels}, "spec": pod}}}
        return [config, deployment, api], notes
    order = multihost.host_order(plan)
    workers = order[1:]
    shapes = {(_host_gpus(plan, n), tuple(sorted({g.gpu.name for g in plan.gpus if g.gpu.node == n}))) for n in workers}
    if len(shapes) > 1:
        raise InputError("a LeaderWorkerSet's workers share one pod template: the hosts other than the head "
                         f"({', '.join(workers)}) must have the same GPUs")
    all_layouts = multihost.layouts(plan)
    env = [{"name": "OMNI_MASTER_PORT", "value": str(multihost.MASTER_PORT)},
           {"name": "OMNI_API_PORT", "value": str(multihost.API_PORT)},
           {"name": multihost.HOST_ADDR_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    leader = [_vllm_container(o, _host_gpus(plan, order[0]), ["/bin/sh", "-c", _host_script(
        plan, order[:1], model, all_layouts, False)], _env(o, env), True, plan)]
    crossing = multihost.crosses_hosts(plan)
    if crossing:
        leader.append({"name": "mooncake-master", "image": o.image, "command": [
            "mooncake_master", f"--rpc_port={multihost.MOONCAKE_RPC_PORT}", "--enable_http_metadata_server=true",
            f"--http_metadata_server_port={multihost.MOONCAKE_METADATA_PORT}"],
            "ports": [{"name": "mooncake-rpc", "containerPort": multihost.MOONCAKE_RPC_PORT},
                      {"name": "mooncake-meta", "containerPort": multihost.MOONCAKE_METADATA_PORT}]})
        notes.append("Mooncake's master runs in the leader's pod from the same image: the image must hold "
                     "mooncake-transfer-engine (MooncakeStoreConnector imports it on every host)")
    worker = _vllm_container(o, _host_gpus(plan, workers[0]), ["/bin/sh", "-c", _host_script(
        plan, workers, model, all_layouts, True)], _env(o, env), False, plan)
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": _meta(o, o.name, labels),
           "spec": {"replicas": 1, "leaderWorkerTemplate": {
               "size": len(hosts), "restartPolicy": "RecreateGroupOnPodRestart",
               "leaderTemplate": {"metadata": {"labels": head_labels},
                                  "spec": _pod(o, leader, _gpu_selector(plan, order[0], notes))},
               "workerTemplate": {"metadata": {"labels": labels},
                                  "spec": _pod(o, [worker], _gpu_selector(plan, workers[0], notes))}}}}
    master = _service(o, f"{o.name}-master", labels, api["spec"]["selector"], "omni-master", multihost.MASTER_PORT,
                      multihost.MASTER_PORT)
    return [config, lws, api, master], notes


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data) -> bool:
        return True


_Dumper.add_representer(str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s
                                                             else None))


def render(plan: Plan, options: Options | dict | None = None) -> str:
    """One multi-document YAML: the plan's header as comments, the notes, then the objects."""
    docs, notes = objects(plan, options)
    text = header(plan) + "".join(f"# Note: {n}.\n" for n in notes)
    return text + "".join("---\n" + yaml.dump(d, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                                              allow_unicode=True, width=4096) for d in docs)

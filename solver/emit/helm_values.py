"""`--format helm-values`: values.yaml for vLLM-Omni's own Helm chart, one host.

The chart is vllm-project/vllm-omni's examples/online_serving/chart-helm (read at commit
10dcb98b0abc8cfd52555b6d92b6995c6313df7d: templates/_helpers.tpl; its values.yaml and
templates/deployment.yaml as the chart's fork oglok/vllm-omni carries them). What it takes:
`image.repository`/`image.tag`, `image.command` (replaces the serve command it builds from
`model` and `omniArgs`), `image.env` (added to the container's env), `configs` (a ConfigMap
whose keys become environment variables, envFrom), `resources.requests`/`limits` with
`nvidia.com/gpu` (a GPU count above 0 also makes a nodeAffinity on nvidia.com/gpu.product
`In` `gpuModels`), `startupProbe`/`readinessProbe`/`livenessProbe`, `containerPort` (8000).

The chart mounts no file of ours, so the deploy file travels in `configs` as the variable
OMNI_DEPLOY_CONFIG and the command writes it out byte for byte before `vllm serve`.
"""

from __future__ import annotations

import yaml

from ..errors import InputError
from ..inputs.gpus import lookup_gpu, node_names
from ..planning.planner import Plan
from . import k8s, multihost
from .render import header

CONFIG_ENV = "OMNI_DEPLOY_CONFIG"
CONFIG_PATH = "/tmp/omni-autoconf/"


def check(request, options: dict | None) -> k8s.Options:
    if len(node_names(request.gpus)) > 1:
        raise InputError("--format helm-values is for one host (the chart runs one pod): use --format k8s")
    return k8s.resolve(request, options)


def values(plan: Plan, options: dict | None = None) -> tuple[dict, list[str]]:
    o = check(plan.request, options)
    name, text = next(iter(multihost.deploy_files(plan).items()))
    repository, _, tag = o.image.rpartition(":") if ":" in o.image.rsplit("/", 1)[-1] else (o.image, "", "latest")
    flag = "--deploy-config" if plan.request.schema == "deploy" else "--stage-configs-path"
    model = multihost.hub_model(plan)
    if model is None:
        raise InputError("the plan read a local model directory: the chart serves a Hub id (give the Hub id as --model)")
    serve = multihost.shell_words(["vllm", "serve", model, "--omni", "--host", "0.0.0.0", "--port",
                                   str(multihost.API_PORT), flag, CONFIG_PATH + name])
    script = f'mkdir -p {CONFIG_PATH} && printf "%s" "${CONFIG_ENV}" > {CONFIG_PATH}{name} && exec {serve}'
    gpus = len(plan.gpus)
    notes: list[str] = []
    image: dict = {"repository": repository, "tag": tag, "command": ["/bin/sh", "-c", script]}
    if o.hf_token_secret:
        image["env"] = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": o.hf_token_secret, "key": "token"}}}]
    out: dict = {"model": model, "image": image, "containerPort": multihost.API_PORT,
                 "resources": {"requests": {"nvidia.com/gpu": gpus}, "limits": {"nvidia.com/gpu": gpus}}}
    names = sorted({g.gpu.name for g in plan.gpus})
    try:
        labels = list(lookup_gpu(names[0]).gpu_product_labels) if len(names) == 1 else []
    except InputError:
        labels = []
    if labels:
        out["gpuModels"] = labels
    else:
        notes.append(f"set gpuModels: no nvidia.com/gpu.product label is known for {', '.join(names)}")
    probes = k8s._probes(plan)
    for probe in probes.values():
        probe["httpGet"]["port"] = multihost.API_PORT
    out.update(probes)
    out["configs"] = {CONFIG_ENV: text}
    return out, notes


def render(plan: Plan, options: dict | None = None) -> str:
    doc, notes = values(plan, options)
    return header(plan) + "".join(f"# Note: {n}.\n" for n in notes) + yaml.dump(
        doc, Dumper=k8s._Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=4096)

"""`--format k8s` and `--format helm-values`: every object validates strictly against the
Kubernetes OpenAPI schemas (kubernetes-validate's bundled JSON schemas, offline) and the
LeaderWorkerSet against the CRD schema its project publishes (tests/data, v0.10.0); the
ConfigMap holds the deploy files byte for byte; GPUs, shm, probes, the leader address and
Mooncake's master as docs/output.md says. Also launch.sh's head-first indices and the JSON
report's argv lists."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from omni_autoconf.cli.main import main
from omni_autoconf.emit import k8s

kubernetes_validate = pytest.importorskip("kubernetes_validate")

K8S_VERSION = "1.32.0"  # a Kubernetes release whose schemas kubernetes-validate ships
LWS_SCHEMA = Path(__file__).parent / "data" / "lws-v0.10.0.leaderworkersets.openapi-v3.json"
FLAGSHIP = ["--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe"]
TWO_HOSTS = ["--gpus", "8xH100-80GB", "--nodes", "2", "--model", "qwen3-omni-moe"]


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def manifests(*args) -> tuple[str, list[dict]]:
    result = run(*args, "--format", "k8s", "-q")
    assert result.exit_code == 0, result.stderr
    return result.stdout, [d for d in yaml.safe_load_all(result.stdout) if d is not None]


def _strict(node):
    """The CRD schema with unknown fields refused (see tests/data's README)."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if "properties" in out and "additionalProperties" not in out and not out.get(
                "x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(x) for x in node]
    return node


def validate(doc: dict) -> None:
    if doc["kind"] == "LeaderWorkerSet":
        schema = _strict(json.loads(LWS_SCHEMA.read_text()))
        jsonschema.validate(doc, schema)
        for role in ("leaderTemplate", "workerTemplate"):  # the pods, also against Kubernetes' own schema
            template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                        "template": doc["spec"]["leaderWorkerTemplate"][role]}
            kubernetes_validate.validate(template, K8S_VERSION, strict=True)
        return
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _yaml_files(*args, tmp_path: Path) -> dict[str, str]:
    out = tmp_path / "yaml"
    several = "--nodes" in args
    result = run(*args, "-o", str(out) + ("/" if several else ""), "-q")
    assert result.exit_code == 0, result.stderr
    if several:
        return {p.name: p.read_text() for p in out.iterdir() if p.suffix == ".yaml"}
    return {"deploy.yaml": out.read_text()}


def _containers(pod_spec: dict) -> dict[str, dict]:
    return {c["name"]: c for c in pod_spec["containers"]}


def test_one_host_is_a_deployment_that_validates_and_mounts_the_exact_deploy_file(tmp_path):
    text, docs = manifests(*FLAGSHIP)
    assert [d["kind"] for d in docs] == ["ConfigMap", "Deployment", "Service"]
    for doc in docs:
        validate(doc)
    config, deployment, service = docs
    assert config["data"] == _yaml_files(*FLAGSHIP, tmp_path=tmp_path)  # byte for byte
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    vllm = _containers(pod)["vllm"]
    assert vllm["command"][:5] == ["vllm", "serve", "Qwen/Qwen3-Omni-30B-A3B-Instruct", "--omni", "--deploy-config"]
    assert vllm["command"][5] == k8s.CONFIG_DIR + "deploy.yaml"
    assert vllm["resources"] == {"requests": {"nvidia.com/gpu": 2}, "limits": {"nvidia.com/gpu": 2}}
    assert {"name": "shm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    assert {"name": "shm", "mountPath": "/dev/shm"} in vllm["volumeMounts"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert vllm["startupProbe"]["httpGet"]["path"] == "/health" and "readinessProbe" in vllm
    window = vllm["startupProbe"]["periodSeconds"] * vllm["startupProbe"]["failureThreshold"]
    assert window >= k8s.STAGE_ALLOWANCE_S * 3 + 60  # qwen3-omni's ~65 GiB of weights at 125 MiB/s: over 9 min
    assert service["spec"]["ports"][0]["port"] == 8000
    assert text == manifests(*FLAGSHIP)[0]  # same bytes every run


def test_two_hosts_are_a_leaderworkerset_with_the_leader_address_and_mooncake(tmp_path):
    _, docs = manifests(*TWO_HOSTS)
    assert [d["kind"] for d in docs] == ["ConfigMap", "LeaderWorkerSet", "Service", "Service"]
    for doc in docs:
        validate(doc)
    config, lws, api, master = docs
    files = _yaml_files(*TWO_HOSTS, tmp_path=tmp_path)
    assert config["data"] == files and "launch.sh" not in config["data"]
    template = lws["spec"]["leaderWorkerTemplate"]
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1" and template["size"] == 2
    leader, worker = template["leaderTemplate"]["spec"], template["workerTemplate"]["spec"]
    head = _containers(leader)["vllm"]
    script = head["command"][2]
    assert 'OMNI_MASTER_ADDR="$LWS_LEADER_ADDRESS"' in script
    assert "--deploy-config /etc/omni-autoconf/head.yaml" in script
    assert {e["name"]: e for e in head["env"]}["OMNI_HOST_ADDR"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert "startupProbe" in head and "readinessProbe" in head
    work = _containers(worker)["vllm"]
    assert "startupProbe" not in work and "readinessProbe" not in work and "ports" not in work  # headless
    assert 'case "$LWS_WORKER_INDEX" in' in work["command"][2] and "--headless" in work["command"][2]
    for pod in (leader, worker):
        assert _containers(pod)["vllm"]["resources"]["limits"] == {"nvidia.com/gpu": 8}
    assert "mooncake_master" in _containers(leader)["mooncake-master"]["command"][0]
    assert {p["port"] for p in master["spec"]["ports"]} == {29600} and api["spec"]["ports"][0]["port"] == 8000
    # every command of the scripts parses, and each host's file is the one the plan writes for it
    for line in (script + work["command"][2]).splitlines():
        if "vllm serve" in line:
            words = shlex.split(line.split("exec ", 1)[-1].replace("start ", "", 1).rstrip(") &pids=\"$pids $!\""))
            assert words[words.index("--deploy-config") + 1].removeprefix(k8s.CONFIG_DIR) in files


def test_host_addresses_come_from_the_environment_in_the_files(tmp_path):
    omegaconf = pytest.importorskip("omegaconf")
    files = _yaml_files(*TWO_HOSTS, tmp_path=tmp_path)
    for name, text in files.items():
        doc = yaml.safe_load(text)
        extra = doc["connectors"]["connector_across_hosts"]["extra"]
        assert "${oc.env:OMNI_MASTER_ADDR," in extra["master"] and "${oc.env:OMNI_HOST_ADDR," in extra["host"]
        import os

        saved = {k: os.environ.get(k) for k in ("OMNI_MASTER_ADDR", "OMNI_HOST_ADDR")}
        os.environ.update(OMNI_MASTER_ADDR="10.0.0.1", OMNI_HOST_ADDR="10.0.0.2")
        try:  # as vLLM-Omni loads it: OmegaConf.load, then to_container(resolve=True)
            resolved = omegaconf.OmegaConf.to_container(omegaconf.OmegaConf.create(doc), resolve=True)
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        got = resolved["connectors"]["connector_across_hosts"]["extra"]
        assert got["master"] == "10.0.0.1:50051" and got["host"] == "10.0.0.2", name
        assert got["metadata_server"] == "http://10.0.0.1:8080/metadata"


def test_options_reach_the_objects_and_bad_ones_are_one_line():
    _, docs = manifests(*FLAGSHIP, "--image", "registry.example/omni:1", "--namespace", "serving", "--name", "talk",
                        "--model-pvc", "qwen-weights", "--hf-token-secret", "hf")
    for doc in docs:
        validate(doc)
        assert doc["metadata"]["namespace"] == "serving" and doc["metadata"]["name"].startswith("talk")
    pod = docs[1]["spec"]["template"]["spec"]
    vllm = _containers(pod)["vllm"]
    assert vllm["image"] == "registry.example/omni:1" and vllm["command"][2] == k8s.MODEL_DIR
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "qwen-weights", "readOnly": True}} in pod["volumes"]
    assert vllm["env"] == [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]
    for args, needle in [(["--name", "Bad_Name"], "--name"), (["--namespace", "a" * 64], "--namespace"),
                         (["--image", "a b"], "--image"), (["--omni-version", "0.20"], "give --image")]:
        result = run(*FLAGSHIP, "--format", "k8s", *args)
        assert result.exit_code == 2 and needle in result.stderr and len(result.stderr.strip().splitlines()) == 1
    refused = run(*FLAGSHIP, "--namespace", "x")  # a yaml option of k8s only
    assert refused.exit_code == 2 and "not an option of --format yaml" in refused.stderr


def test_an_unknown_gpu_label_gets_no_selector_but_a_note(monkeypatch):
    from omni_autoconf.inputs import gpus

    spec = gpus.lookup_gpu("H100-80GB")
    monkeypatch.setattr(gpus, "lookup_gpu", lambda name: spec.model_copy(update={"gpu_product_labels": []}))
    monkeypatch.setattr(k8s, "lookup_gpu", gpus.lookup_gpu)
    text, docs = manifests(*FLAGSHIP)
    assert "nodeSelector" not in docs[1]["spec"]["template"]["spec"]
    assert "# Note: no nvidia.com/gpu.product node selector for node0" in text


def test_every_catalog_gpu_label_is_its_nvml_name_sanitised_as_gpu_feature_discovery_does():
    import re

    from omni_autoconf.inputs.gpus import gpu_catalog

    for spec in gpu_catalog().values():
        expected = ["-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", n).split()) for n in spec.nvml_names]
        assert spec.gpu_product_labels == expected, spec.name


def test_helm_values_for_vllm_omnis_chart_carry_the_deploy_file(tmp_path):
    result = run(*FLAGSHIP, "--format", "helm-values", "-q")
    assert result.exit_code == 0, result.stderr
    values = yaml.safe_load(result.stdout)
    assert values["configs"]["OMNI_DEPLOY_CONFIG"] == _yaml_files(*FLAGSHIP, tmp_path=tmp_path)["deploy.yaml"]
    assert values["image"]["repository"] == "vllm/vllm-omni" and values["image"]["tag"] == "v0.30.0"
    assert values["resources"]["limits"]["nvidia.com/gpu"] == 2 and values["gpuModels"] == ["NVIDIA-H100-80GB-HBM3"]
    assert "--deploy-config /tmp/omni-autoconf/deploy.yaml" in values["image"]["command"][2]
    several = run(*TWO_HOSTS, "--format", "helm-values")
    assert several.exit_code == 2 and "one host" in several.stderr


def test_the_json_report_carries_argv_lists_and_launch_sh_numbers_the_head_zero(tmp_path):
    doc = json.loads(run(*TWO_HOSTS, "--format", "json", "-q").stdout)
    for host in doc["hosts"]:
        for command in host["commands"]:
            assert command["argv"][:2] == ["vllm", "serve"]
            assert shlex.split(command["command"].replace('"$', '"${').replace('_ADDR"', '_ADDR}"')
                               .replace('_PORT"', '_PORT}"')) == command["argv"]
    out = tmp_path / "plan"
    assert run(*TWO_HOSTS, "-o", f"{out}/", "-q").exit_code == 0
    script = (out / "launch.sh").read_text()
    assert f"  {doc['head']['node']}|0) host={doc['head']['node']} ;;" in script
    assert "OMNI_MODEL" in script and "mooncake_master" in script


def test_the_api_renders_k8s_with_options():
    from omni_autoconf import Request, plan

    result = plan(Request(gpus="2xH100-80GB", model="qwen3-omni-moe"), fmt="k8s", render_options={"name": "x1"})
    docs = list(yaml.safe_load_all(result.files["k8s.yaml"]))
    assert docs[1]["metadata"]["name"] == "x1"


def test_the_single_host_file_names_are_one_table():
    """The API's `files` and the ConfigMap name a single host's file from multihost.SCHEMA_FILE_NAMES."""
    from omni_autoconf import Request, plan
    from omni_autoconf.emit import multihost

    assert list(plan(Request(gpus="2xH100-80GB", model="qwen3-omni-moe")).files) == [multihost.SCHEMA_FILE_NAMES["deploy"]]
    _, docs = manifests(*FLAGSHIP)
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    assert list(config_map["data"]) == [multihost.SCHEMA_FILE_NAMES["deploy"]]

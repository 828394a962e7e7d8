"""Plans over several hosts: TP groups stay on one host, identical hosts are one plan, and
what is emitted (a deploy file per host, the commands of launch.sh) passes the vLLM-Omni
wheel's own loader, device splitter, layout check and argument flags (read from the wheel
of each version; skipped offline)."""

from __future__ import annotations

import os

import argparse
import ast
import json
import shlex
import subprocess

import pytest
import yaml
from click.testing import CliRunner

from omni_autoconf.inputs.catalog import lookup_model
from omni_autoconf.cli.main import main
from omni_autoconf.inputs.gpus import local_index, parse_inventory
from omni_autoconf.emit.multihost import commands, crosses_hosts, edges, file_name, head_of, layouts
from omni_autoconf.planning.planner import Request, plan
from omni_autoconf.emit.render import render_deploy
from omni_autoconf.vllm.facts import omni_version

from test_replicas import _layout_check, _splitter
from wheels import load_stage_config, source

MULTI_HOST_VERSIONS = ["0.26", "0.28", "0.30"]


def multi(gpus: str, nodes: int | None = None, version: str = "0.30", model: str = "qwen3-omni-moe", **kw):
    v = omni_version(version)
    return plan(Request(pipeline=lookup_model(model), gpus=tuple(parse_inventory(gpus, nodes)), version=v,
                        schema="deploy", **kw))


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


# --- the plan ---------------------------------------------------------------------------


def test_eight_hosts_of_eight_plan_every_gpu_proven():
    result = multi("8xH100-80GB", nodes=8, replicas="auto")
    assert result.status == "optimal" or result.gap <= 0.01
    assert len({d for sp in result.stages for d in sp.devices}) == 64
    single_host = multi("8xH100-80GB", replicas="auto")
    assert result.min_kv_requests >= 7.5 * single_host.min_kv_requests  # eight hosts hold about eight times


def test_a_tp_group_never_spans_hosts():
    for gpus, nodes in [("8xH100-80GB", 2), ("node0=4xH100-80GB;node1=2xH100-80GB;node2=2xA100-80GB", None),
                        ("2xH100-80GB", 3)]:
        result = multi(gpus, nodes)
        hosts = [g.gpu.node for g in result.gpus]
        for sp in result.stages:
            for group in sp.replica_devices():
                assert len({hosts[d] for d in group}) == 1, (gpus, sp.stage.name, group)


def test_identical_hosts_are_used_in_order():
    """Relabelling identical hosts gives no new plan: the first holds at least what the next does."""
    from omni_autoconf.opt.patterns import patterns as _patterns

    result = multi("4xH100-80GB", nodes=3)
    patterns = _patterns(len(result.stages))
    held = {g.gpu.index: sum(1 << s for s, sp in enumerate(result.stages) if g.gpu.index in sp.devices)
            for g in result.gpus}
    vectors = [[sum(1 for g in result.gpus if g.gpu.node == f"node{h}" and held[g.gpu.index] == P) for P in patterns]
               for h in range(3)]
    assert vectors == sorted(vectors, reverse=True)
    assert len({tuple(v) for v in vectors}) > 1  # the hosts are not used alike, so the order means something


def test_the_same_inventory_written_either_way_is_the_same_plan():
    by_count = multi("4xH100-80GB", nodes=2)
    by_name = multi("node0=4xH100-80GB;node1=4xH100-80GB")
    assert [render_deploy(by_count, h) for h in layouts(by_count)] == [render_deploy(by_name, h) for h in layouts(by_name)]


def test_over_several_hosts_no_gpu_holds_two_stages():
    """Each (host, stage) is a process of its own, started without vLLM-Omni's init locks."""
    for gpus, nodes in [("4xH100-80GB", 2), ("8xH100-80GB", 2), ("node0=2xH100-80GB;node1=1xL40S", None)]:
        result = multi(gpus, nodes)
        assert all(len(g.stages) <= 1 for g in result.gpus), gpus


# --- the files and commands, against the wheel -------------------------------------------------


def _files(result) -> dict[str, dict]:
    return {file_name(layout): yaml.safe_load(render_deploy(result, layout)) for layout in layouts(result)}


@pytest.mark.parametrize("version", MULTI_HOST_VERSIONS)
def test_each_host_file_loads_and_splits_into_the_planned_replicas(tmp_path, version):
    result = multi("4xH100-80GB", nodes=2, version=version, replicas="auto")
    gpus = [g.gpu for g in result.gpus]
    split = _splitter(version)
    check = _layout_check(version) if source(version, "vllm_omni/config/composable_parallel/apply.py") else None
    loader = load_stage_config(version)
    head, head_stage = head_of(result)
    for layout in layouts(result):
        path = tmp_path / file_name(layout)
        path.write_text(render_deploy(result, layout))
        loaded = {s.stage_id: s for s in loader.load_deploy_config(str(path)).stages}
        for sp in result.stages:
            stage = loaded[sp.stage.stage_id]
            if layout.head:  # the head splits and checks every stage of its file
                if sp.stage.stage_id != head_stage:
                    assert stage.num_replicas == sp.num_replicas  # every replica pre-allocated
                else:  # its own stage: its host's pool of that stage
                    assert stage.devices == ",".join(str(local_index(gpus, gpus[d])) for d in sp.devices
                                                     if gpus[d].node == head)
                got = split(stage.devices, stage.num_replicas, sp.tensor_parallel_size, stage.stage_id)
                assert len(got) == stage.num_replicas
            else:
                here = [[local_index(gpus, gpus[d]) for d in group] for group in sp.replica_devices()
                        if gpus[group[0]].node == layout.node]
                if not here:
                    assert stage.devices is None  # no placement on a host that does not run it
                    continue
                # run_headless: get_headless_replica_devices -> split by --omni-dp-size-local
                got = split(stage.devices, len(here), sp.tensor_parallel_size, stage.stage_id)
                assert got == [",".join(map(str, g)) for g in here]
                assert stage.num_replicas == len(here)
            if check is not None:
                check(stage.devices, tensor_parallel_size=sp.tensor_parallel_size, data_parallel_size=1,
                      pipeline_parallel_size=1, num_replicas=stage.num_replicas, role=f"stage-{stage.stage_id}")


def _omni_parser(version: str) -> argparse.ArgumentParser:
    """An argparse parser with every flag vllm_omni/entrypoints/cli/serve.py of `version`
    adds (names, types, actions, choices as its add_argument calls state them), plus
    vLLM's positional model and --headless, which that serve.py reads (args.headless)."""
    text = source(version, "vllm_omni/entrypoints/cli/serve.py")
    assert "args.headless" in text
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    parser.add_argument("model")
    parser.add_argument("--headless", action="store_true")  # vLLM's own flags from here
    parser.add_argument("--port", type=int)
    types = {"int": int, "str": str, "float": float}
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")]
        if not names:
            continue
        kwargs = {}
        for kw in node.keywords:
            if kw.arg == "type" and isinstance(kw.value, ast.Name) and kw.value.id in types:
                kwargs["type"] = types[kw.value.id]
            elif kw.arg == "action" and isinstance(kw.value, ast.Constant):
                kwargs["action"] = kw.value.value
            elif kw.arg == "action":
                kwargs["action"] = argparse.BooleanOptionalAction
            elif kw.arg == "choices" and isinstance(kw.value, ast.List):
                kwargs["choices"] = [e.value for e in kw.value.elts if isinstance(e, ast.Constant)]
        try:
            parser.add_argument(*names, **kwargs)
        except argparse.ArgumentError:
            pass  # the same flag added on another code path
    return parser


@pytest.mark.parametrize("version", MULTI_HOST_VERSIONS)
def test_every_command_parses_with_that_versions_flags(version):
    parser = _omni_parser(version)
    result = multi("4xH100-80GB", nodes=2, version=version, replicas="auto")
    by_file = {file_name(layout): layout for layout in layouts(result)}
    heads = 0
    for node in {g.gpu.node for g in result.gpus}:
        for command, _ in commands(result, node, layouts(result)):
            words = shlex.split(command.replace('"$OMNI_MASTER_ADDR"', "10.0.0.1").replace('"$OMNI_MASTER_PORT"', "29600")
                                .replace('"$OMNI_API_PORT"', "8000"))
            assert words[:2] == ["vllm", "serve"]
            args = parser.parse_args(words[2:])
            layout = by_file[args.deploy_config]
            assert args.omni and layout.node == node
            assert args.stage_id is not None and args.omni_master_address and args.omni_master_port == 29600
            assert args.omni_dp_size_local == layout.replicas[args.stage_id] >= 1
            assert args.headless != layout.head
            heads += layout.head
    assert heads == 1  # one head serves the API


def test_once_an_edge_crosses_hosts_every_edge_uses_the_cross_host_connector():
    """A stage worker sends on the connector it receives on (its first inbound edge's)."""
    result = multi("node0=2xH100-80GB;node1=1xH100-80GB", replicas="1", model="qwen2.5-omni-7b")
    assert crosses_hosts(result)
    factory = source("0.30", "vllm_omni/distributed/omni_connectors/factory.py")
    assert '"MooncakeStoreConnector"' in factory
    for name, doc in _files(result).items():
        connector = doc["connectors"]["connector_across_hosts"]
        # the host's address comes from OMNI_HOST_ADDR when vLLM-Omni loads the file (OmegaConf
        # resolves it), else the host's own name
        from omegaconf import OmegaConf

        os.environ.pop("OMNI_HOST_ADDR", None)
        extra = OmegaConf.to_container(OmegaConf.create(connector["extra"]), resolve=True)
        assert connector["name"] == "MooncakeStoreConnector" and extra["host"] in ("node0", "node1")
        by_id = {s["stage_id"]: s for s in doc["stages"]}
        for a, b in edges(result):
            assert by_id[b]["input_connectors"][f"from_stage_{a}"] == "connector_across_hosts", (name, a, b)


def test_the_head_prefers_a_stage_its_host_holds_alone():
    result = multi("4xH100-80GB", nodes=2, replicas="auto")
    head, stage = head_of(result)
    holders = {result.gpus[d].gpu.node for sp in result.stages if sp.stage.stage_id == stage for d in sp.devices}
    assert holders == {head}


# --- the command line -----------------------------------------------------------------------


def test_a_multi_host_plan_is_a_folder_of_files_and_launch_sh(tmp_path):
    out = tmp_path / "plan"
    result = run("--nodes", "2", "--gpus", "4xH100-80GB", "--model", "qwen3-omni-moe", "-o", f"{out}/", "-q")
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["head.yaml", "host-node0.yaml", "host-node1.yaml", "launch.sh"]
    assert "--nodes 2 --gpus 4xH100-80GB" in (out / "host-node0.yaml").read_text().splitlines()[1]
    script = out / "launch.sh"
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
    usage = subprocess.run(["sh", str(script)], capture_output=True, text=True)
    assert usage.returncode == 2 and "one of: node0 node1" in usage.stderr
    doc = json.loads(run("--nodes", "2", "--gpus", "4xH100-80GB", "--model", "qwen3-omni-moe", "--format", "json").stdout)
    assert [h["node"] for h in doc["hosts"]] == ["node0", "node1"] and doc["head"]["node"] in ("node0", "node1")
    assert sorted(doc["deploy_files"]) == ["head.yaml", "host-node0.yaml", "host-node1.yaml"]
    assert {r["node"] for s in doc["stages"] for r in s["replicas"]} <= {"node0", "node1"}


@pytest.mark.parametrize("args, needle", [
    (["--nodes", "2", "--gpus", "4xH100-80GB"], "give -o FOLDER"),
    (["--nodes", "2", "--gpus", "4xH100-80GB", "--omni-version", "0.20", "--format", "json"], "0.26+"),
    (["--nodes", "2", "--gpus", "4xH100-80GB", "--omni-version", "0.24", "--format", "json"], "ignore the connectors"),
    (["--nodes", "2", "--gpus", "4xH100-80GB", "--omni-version", "0.26", "--schema", "stage-args", "--format", "json"],
     "use --schema deploy"),
    (["--nodes", "2", "--gpus", "4xH100-80GB", "--omni-version", "0.16"], "0.26+"),  # before asking for -o
    (["--gpus", "a=2xH100-80GB;a=2xL40S"], "names host 'a' twice"),
    (["--gpus", "a=2xH100-80GB;A=2xL40S"], "ignoring case"),
    (["--gpus", "a b=2xH100-80GB"], "1 to 63 letters"),
    (["--gpus", "a-=2xH100-80GB;b=1xL40S"], "ending with a letter or digit"),
    (["--gpus", "a=2xH100-80GB;b"], "expected NAME=TERMS"),
    (["--nodes", "2", "--gpus", "4xH100-80GB", "--replicas", "2", "--devices", "thinker=0", "--format", "json"],
     "a pinned stage runs one replica"),
    (["--nodes", "2", "--gpus", "a=2xH100-80GB;b=1xL40S"], "leave it out"),
    (["--nodes", "129", "--gpus", "8xH100-80GB"], "more than 1024 GPUs"),
    (["--nodes", "0", "--gpus", "8xH100-80GB"], "--nodes"),
])
def test_multi_host_input_errors_are_one_line(args, needle):
    result = run(*args, "--model", "qwen3-omni-moe")
    assert result.exit_code == 2 and needle in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_file_where_a_folder_is_needed_is_refused(tmp_path):
    target = tmp_path / "plan.yaml"
    target.write_text("keep me\n")
    result = run("--nodes", "2", "--gpus", "4xH100-80GB", "--model", "qwen3-omni-moe", "-o", target)
    assert result.exit_code == 2 and "writes a folder" in result.stderr
    assert target.read_text() == "keep me\n"


def test_multi_host_defaults_to_the_deploy_schema():
    result = run("--nodes", "2", "--gpus", "4xH100-80GB", "--model", "qwen3-omni-moe", "--omni-version", "0.26",
                 "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["schema"] == "deploy"


def test_a_folder_is_replaced_as_a_whole_and_never_holds_what_we_did_not_write(tmp_path):
    out = tmp_path / "plan"
    assert run("--nodes", "3", "--gpus", "4xH100-80GB", "--model", "qwen3-omni-moe", "-o", f"{out}/", "-q").exit_code == 0
    assert (out / "host-node2.yaml").exists()
    assert run("--nodes", "2", "--gpus", "4xH100-80GB", "--model", "qwen3-omni-moe", "-o", f"{out}/", "-q").exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == ["head.yaml", "host-node0.yaml", "host-node1.yaml", "launch.sh"]  # no node2
    (out / "notes.txt").write_text("mine\n")
    before = {p.name: p.read_text() for p in out.iterdir()}
    result = run("--nodes", "2", "--gpus", "8xH100-80GB", "--model", "qwen3-omni-moe", "-o", f"{out}/")
    assert result.exit_code == 2 and "notes.txt, which omni-autoconf did not write" in result.stderr
    assert {p.name: p.read_text() for p in out.iterdir()} == before  # refused before anything was written


def test_check_refuses_host_files_and_host_inventories(tmp_path):
    out = tmp_path / "plan"
    assert run("--nodes", "2", "--gpus", "4xH100-80GB", "--model", "qwen3-omni-moe", "-o", f"{out}/", "-q").exit_code == 0
    host_file = run("check", out / "host-node0.yaml", "--gpus", "4xH100-80GB", "--model", "qwen3-omni-moe")
    assert host_file.exit_code == 2 and "multi-host plan" in host_file.stderr
    hosts = run("check", out / "host-node0.yaml", "--gpus", "a=4xH100-80GB;b=4xH100-80GB", "--model", "qwen3-omni-moe",
                "--fix", "-o", tmp_path / "fixed.yaml")
    assert hosts.exit_code == 2 and "judges the pipeline of one host" in hosts.stderr
    assert not (tmp_path / "fixed.yaml").exists()


def test_a_model_name_with_a_line_break_is_refused_and_headers_stay_one_line(tmp_path):
    weird = tmp_path / "a\ntouch PWNED\n#"
    weird.mkdir()
    result = run("--nodes", "2", "--gpus", "4xH100-80GB", "--model", weird, "-o", tmp_path / "plan")
    assert result.exit_code == 2 and "line-break character" in result.stderr
    from omni_autoconf.emit.render import comment_text

    assert comment_text("x\ny\u2028z\x85") == "x\\ny\\u2028z\\x85"


def test_extra_gpus_proposed_for_a_multi_host_inventory_go_on_its_last_host():
    result = run("--gpus", "a=1xL40S;b=1xL40S", "--model", "qwen3-omni-moe", "--format", "json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    more = [f for f in doc.get("fixes", []) if f.get("kind", "").startswith("more-gpus")]
    assert more and all("on host b" in f["summary"] for f in more), more


def test_launch_sh_starts_each_hosts_processes_and_passes_on_a_failure(tmp_path):
    """launch.sh run with stand-ins for vllm and curl: every command of the host starts,
    from the script's folder, and a process that fails makes the script fail."""
    import os
    import stat

    out = tmp_path / "plan"
    gpus = "node0=2xH100-80GB;node1=2xH100-80GB;node2=2xH100-80GB"
    assert run("--gpus", gpus, "--model", "qwen3-omni-moe", "-o", f"{out}/", "-q").exit_code == 0
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    (bin_dir / "vllm").write_text(f'#!/bin/sh\necho "$PWD $*" >> {log}\ncase "$*" in *"--stage-id 2 "*) exit 3;; esac\n')
    (bin_dir / "curl").write_text("#!/bin/sh\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OMNI_MASTER_ADDR": "10.0.0.1"}
    result = multi(gpus)
    for node in ("node0", "node1", "node2"):
        log.write_text("")
        done = subprocess.run(["sh", str(out / "launch.sh"), node], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=60)
        calls = log.read_text().splitlines()
        expected = commands(result, node, layouts(result))
        assert len(calls) == len(expected), (node, calls)
        assert all(c.startswith(f"{out} serve ") for c in calls)  # run from the files' folder
        fails = any("--stage-id 2 " in c for c, _ in expected)
        assert done.returncode == (3 if fails else 0), (node, done.stderr)
    missing = subprocess.run(["sh", str(out / "launch.sh"), "node0"], env={**env, "OMNI_MASTER_ADDR": ""},
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "OMNI_MASTER_ADDR" in missing.stderr

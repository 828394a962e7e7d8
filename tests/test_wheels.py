"""Emitted files against the vllm-omni wheel of the version they name (downloaded once,
cached in .cache/; skipped offline): deploy files go through that version's own
load_deploy_config, and every dotted name in a legacy file resolves in that wheel.

The grids hold only the (model, version, schema) cells the tool writes a file for: which
those are is decided at collection by the tool's own refusal (ensure_renderable). Every
other cell is a refusal, and one test asserts it: the command line exits 2 with that
refusal's one-line message."""

from __future__ import annotations

import ast
import dataclasses

import pytest
import yaml
from click.testing import CliRunner

from omni_autoconf.cli.main import main
from omni_autoconf.inputs.catalog import model_catalog
from omni_autoconf.errors import InputError
from omni_autoconf.planning.planner import plan
from omni_autoconf.emit.render import ensure_renderable, render_deploy, render_stage_args
from omni_autoconf.vllm.facts import in_range

from conftest import make_request
from wheels import load_stage_config, source

MODELS = sorted(model_catalog())
DEPLOY_VERSIONS = ["0.20", "0.22", "0.24", "0.26", "0.28", "0.30"]
LEGACY_VERSIONS = ["0.14", "0.16", "0.18", "0.20", "0.22", "0.24", "0.26"]


def _effective_engine_args(stage) -> dict:
    """What a loaded StageDeployConfig passes to the engine: its set fields and extras."""
    out = {f.name: getattr(stage, f.name) for f in dataclasses.fields(stage) if getattr(stage, f.name) is not None}
    out.update(out.pop("engine_extras", None) or {})
    return out


# the cards each model's file is written for: two H100s, unless one stage needs more than
# one 80 GB card holds at the TP degrees upstream runs
GPUS_FOR = {"lingbot-world-v2-14b": "2xH200", "hunyuanvideo-1.5-480p-t2v": "2xH200",
            # the Ming thinker runs at TP 4 only (~49.7 GiB a rank), as every bundled file does
            "ming-flash-omni-2.0": "4xH100-80GB", "ming-flash-omni-2.0-thinker-only": "4xH100-80GB",
            # ...and its image file puts the dit on a fifth card (devices "4")
            "ming-flash-omni-2.0-image": "5xH100-80GB",
            # HunyuanImage-3.0's MoE holds ~80 GiB a rank at TP 2 (its AR+dit file's degree), ~41 GiB at TP 4
            "hunyuan-image-3.0": "4xH200", "hunyuan-image-3.0-ar": "4xH100-80GB", "hunyuan-image-3.0-dit": "4xH100-80GB",
            # MiniMax-H3: the encoder at TP 2 as bundled, and the dit holds the whole 33 B DiT (~71 GiB with its VAE
            # decoders) and its largest request on one card, more than 80 GB
            "minimax-h3": "3xH200", "minimax-h3-turbo": "3xH200"}


def _refusal(model: str, gpus: str, version: str, schema: str, kv: str) -> str | None:
    """The tool's refusal to write this cell's file (exit 2), or None when it writes one."""
    try:
        ensure_renderable(make_request(model, gpus, version, schema=schema, kv_cache_dtype=kv))
    except InputError as exc:
        return str(exc)
    return None


# every cell of the two grids: (model, gpus, version, schema, kv)
CELLS = [(m, GPUS_FOR.get(m, "2xH100-80GB"), v, "deploy", kv) for kv in ("auto", "fp8") for m in MODELS
         for v in DEPLOY_VERSIONS] + [(m, "2xH100-80GB", v, "stage-args", "auto") for m in MODELS for v in LEGACY_VERSIONS]
REFUSAL = {cell: _refusal(*cell) for cell in CELLS}
DEPLOY_CELLS = [(m, g, v, kv) for (m, g, v, s, kv), why in REFUSAL.items() if s == "deploy" and why is None]
LEGACY_CELLS = [(m, v) for (m, _, v, s, _), why in REFUSAL.items() if s == "stage-args" and why is None]
REFUSED_CELLS = [cell for cell, why in REFUSAL.items() if why is not None]


def _id(cell) -> str:
    return "-".join(cell)


@pytest.mark.parametrize("model, gpus, version, kv", DEPLOY_CELLS, ids=map(_id, DEPLOY_CELLS))
def test_deploy_file_loads_in_that_versions_loader(tmp_path, model, gpus, version, kv):
    request = make_request(model, gpus, version, schema="deploy", kv_cache_dtype=kv)
    result = plan(request)
    path = tmp_path / "deploy.yaml"
    path.write_text(render_deploy(result))
    loaded = load_stage_config(version).load_deploy_config(str(path))
    named = yaml.safe_load(path.read_text()).get("pipeline")
    if named is not None:  # a pipeline override must be a key of that version's registry
        assert loaded.pipeline == named
        assert f'"{named}":' in source(version, "vllm_omni/config/pipeline_registry.py")
    assert [s.stage_id for s in loaded.stages] == [sp.stage.stage_id for sp in result.stages]
    for stage, sp in zip(loaded.stages, result.stages):
        args = _effective_engine_args(stage)
        assert str(stage.devices) == ",".join(map(str, sp.devices))
        assert args["tensor_parallel_size"] == sp.tensor_parallel_size
        assert args["gpu_memory_utilization"] == sp.gpu_memory_utilization
        assert args["max_num_seqs"] == sp.knobs.max_num_seqs
        assert args["max_num_batched_tokens"] == sp.knobs.max_num_batched_tokens
        assert args["enforce_eager"] == sp.knobs.enforce_eager
        if sp.stage.has_kv_cache:
            assert args["max_model_len"] == sp.knobs.max_model_len
            assert args.get("kv_cache_dtype", "auto") == kv
        chunked = sp.stage.deploy_fields.get("engine_extras", {}).get("enable_chunked_prefill")
        if chunked is not None:
            assert args["enable_chunked_prefill"] == chunked  # what the engine-config check assumed


def _dotted_names(doc) -> list[str]:
    names = []

    def walk(node):
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str) and node.startswith("vllm_omni.") and " " not in node:
            names.append(node)

    walk(doc)
    return names


def _defines(version: str, dotted: str) -> bool:
    module, _, name = dotted.rpartition(".")
    text = source(version, module.replace(".", "/") + ".py")
    if text is None:
        return False
    tree = ast.parse(text)
    return any(isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and n.name == name for n in tree.body)


@pytest.mark.parametrize("model, version", LEGACY_CELLS, ids=map(_id, LEGACY_CELLS))
def test_every_dotted_name_in_a_legacy_file_exists_in_that_version(model, version):
    request = make_request(model, "2xH100-80GB", version, schema="stage-args")
    doc = yaml.safe_load(render_stage_args(plan(request)))
    names = _dotted_names(doc)
    assert any("stage_input_processors" in n for n in names)
    missing = [n for n in names if not _defines(version, n)]
    assert missing == [], f"vllm-omni {version} lacks {missing}"


@pytest.mark.parametrize("model, first_missing", [("qwen3-omni-moe", "0.26"), ("qwen2.5-omni-7b", "0.24")])
def test_the_refused_versions_really_lack_the_wiring(model, first_missing):
    """The catalog's legacy_versions bound is the wheels' own: the next version lacks it."""
    pipeline = model_catalog()[model]
    names = [n for st in pipeline.stages for n in _dotted_names(st.legacy_fields) if "stage_input_processors" in n]
    assert names and not all(_defines(first_missing, n) for n in names)


def test_the_grids_hold_both_schemas_and_every_model():
    assert len(DEPLOY_CELLS) >= 2 * len(MODELS) and len(LEGACY_CELLS) >= 10
    assert {m for m, *_ in DEPLOY_CELLS} == set(MODELS)  # each model has a deploy file in some version


@pytest.mark.parametrize("model, gpus, version, schema, kv", REFUSED_CELLS, ids=map(_id, REFUSED_CELLS))
def test_a_cell_without_a_file_is_refused_with_exit_2(model, gpus, version, schema, kv):
    """The cells the grids above leave out: no such file is written for that version, and
    the command line says so in one line and exits 2 (a version outside the catalog's range)."""
    pipeline = model_catalog()[model]
    if schema == "deploy":
        assert not in_range(version, pipeline.deploy_versions)
    else:
        assert pipeline.legacy_versions is None or not in_range(version, pipeline.legacy_versions)
    result = CliRunner().invoke(main, ["--gpus", gpus, "--model", model, "--omni-version", version, "--schema", schema,
                                       "--kv-cache-dtype", kv, "-q"])
    assert result.exit_code == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [f"omni-autoconf: error: {REFUSAL[model, gpus, version, schema, kv]}"]
    assert model in result.stderr

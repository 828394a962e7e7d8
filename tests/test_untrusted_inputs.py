"""Inputs nobody reviewed (issue 21, section 3): a model directory or Hub cache from anywhere,
version strings as people write them, and the signal a cluster manager sends.

Every hostile file here is written by the test; nothing touches the network.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from omni_autoconf.cli.main import main
from test_checkpoints import write_safetensors

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000,
        "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}
TABLE = {"model.embed_tokens.weight": ("BF16", [1000, 256])}
TABLE_BYTES = 1000 * 256 * 2
CLI = [sys.executable, "-m", "omni_autoconf"]
SECRET = b"root:x:0:0:root:/root:/bin/bash\n"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line_error(result, code: int = 2) -> bool:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    return result.exit_code == code and len(lines) == 1 and lines[0].startswith("omni-autoconf: ") and (
        "Traceback" not in result.stderr)


def model_dir(root: Path, config: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config or TINY))
    return root


def raw_safetensors(path: Path, header: dict, data_bytes: int) -> None:
    """A safetensors file with exactly this header (no checks) and `data_bytes` of data."""
    blob = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        f.truncate(8 + len(blob) + data_bytes)


def sharded(root: Path, weight_map: dict) -> None:
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


# --- 1. shards confined to the model directory; no file content in an error ----------------------

@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "passwd"
    path.write_bytes(SECRET)
    return path


def _no_content(text: str) -> bool:
    (as_length,) = struct.unpack("<Q", SECRET[:8])  # what the old error called a "header length"
    return str(as_length) not in text and "root:x" not in text


@pytest.mark.parametrize("name", ["../passwd", "ABSOLUTE", "sub/../../passwd"])
def test_an_index_naming_a_file_outside_the_directory_is_refused_without_its_content(tmp_path, secret, name):
    root = model_dir(tmp_path / "model")
    write_safetensors(root / "model-00001-of-00002.safetensors", TABLE)
    (root / "sub").mkdir()
    shard = str(secret) if name == "ABSOLUTE" else name
    sharded(root, {"model.embed_tokens.weight": "model-00001-of-00002.safetensors", "lm_head.weight": shard})
    result = run("--gpus", "1xH100-80GB", "--model", root)
    assert one_line_error(result), result.stderr
    assert "outside the model directory" in result.stderr and "model.safetensors.index.json" in result.stderr
    assert _no_content(result.stderr)


def test_a_shard_that_links_out_of_the_directory_is_refused(tmp_path, secret):
    root = model_dir(tmp_path / "model")
    (root / "model.safetensors").symlink_to(secret)
    result = run("--gpus", "1xH100-80GB", "--model", root)
    assert one_line_error(result) and "model.safetensors" in result.stderr and "link" in result.stderr
    assert _no_content(result.stderr)


def test_a_linked_folder_does_not_lead_out_either(tmp_path, secret):
    root = model_dir(tmp_path / "model")
    (root / "weights").symlink_to(tmp_path)
    write_safetensors(root / "model-00001-of-00002.safetensors", TABLE)
    sharded(root, {"model.embed_tokens.weight": "model-00001-of-00002.safetensors", "x": "weights/passwd"})
    result = run("--gpus", "1xH100-80GB", "--model", root)
    assert one_line_error(result) and _no_content(result.stderr)


def test_a_file_that_is_no_safetensors_is_named_without_its_bytes(tmp_path):
    root = model_dir(tmp_path / "model")
    (root / "model.safetensors").write_bytes(SECRET * 4)
    result = run("--gpus", "1xH100-80GB", "--model", root)
    assert one_line_error(result) and "model.safetensors: not a safetensors file" in result.stderr
    assert _no_content(result.stderr)


def hf_cache(cache: Path, repo: str, files: dict[str, object], revision: str = "0123abcd" * 5) -> Path:
    """The Hugging Face cache layout (huggingface_hub 2.4.0 file_download.py: models--ORG--NAME/
    blobs/<etag>, snapshots/<revision>/<file> -> ../../blobs/<etag>, refs/main holding the revision).
    `files` maps a file name to a dict (JSON) or a tensor table (safetensors). Returns the snapshot."""
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / revision
    (repo_dir / "blobs").mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(revision)
    for i, (name, content) in enumerate(files.items()):
        blob = repo_dir / "blobs" / f"{i:040x}"
        if name.endswith(".safetensors"):
            write_safetensors(blob, content)
        else:
            blob.write_text(json.dumps(content))
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


def test_a_cache_snapshot_directory_follows_its_links_into_its_blobs(tmp_path):
    snapshot = hf_cache(tmp_path / "hub", "org/tiny", {"config.json": TINY, "model.safetensors": TABLE})
    result = run("--gpus", "1xH100-80GB", "--model", snapshot, "--format", "json", "-q")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["stages"][0]["weights_bytes"] == TABLE_BYTES


def test_a_cache_snapshot_linking_into_another_repos_blobs_is_refused(tmp_path):
    snapshot = hf_cache(tmp_path / "hub", "org/tiny", {"config.json": TINY})
    other = hf_cache(tmp_path / "hub", "org/other", {"model.safetensors": TABLE})
    (snapshot / "model.safetensors").symlink_to((other / "model.safetensors").resolve())
    result = run("--gpus", "1xH100-80GB", "--model", snapshot)
    assert one_line_error(result) and "link" in result.stderr


# --- 2. headers validated as the safetensors format defines them ---------------------------------

GIB = 1 << 30


def test_forty_tensors_over_one_range_are_refused_naming_the_file_and_tensor(tmp_path):
    root = model_dir(tmp_path / "model")
    header = {f"model.layers.{i}.weight": {"dtype": "BF16", "shape": [GIB // 2], "data_offsets": [0, GIB]}
              for i in range(40)}
    raw_safetensors(root / "model.safetensors", header, GIB)
    result = run("--gpus", "1xH100-80GB", "--model", root)
    assert one_line_error(result), result.stderr
    assert "model.safetensors" in result.stderr and re.search(r"tensor 'model\.layers\.\d+\.weight'", result.stderr)
    assert "overlaps" in result.stderr


@pytest.mark.parametrize("header, data_bytes, needle", [
    ({"a": {"dtype": "BF16", "shape": [5], "data_offsets": [0, 10]},
      "b": {"dtype": "BF16", "shape": [5], "data_offsets": [20, 30]}}, 30, "tensor 'b'"),  # a hole
    ({"a": {"dtype": "BF16", "shape": [8], "data_offsets": [0, 10]}}, 10, "tensor 'a'"),  # 16 bytes claimed as 10
    ({"a": {"dtype": "BF16", "shape": [5], "data_offsets": [0, 10]}}, 50, "belong to no tensor"),  # trailing bytes
    ({"a": {"dtype": "BF16", "shape": [5], "data_offsets": [0, 10]}}, 4, "tensor 'a'"),  # past the end
    ({"a": {"dtype": "BF16", "data_offsets": [0, 10]}}, 10, "tensor 'a'"),  # no shape
    ({"a": {"dtype": "BF16", "shape": [-5], "data_offsets": [0, 10]}}, 10, "tensor 'a'"),
    ({"a": {"dtype": "BF16", "shape": [5], "data_offsets": [0, True]}}, 10, "tensor 'a'"),
    ({"a": {"dtype": "Q4", "shape": [5], "data_offsets": [0, 10]}}, 10, "tensor 'a'"),
    ({"__metadata__": {"format": 3}, "a": {"dtype": "BF16", "shape": [5], "data_offsets": [0, 10]}}, 10,
     "__metadata__"),
])
def test_a_header_the_format_does_not_allow_is_one_line_naming_file_and_tensor(tmp_path, header, data_bytes, needle):
    root = model_dir(tmp_path / "model")
    raw_safetensors(root / "model.safetensors", {**header}, data_bytes)
    result = run("--gpus", "1xH100-80GB", "--model", root)
    assert one_line_error(result), result.stderr
    assert "model.safetensors" in result.stderr and needle in result.stderr, result.stderr


def test_what_the_format_allows_is_read(tmp_path):
    """__metadata__, a scalar (shape []), an empty tensor, sub-byte F4 packed two to a byte."""
    from omni_autoconf.inputs.checkpoint import parse_header

    header = {"__metadata__": {"format": "pt"},
              "s": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
              "e": {"dtype": "BF16", "shape": [0, 7], "data_offsets": [4, 4]},
              "f": {"dtype": "F4", "shape": [3, 2], "data_offsets": [4, 7]}}
    assert [(t.name, t.nbytes) for t in parse_header(header, "x", data_bytes=7)] == [("s", 4), ("e", 0), ("f", 3)]


def test_a_tensor_in_two_shards_is_refused(tmp_path):
    root = model_dir(tmp_path / "model")
    write_safetensors(root / "model-00001-of-00002.safetensors", TABLE)
    write_safetensors(root / "model-00002-of-00002.safetensors", TABLE)
    sharded(root, {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                   "lm_head.weight": "model-00002-of-00002.safetensors"})
    result = run("--gpus", "1xH100-80GB", "--model", root)
    assert one_line_error(result) and "model.embed_tokens.weight" in result.stderr, result.stderr


def test_the_hubs_header_metadata_is_held_to_the_same_rules(tmp_path, monkeypatch):
    """The Hub call (huggingface_hub's get_safetensors_metadata), faked: overlapping tensors."""
    import huggingface_hub
    from huggingface_hub.utils import SafetensorsFileMetadata, SafetensorsRepoMetadata, TensorInfo

    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))
    tensors = {f"model.layers.{i}.weight": TensorInfo(dtype="BF16", shape=[512], data_offsets=(0, 1024))
               for i in range(40)}
    meta = SafetensorsRepoMetadata(metadata=None, sharded=False, weight_map={n: "model.safetensors" for n in tensors},
                                   files_metadata={"model.safetensors": SafetensorsFileMetadata(metadata={},
                                                                                                tensors=tensors)})
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setattr("omni_autoconf.inputs.checkpoint.CACHE_DIR", tmp_path / "private")
    monkeypatch.setattr("omni_autoconf.inputs.checkpoint._reachable", lambda *a: None)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: str(config))
    monkeypatch.setattr(huggingface_hub.HfApi, "get_safetensors_metadata", lambda self, *a, **k: meta)
    result = run("--gpus", "1xH100-80GB", "--model", "org/tiny")
    assert one_line_error(result) and "org/tiny/model.safetensors: tensor" in result.stderr, result.stderr
    assert "overlaps" in result.stderr


# --- 3. model_type must be a string ---------------------------------------------------------------

@pytest.mark.parametrize("value", [["llama"], 7, None, {"a": 1}])
def test_a_model_type_that_is_no_string_is_refused_naming_the_key(tmp_path, value):
    root = model_dir(tmp_path / "model", {**TINY, "model_type": value})
    write_safetensors(root / "model.safetensors", TABLE)
    result = run("--gpus", "1xH100-80GB", "--model", root)
    assert one_line_error(result) and "model_type" in result.stderr and "config.json" in result.stderr, result.stderr


# --- 4. patch versions, accepted on purpose and recorded ------------------------------------------

def test_a_patch_version_plans_as_its_release_and_is_recorded():
    args = ["--gpus", "1xRTX4090", "--model", "qwen2.5-omni-3b", "--max-model-len", "4096", "--max-num-batched-tokens",
            "4096", "-q"]
    given = run(*args, "--omni-version", "0.30.7")
    assert given.exit_code == 0, given.stderr
    inputs = re.search(r"^# Inputs: omni-autoconf (.*)$", given.stdout, re.M).group(1)
    assert "--omni-version 0.30.7" in inputs
    again = run(*shlex.split(inputs), "-q")
    assert again.exit_code == 0 and again.stdout == given.stdout  # the recorded command reproduces it
    plain = run(*args, "--omni-version", "0.30")
    assert plain.stdout.replace("--omni-version 0.30 ", "--omni-version 0.30.7 ") == given.stdout
    data = json.loads(run(*args, "--omni-version", "v0.30.7", "--format", "json").stdout)
    assert data["omni_version"] == "0.30" and data["omni_version_given"] == "0.30.7"
    assert "omni_version_given" not in json.loads(run(*args, "--format", "json").stdout)


@pytest.mark.parametrize("text", ["0.30.x", "0.30.7.1.2", "0.30.", "0.30.7 extra", "0.31.0", "0.30.-1"])
def test_a_version_that_is_no_release_is_refused(text):
    result = run("--gpus", "1xRTX4090", "--model", "qwen2.5-omni-3b", "--omni-version", text)
    assert one_line_error(result) and "vLLM-Omni version" in result.stderr and repr(text) in result.stderr


def test_pre_release_and_post_release_patch_versions_are_read():
    from omni_autoconf.vllm.facts import omni_version

    for text in ("0.30.0", "v0.30.1", "0.30.0rc1", "0.30.2.post1", " 0.30 "):
        assert omni_version(text).name == "0.30", text


# --- 5. SIGTERM: one line, exit 143, the target untouched --------------------------------------------

def test_sigterm_mid_solve_exits_143_in_one_line_and_leaves_the_file(tmp_path):
    out = tmp_path / "plan.yaml"
    out.write_text("the user's file\n")
    gpus = "8xH100-80GB,8xA100-80GB,8xL40S,8xA10,8xA100-40GB,8xRTX4090"
    proc = subprocess.Popen([*CLI, "--gpus", gpus, "--model", "qwen3-omni-moe", "--workers", "1", "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stderr.readline()
    assert "planning" in first, first
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("hung after SIGTERM")
    if proc.returncode == 0:
        pytest.skip("the solve finished before the signal on this machine")
    assert proc.returncode == 143, (proc.returncode, err)
    assert err.strip().splitlines() == ["omni-autoconf: terminated (SIGTERM); nothing was written"]
    assert out.read_text() == "the user's file\n"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.yaml"]


@pytest.mark.parametrize("delay", [0.25, 0.5])
def test_sigterm_while_modules_load_is_one_line_and_143(tmp_path, delay):
    out = tmp_path / "plan.yaml"
    out.write_text("the user's file\n")
    proc = subprocess.Popen([*CLI, "--gpus", "2xH100-80GB", "--model", "qwen3-omni-moe", "-q", "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    # Python starts and the tool installs its handler within tens of milliseconds: the signal
    # lands in the tool's imports or its work, never before (there, SIGTERM would end it as -15)
    assert proc.returncode in (0, 143), (proc.returncode, err)
    assert "internal error" not in err and "Traceback" not in err
    if proc.returncode == 143:
        assert out.read_text() == "the user's file\n" and err.strip().splitlines() == [
            "omni-autoconf: terminated (SIGTERM); nothing was written"]


# (SIGTERM during the write: tests/test_hostile.py, beside Ctrl-C)


# --- 6. the standard Hugging Face cache, offline ---------------------------------------------------

@pytest.fixture
def offline(tmp_path, monkeypatch):
    """HF_HUB_OFFLINE=1, an empty private cache, and a network probe that fails the test."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("omni_autoconf.inputs.checkpoint.CACHE_DIR", tmp_path / "private")
    monkeypatch.setattr("omni_autoconf.inputs.checkpoint._reachable", lambda *a: pytest.fail("the network was asked"))
    for name in ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_a_model_in_the_hf_hub_cache_plans_offline(tmp_path, offline):
    hf_cache(tmp_path / "hub", "org/tiny", {"config.json": TINY, "model.safetensors": TABLE})
    offline.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    result = run("--gpus", "1xH100-80GB", "--model", "org/tiny", "--format", "json", "-q")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["stages"][0]["weights_bytes"] == TABLE_BYTES and data["model_ref"] == "org/tiny"
    assert str(tmp_path) not in result.stdout  # the plan names the Hub id, not this machine's cache


def test_a_sharded_model_in_hf_home_plans_offline(tmp_path, offline):
    half = {"model.layers.0.weight": ("BF16", [256, 256])}
    hf_cache(tmp_path / "home" / "hub", "org/tiny", {
        "config.json": TINY, "model.safetensors.index.json": {"weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "model.layers.0.weight": "model-00002-of-00002.safetensors"}},
        "model-00001-of-00002.safetensors": TABLE, "model-00002-of-00002.safetensors": half})
    offline.setenv("HF_HOME", str(tmp_path / "home"))
    result = run("--gpus", "1xH100-80GB", "--model", "org/tiny", "--format", "json", "-q")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["stages"][0]["weights_bytes"] == TABLE_BYTES + 256 * 256 * 2


def test_a_model_vllm_downloaded_plans_offline_from_the_command_line(tmp_path):
    """A fresh process, the cache named by HF_HOME alone: the environment a vLLM host has."""
    hf_cache(tmp_path / "home" / "hub", "org/tiny", {"config.json": TINY, "model.safetensors": TABLE})
    env = {**os.environ, "HF_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1",
           "OMNI_AUTOCONF_CACHE": str(tmp_path / "private"), "HF_ENDPOINT": "http://127.0.0.1:9"}
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        env.pop(name, None)
    done = subprocess.run([*CLI, "--gpus", "1xH100-80GB", "--model", "org/tiny", "-q"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--model org/tiny" in done.stdout


def test_a_model_half_in_the_cache_names_the_missing_file_offline(tmp_path, offline):
    hf_cache(tmp_path / "hub", "org/tiny", {"config.json": TINY, "model.safetensors.index.json": {
        "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}})
    offline.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    result = run("--gpus", "1xH100-80GB", "--model", "org/tiny")
    assert one_line_error(result), result.stderr
    assert "model-00001-of-00002.safetensors" in result.stderr and "HF_HUB_OFFLINE" in result.stderr


def test_a_cached_snapshot_with_a_hostile_index_is_confined_too(tmp_path, offline, secret):
    hf_cache(tmp_path / "hub", "org/tiny", {"config.json": TINY, "model.safetensors.index.json": {
        "weight_map": {"model.embed_tokens.weight": str(secret)}}})
    offline.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    result = run("--gpus", "1xH100-80GB", "--model", "org/tiny")
    assert one_line_error(result) and "outside the model directory" in result.stderr and _no_content(result.stderr)

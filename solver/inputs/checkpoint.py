"""A checkpoint's numbers: config.json and the tensor sizes of its safetensors headers.

Only headers are read: a safetensors file starts with an 8-byte little-endian length and a
JSON header naming every tensor's dtype, shape and byte range
(https://huggingface.co/docs/safetensors/index#format); the tensors themselves are never
touched. A local directory is read from disk (sharded through
model.safetensors.index.json); a Hub id through huggingface_hub's header-only metadata
call, cached for the next run. Every failure is an InputError naming the file.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from .yamlio import parse_json, read_text

MAX_HEADER_BYTES = 100 << 20  # a header this large is not a checkpoint's
CACHE_DIR = Path(os.environ.get("OMNI_AUTOCONF_CACHE", Path.home() / ".cache" / "omni-autoconf"))


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # safetensors dtype: BF16, F16, F32, F8_E4M3, I32, U8, ...
    nbytes: int  # stored size: data_offsets end - start


@dataclass(frozen=True)
class Checkpoint:
    source: str  # the directory or Hub id
    config: dict
    tensors: tuple[Tensor, ...]

    def bytes_with_prefix(self, *prefixes: str) -> int:
        return sum(t.nbytes for t in self.tensors if t.name.startswith(prefixes))

    def with_prefix(self, *prefixes: str) -> list[Tensor]:
        return [t for t in self.tensors if t.name.startswith(prefixes)]

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def _header(path: Path) -> list[Tensor]:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise InputError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
            (length,) = struct.unpack("<Q", raw)
            if length > MAX_HEADER_BYTES or 8 + length > size:
                raise InputError(f"{path}: not a safetensors file (header length {length} for a {size}-byte file)")
            text = f.read(length).decode("utf-8")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: its safetensors header is not valid JSON") from None
    header = parse_json(text, f"{path}: its safetensors header")
    return parse_header(header, str(path), data_bytes=size - 8 - length)


def parse_header(header, where: str, data_bytes: int | None = None) -> list[Tensor]:
    """Tensors of a parsed safetensors header (a dict), checked for shape and offsets."""
    if not isinstance(header, dict):
        raise InputError(f"{where}: its safetensors header is not a JSON object")
    tensors = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = info["data_offsets"]
            dtype = str(info["dtype"])
            if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{where}: tensor {name!r} has no valid dtype and data_offsets") from None
        if data_bytes is not None and end > data_bytes:
            raise InputError(f"{where}: tensor {name!r} ends at byte {end}, past the file's {data_bytes} data bytes")
        tensors.append(Tensor(name, dtype, end - start))
    return tensors


def _json(path: Path) -> dict:
    value = parse_json(read_text(path), str(path))
    if not isinstance(value, dict):
        raise InputError(f"{path}: expected a JSON object")
    return value


def read_local(directory: str) -> Checkpoint:
    """config.json and every tensor header of a local Hugging Face model directory."""
    root = Path(directory)
    if not root.is_dir():
        raise InputError(f"{directory}: not a directory")
    config_path = root / "config.json"
    if not config_path.is_file():
        if (root / "params.json").is_file():  # Mistral's own format (Voxtral TTS), which vLLM reads by config_format
            raise InputError(f"{root}: a Mistral-format directory (params.json, no config.json) is not read; plan a "
                             f"catalog pipeline by its name (`omni-autoconf models` lists them)")
        raise InputError(f"{config_path}: missing; a model directory needs its config.json")
    return Checkpoint(str(root), _json(config_path), tuple(_shard_tensors(root, directory)))


def with_subfolders(ckpt: Checkpoint, subfolders: list[str]) -> Checkpoint:
    """`ckpt` with the tensors of its subfolders' shards too, named `SUB/tensor` (the
    Qwen3-TTS codec sits in speech_tokenizer/). Only a local directory has them here."""
    if not subfolders:
        return ckpt
    root = Path(ckpt.source)
    if not root.is_dir():
        raise InputError(f"{ckpt.source}: its weights sit in {', '.join(s + '/' for s in subfolders)} as well, which "
                         "the Hub's header-only call does not reach: pass a local model directory")
    extra: list[Tensor] = []
    for sub in subfolders:
        folder = root / sub
        if not folder.is_dir():
            raise InputError(f"{folder}: missing; this model keeps part of its weights there")
        extra += [Tensor(f"{sub}/{t.name}", t.dtype, t.nbytes) for t in _shard_tensors(folder, str(folder))]
    return Checkpoint(ckpt.source, ckpt.config, ckpt.tensors + tuple(extra))


def _shard_tensors(root: Path, directory: str) -> list[Tensor]:
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise InputError(f"{index}: has no weight_map")
        shards = sorted(set(map(str, weight_map.values())))
    elif (root / "model.safetensors").is_file():
        shards = ["model.safetensors"]
    else:
        found = sorted(p.name for p in root.glob("*.safetensors"))
        if not found:
            raise InputError(f"{directory}: no model.safetensors, no model.safetensors.index.json and no "
                             "*.safetensors file: only safetensors checkpoints are read")
        shards = found
    tensors: list[Tensor] = []
    for shard in shards:
        path = root / shard
        if not path.is_file():
            raise InputError(f"{path}: named by {index.name} but missing")
        tensors += _header(path)
    return tensors


def read_hub(repo_id: str) -> Checkpoint:
    """config.json and the safetensors headers of a Hub model (a few KB, never the
    weights), cached under CACHE_DIR. Offline (HF_HUB_OFFLINE=1) or unreachable, the cache
    answers or the error says to pass a local directory."""
    cached = CACHE_DIR / "hub" / (repo_id.replace("/", "--") + ".json")
    if cached.is_file():
        data = json.loads(cached.read_text())
        return Checkpoint(repo_id, data["config"], tuple(Tensor(*t) for t in data["tensors"]))
    advice = f"pass a local model directory instead of {repo_id!r}"
    if os.environ.get("HF_HUB_OFFLINE", "").strip() not in ("", "0"):
        raise InputError(f"HF_HUB_OFFLINE is set and {repo_id} is not in the cache ({cached}): {advice}")
    _reachable(advice)
    try:
        import logging

        from huggingface_hub import HfApi, hf_hub_download

        logging.getLogger("huggingface_hub").setLevel(logging.ERROR)  # its retry chatter: we say it in one line
        config_file = hf_hub_download(repo_id, "config.json")
        meta = HfApi().get_safetensors_metadata(repo_id)
    except ImportError:
        raise InputError(f"huggingface_hub is not installed: {advice}") from None
    except Exception as exc:  # network, auth, missing repo: one line, never a traceback
        raise InputError(f"cannot read {repo_id} from the Hub ({type(exc).__name__}): {advice}") from None
    config = _json(Path(config_file))
    tensors = []
    for filename, file_meta in meta.files_metadata.items():
        header = {name: {"dtype": t.dtype, "data_offsets": list(t.data_offsets)} for name, t in file_meta.tensors.items()}
        tensors += parse_header(header, f"{repo_id}/{filename}")
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps({"config": config, "tensors": [[t.name, t.dtype, t.nbytes] for t in tensors]}))
    return Checkpoint(repo_id, config, tuple(tensors))


HUB_PROBE_TIMEOUT_S = 5.0


def _reachable(advice: str) -> None:
    """Fail in seconds, in one line, when the Hub's host does not answer (huggingface_hub
    itself retries for about 25 s, printing a warning per retry)."""
    import socket
    from urllib.parse import urlparse

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=HUB_PROBE_TIMEOUT_S).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InputError(f"cannot reach {endpoint} ({reason}): {advice}") from None


def looks_like_hub_id(text: str) -> bool:
    return text.count("/") == 1 and not text.startswith((".", "/", "~")) and not Path(text).exists()

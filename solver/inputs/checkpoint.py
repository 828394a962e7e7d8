"""A checkpoint's numbers: config.json and the tensor sizes of its safetensors headers.

Only headers are read: a safetensors file starts with an 8-byte little-endian length and a
JSON header naming every tensor's dtype, shape and byte range
(https://huggingface.co/docs/safetensors/index#format); the tensors themselves are never
touched. A local directory is read from disk (sharded through
model.safetensors.index.json); a Hub id from the standard Hugging Face cache when a download
(vLLM's, huggingface-cli's) put it there, else through huggingface_hub's header-only metadata
call, cached for the next run. Every failure is an InputError naming the file.

The files are nobody's reviewed input: every file read from a model directory must lie inside
it (an index naming `../../etc/passwd` is refused; a symlink is followed only from a Hugging
Face cache snapshot into that repository's blobs/), a header must be what the safetensors
format allows, and an error never quotes a file's bytes.
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
INDEX = "model.safetensors.index.json"
# safetensors dtype -> bits per element: Dtype::bitsize in safetensors/src/tensor.rs
# (https://github.com/huggingface/safetensors, read at commit 24b0b28, crate 0.8.0-dev)
DTYPE_BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
              "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
              "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}
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
    directory: str | None = None  # where its files lie on this machine (a Hub id's cache snapshot), if they do

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
            if length > MAX_HEADER_BYTES or 8 + length > size:  # never say the number: it is the file's bytes
                raise InputError(f"{path}: not a safetensors file (its header length field does not fit its "
                                 f"{size} bytes)")
            text = f.read(length).decode("utf-8")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a safetensors file (its header is not UTF-8 JSON)") from None
    header = parse_json(text, f"{path}: its safetensors header")
    return parse_header(header, str(path), data_bytes=size - 8 - length)


def parse_header(header, where: str, data_bytes: int | None = None) -> list[Tensor]:
    """Tensors of a parsed safetensors header (a dict), checked as the format defines it
    (https://github.com/huggingface/safetensors README "Format", and Metadata::validate and
    read_metadata in safetensors/src/tensor.rs at commit 24b0b28): `__metadata__` a map of
    strings; each tensor a known dtype, a shape of whole numbers and `data_offsets` [begin, end)
    into the data after the header, with end - begin = product(shape) x dtype size; sorted by
    offset, the tensors cover the data from byte 0 without overlap or gap and end where the
    file ends (`data_bytes`, when known). The crate accepts what serde_json reads, so a header
    is not refused for leading whitespace before its `{`. Forty tensors over one range would
    otherwise count forty times."""
    if not isinstance(header, dict):
        raise InputError(f"{where}: its safetensors header is not a JSON object")
    if "__metadata__" in header:
        meta = header["__metadata__"]
        if not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
            raise InputError(f"{where}: its __metadata__ is not a map of strings, as the safetensors format requires")
    spans = []
    for name, info in header.items():
        if name != "__metadata__":
            start, end, dtype = _tensor_span(name, info, where)
            spans.append((start, end, name, dtype))
    spans.sort(key=lambda span: (span[0], span[1]))
    at, previous = 0, None
    for start, end, name, _ in spans:
        if start < at:
            raise InputError(f"{where}: tensor {_shown(name)} (data bytes {start} to {end}) overlaps tensor "
                             f"{_shown(previous)}, which ends at byte {at}")
        if start > at:
            raise InputError(f"{where}: tensor {_shown(name)} starts at data byte {start}, leaving bytes {at} to "
                             f"{start} to no tensor (the safetensors format allows no gap)")
        at, previous = end, name
    if data_bytes is not None and at > data_bytes:
        raise InputError(f"{where}: tensor {_shown(previous)} ends at byte {at}, past the file's {data_bytes} "
                         "data bytes")
    if data_bytes is not None and at < data_bytes:
        last = f" (the last tensor, {_shown(previous)}, ends at byte {at})" if previous is not None else ""
        raise InputError(f"{where}: its data bytes {at} to {data_bytes} belong to no tensor{last}; the safetensors "
                         "format allows no gap")
    return [Tensor(name, dtype, end - start) for start, end, name, dtype in spans]


def _tensor_span(name: str, info, where: str) -> tuple[int, int, str]:
    """(begin, end, dtype) of one tensor entry, its size checked against its shape."""
    tensor = f"{where}: tensor {_shown(name)}"
    if not isinstance(info, dict):
        raise InputError(f"{tensor} is not an object with dtype, shape and data_offsets")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise InputError(f"{tensor} has dtype {_shown(dtype)}, which safetensors does not define")
    if not (isinstance(shape, list) and all(_whole(d) for d in shape)):
        raise InputError(f"{tensor} has no valid shape (a list of whole numbers): {_shown(shape)}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_whole, offsets)) and offsets[0] <= offsets[1]):
        raise InputError(f"{tensor} has no valid data_offsets [begin, end]: {_shown(offsets)}")
    start, end = offsets
    elements = 1
    for d in shape:
        elements *= d
    bits = elements * DTYPE_BITS[dtype]
    if bits % 8:
        raise InputError(f"{tensor}: shape {_shown(shape)} of {dtype} is not a whole number of bytes")
    if end - start != bits // 8:
        raise InputError(f"{tensor}: data_offsets [{start}, {end}] hold {end - start} bytes, but shape "
                         f"{_shown(shape)} of {dtype} is {bits // 8} bytes")
    return start, end, dtype


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _shown(value, limit: int = 120) -> str:
    """A name or value from a file, quoted on one line and cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


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
    config = _json(_confined(root, "config.json", None))
    return Checkpoint(str(root), config, tuple(_shard_tensors(root, directory)), directory=str(root))


def with_subfolders(ckpt: Checkpoint, subfolders: list[str]) -> Checkpoint:
    """`ckpt` with the tensors of its subfolders' shards too, named `SUB/tensor` (the
    Qwen3-TTS codec sits in speech_tokenizer/). Only a checkpoint on disk has them here."""
    if not subfolders:
        return ckpt
    if ckpt.directory is None or not Path(ckpt.directory).is_dir():
        raise InputError(f"{ckpt.source}: its weights sit in {', '.join(s + '/' for s in subfolders)} as well, which "
                         "the Hub's header-only call does not reach: pass a local model directory")
    root = Path(ckpt.directory)
    extra: list[Tensor] = []
    for sub in subfolders:
        folder = root / sub
        if not folder.is_dir():
            raise InputError(f"{folder}: missing; this model keeps part of its weights there")
        _confined(root, sub, None)
        extra += [Tensor(f"{sub}/{t.name}", t.dtype, t.nbytes) for t in _shard_tensors(folder, str(folder))]
    return Checkpoint(ckpt.source, ckpt.config, ckpt.tensors + tuple(extra), directory=ckpt.directory)


def _shard_paths(root: Path) -> tuple[Path | None, list[Path]]:
    """(the index, if there is one; the shard files it names, or else the shards present), each
    confined to `root`; no shard: an empty list."""
    index = root / INDEX
    if index.is_file():
        weight_map = _json(_confined(root, INDEX, None)).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise InputError(f"{index}: has no weight_map")
        names = set()
        for tensor, shard in weight_map.items():
            if not isinstance(shard, str) or not shard.strip():
                raise InputError(f"{index}: weight_map maps tensor {_shown(tensor)} to {_shown(shard)}, not a "
                                 "file name")
            names.add(shard)
        return index, [_confined(root, name, index) for name in sorted(names)]
    if (root / "model.safetensors").is_file():
        return None, [_confined(root, "model.safetensors", None)]
    return None, [_confined(root, p.name, None) for p in sorted(root.glob("*.safetensors"))]


def _shard_tensors(root: Path, directory: str) -> list[Tensor]:
    _, shards = _shard_paths(root)
    if not shards:
        raise InputError(f"{directory}: no model.safetensors, no model.safetensors.index.json and no "
                         "*.safetensors file: only safetensors checkpoints are read")
    tensors: list[Tensor] = []
    seen: dict[str, Path] = {}
    for path in shards:
        if not path.is_file():
            raise InputError(f"{path}: named by {INDEX} but missing")
        for t in _header(path):
            if t.name in seen:  # vLLM would load it twice; its bytes are counted once, or not at all
                raise InputError(f"{path}: tensor {_shown(t.name)} is in {seen[t.name].name} as well")
            seen[t.name] = path
            tensors.append(t)
    return tensors


def _confined(root: Path, name: str, index: Path | None) -> Path:
    """`root / name`, refused unless it lies inside `root`: `name` (from an index, or a file
    found there) may not climb out, and a symlink on the way may lead only from a Hugging Face
    cache snapshot into its own repository's blobs/ (the cache layout: models--ORG--NAME/
    snapshots/<revision>/<file> -> ../../blobs/<hash>, huggingface_hub 2.4.0
    file_download.py _create_symlink). The error names the path, never the file's content."""
    path = root / name
    base = os.path.abspath(root)
    if not _inside(os.path.abspath(os.path.normpath(path)), base):
        by = f"{index}: weight_map names {_shown(name)}" if index is not None else f"{path}: this file lies"
        raise InputError(f"{by}, outside the model directory {root}")
    real, real_base = os.path.realpath(path), os.path.realpath(root)
    if _inside(real, real_base):
        return path
    blobs = _snapshot_blobs(Path(real_base))
    if blobs is not None and _inside(real, os.path.realpath(blobs)):
        return path
    raise InputError(f"{path}: a symbolic link out of the model directory {root}; only a Hugging Face cache "
                     "snapshot's links into its own blobs/ are followed")


def _inside(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def _snapshot_blobs(real_root: Path) -> Path | None:
    """The blobs/ folder of the Hugging Face cache repository whose snapshot holds `real_root`
    (models--ORG--NAME/snapshots/<revision>[/subfolder]), or None."""
    for folder in (real_root, *real_root.parents):
        if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
            return folder.parent.parent / "blobs"
    return None


def hf_hub_cache() -> Path:
    """The standard Hugging Face hub cache, found from the environment as huggingface_hub finds
    it (huggingface_hub 2.4.0 constants.py: HF_HUB_CACHE, else the older HUGGINGFACE_HUB_CACHE,
    else HF_HOME/hub, HF_HOME defaulting to $XDG_CACHE_HOME/huggingface, else
    ~/.cache/huggingface), read at each call: huggingface_hub reads it once, at import."""
    def expand(path: str) -> str:
        return os.path.expandvars(os.path.expanduser(path))

    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return Path(expand(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
                       or os.path.join(expand(home), "hub")))


def _hf_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot of `repo_id`'s main revision that holds its config.json (what
    vLLM's download leaves: refs/main names the revision), or None; never the network."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json", cache_dir=hf_hub_cache())
    except (ValueError, OSError):  # an id huggingface_hub's validators refuse, an unreadable cache
        return None
    return Path(found).parent if isinstance(found, str) else None


def read_hub(repo_id: str) -> Checkpoint:
    """config.json and the safetensors headers of a Hub model: from the standard Hugging Face
    cache when its snapshot of the main revision holds config.json and every shard (a model
    vLLM downloaded: read on disk, offline too); else from the Hub (a few KB, never the
    weights), cached under CACHE_DIR. Offline (HF_HUB_OFFLINE=1) or unreachable, a cache
    answers or the error says to pass a local directory."""
    snapshot = _hf_snapshot(repo_id)
    missing = None
    if snapshot is not None:  # downloaded whole (vLLM's weights and config): read there, as a directory
        _, shards = _shard_paths(snapshot)
        missing = next((p.name for p in shards if not p.is_file()), None if shards else "model.safetensors")
        if missing is None:
            local = read_local(str(snapshot))
            return Checkpoint(repo_id, local.config, local.tensors, directory=str(snapshot))
    cached = CACHE_DIR / "hub" / (repo_id.replace("/", "--") + ".json")
    if cached.is_file():
        data = json.loads(cached.read_text())
        return Checkpoint(repo_id, data["config"], tuple(Tensor(*t) for t in data["tensors"]))
    advice = f"pass a local model directory instead of {repo_id!r}"
    if os.environ.get("HF_HUB_OFFLINE", "").strip() not in ("", "0"):
        if snapshot is not None:
            raise InputError(f"HF_HUB_OFFLINE is set and the Hugging Face cache's snapshot of {repo_id} ({snapshot}) "
                             f"lacks {missing}: {advice}")
        raise InputError(f"HF_HUB_OFFLINE is set and {repo_id} is neither in the Hugging Face cache "
                         f"({hf_hub_cache()}) nor in this tool's ({cached}): {advice}")
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
    tensors, seen = [], {}
    for filename, file_meta in meta.files_metadata.items():
        header = {name: {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": list(t.data_offsets)}
                  for name, t in file_meta.tensors.items()}
        for t in parse_header(header, f"{repo_id}/{filename}"):
            if t.name in seen:
                raise InputError(f"{repo_id}/{filename}: tensor {_shown(t.name)} is in {seen[t.name]} as well")
            seen[t.name] = filename
            tensors.append(t)
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

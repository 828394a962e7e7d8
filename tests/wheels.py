"""Helpers, not tests: the vllm-omni wheels from PyPI, cached under .cache/, for tests that
read or run vLLM-Omni's own loaders (test_wheels, test_verified, test_replicas, test_multihost,
test_check and the pipeline files). Offline, with no cached wheel, the tests that need one
skip with a message."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
import types
import zipfile
from functools import lru_cache
from pathlib import Path

import pytest

CACHE = Path(__file__).resolve().parent.parent / ".cache"
# PyPI has vllm-omni 0.14.0 and later; 0.12 is not published.
WHEEL_VERSIONS = {v: f"{v}.0" for v in ("0.14", "0.16", "0.18", "0.20", "0.22", "0.24", "0.26", "0.28", "0.30")}


@lru_cache(maxsize=None)
def wheel_root(version: str) -> Path:
    """The unpacked vllm-omni wheel of a minor version (downloaded once)."""
    release = WHEEL_VERSIONS.get(version)
    if release is None:  # a test's own mistake, not this machine's: fail rather than skip
        pytest.fail(f"vllm-omni {version} is not published on PyPI: no test can read its wheel")
    target = CACHE / f"vllm_omni-{release}"
    if (target / "vllm_omni").is_dir():
        return target
    CACHE.mkdir(exist_ok=True)
    wheels = sorted(CACHE.glob(f"vllm_omni-{release}-*.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", f"vllm-omni=={release}", "--no-deps", "--only-binary=:all:",
               "-d", str(CACHE), "-q"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"cannot download the vllm-omni {release} wheel (offline?): {exc}")
        wheels = sorted(CACHE.glob(f"vllm_omni-{release}-*.whl"))
        if done.returncode != 0 or not wheels:
            pytest.skip(f"cannot download the vllm-omni {release} wheel (offline?): {done.stderr.strip()[-300:]}")
    with zipfile.ZipFile(wheels[0]) as zf:
        zf.extractall(target)
    return target


def source(version: str, path: str) -> str | None:
    """A file of the wheel (path relative to the package root), or None if absent."""
    file = wheel_root(version) / path
    return file.read_text() if file.is_file() else None


def _stub(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    module.__path__ = []  # a package, so that submodules can be stubbed under it
    sys.modules[name] = module
    return module


def load_stage_config(version: str):
    """vLLM-Omni's own vllm_omni/config/stage_config.py of `version`, executed with stubs
    for the modules it imports but does not need to parse a deploy file (vLLM, torch-side
    schedulers, transformers, the API server's endpoint policy). Returns the module; call
load_deploy_config."""
    root = wheel_root(version)
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] in ("vllm", "vllm_omni", "transformers")}
    for k in saved:
        del sys.modules[k]
    try:
        _stub("vllm")
        _stub("vllm.logger", init_logger=logging.getLogger)
        for name in ("vllm.v1", "vllm.v1.core", "vllm.v1.core.sched"):
            _stub(name)
        _stub("vllm.v1.core.sched.scheduler", Scheduler=type("Scheduler", (), {}))
        _stub("transformers", PretrainedConfig=type("PretrainedConfig", (), {}))
        _stub("vllm_omni.config.endpoint_policy", EndpointRestriction=type("EndpointRestriction", (), {}))
        _stub("vllm_omni").__path__ = [str(root / "vllm_omni")]
        _stub("vllm_omni.config").__path__ = [str(root / "vllm_omni" / "config")]
        # only imported by name: endpoint restrictions are an API-server concern
        _stub("vllm_omni.core")
        _stub("vllm_omni.core.sched")
        _stub("vllm_omni.core.sched.omni_ar_scheduler", OmniARAsyncScheduler=type("A", (), {}),
              OmniARScheduler=type("S", (), {}))
        _stub("vllm_omni.core.sched.omni_generation_scheduler", OmniGenerationScheduler=type("G", (), {}))
        module = None
        for name in ("yaml_util", "stage_config"):
            path = root / "vllm_omni" / "config" / f"{name}.py"
            if not path.is_file():
                continue
            spec = importlib.util.spec_from_file_location(f"vllm_omni.config.{name}", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        return module
    finally:  # the module keeps its own references; sys.modules goes back as it was
        for k in [k for k in sys.modules if k.split(".")[0] in ("vllm", "vllm_omni", "transformers")]:
            del sys.modules[k]
        sys.modules.update(saved)


def check_bundled(name: str, gpus, model: str, version: str = "0.30"):
    """`check` of the deploy file `name` a vLLM-Omni release bundles, for the catalog `model` on
    `gpus` (an inventory like "1xH100-80GB", or a list of Gpu)."""
    from omni_autoconf.inputs.catalog import lookup_model
    from omni_autoconf.planning.check import check_config
    from omni_autoconf.inputs.configfile import read_config
    from omni_autoconf.inputs.gpus import parse_gpus
    from omni_autoconf.vllm.facts import omni_version

    inventory = parse_gpus(gpus) if isinstance(gpus, str) else gpus
    path = wheel_root(version) / "vllm_omni" / "deploy" / name
    return check_config(lookup_model(model), inventory, omni_version(version), read_config(str(path)))

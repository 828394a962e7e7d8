"""The NVML adapter, against a fake NVML (no GPU here) and against the real bindings."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from omni_autoconf.cli.main import main
from omni_autoconf.errors import NvmlUnavailable
from omni_autoconf.inputs.gpus import lookup_gpu
from omni_autoconf.inputs.nvml import NVML_TO_CUDA_RESERVE_BYTES, read_local_gpus


class FakeNvml:
    """Just the NVML calls the adapter makes."""

    def __init__(self, devices, fail_init=False):
        self.devices, self.fail_init, self.shut = devices, fail_init, False

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self.devices[h][0].encode()  # older bindings return bytes

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=self.devices[h][1])


MIB = 1 << 20


def test_known_gpus_use_the_catalog_cuda_total(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake = FakeNvml([("NVIDIA H100 80GB HBM3", 81559 * MIB), ("NVIDIA A100-SXM4-80GB", 81920 * MIB)])
    gpus = read_local_gpus(fake)
    assert [g.name for g in gpus] == ["H100-80GB", "A100-80GB"]
    assert gpus[0].total_bytes == lookup_gpu("H100-80GB").capacity_bytes
    assert fake.shut


def test_unknown_or_mismatched_parts_fall_back_to_nvml_less_reserve(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # an "H800" reporting 143771 MiB (data/gpus.yaml, H800 evidence) is not the 80 GB part the name suggests.
    gpus = read_local_gpus(FakeNvml([("NVIDIA H800", 143771 * MIB), ("NVIDIA Future GPU", 100 * 1024 * MIB)]))
    assert gpus[0].total_bytes == 143771 * MIB - NVML_TO_CUDA_RESERVE_BYTES
    assert gpus[1].name == "NVIDIA Future GPU"


def test_cuda_visible_devices_orders_and_filters(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    gpus = read_local_gpus(FakeNvml([("NVIDIA L4", 23034 * MIB), ("NVIDIA H200", 143771 * MIB)]))
    assert [(g.index, g.name) for g in gpus] == [(0, "H200")]


def test_no_driver_is_a_clean_error():
    with pytest.raises(NvmlUnavailable, match="name them instead"):
        read_local_gpus(FakeNvml([], fail_init=True))
    with pytest.raises(NvmlUnavailable, match="no GPU"):
        read_local_gpus(FakeNvml([]))


def test_cli_local_without_a_gpu_exits_2_in_one_line():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    except Exception:
        pass
    result = CliRunner().invoke(main, ["--gpus", "local", "--model", "qwen3-omni-moe"])
    assert result.exit_code == 2
    assert "NVML is unavailable" in result.stderr and "Traceback" not in result.stderr

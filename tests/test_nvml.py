"""NVML discovery: real GPU hosts are described faithfully, and any host without NVML registers as CPU-only."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from suanli.telemetry.nvml import GpuInfo, HostInfo, catalog_model, discover


class FakeNVMLError(Exception):
    pass


class FakeNotSupported(FakeNVMLError):
    pass


class FakeNvml:
    """In-memory stand-in for `pynvml`: each GPU is a dict; a `mig` of None means MIG is not supported."""

    NVMLError = FakeNVMLError
    NVMLError_NotSupported = FakeNotSupported

    def __init__(self, gpus: list[dict[str, Any]], init_error: str | None = None, as_bytes: bool = False) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.as_bytes = as_bytes
        self.calls: list[str] = []

    def _s(self, value: str) -> str | bytes:
        return value.encode() if self.as_bytes else value

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error:
            raise FakeNVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle: dict[str, Any]) -> str | bytes:
        return self._s(handle["name"])

    def nvmlDeviceGetUUID(self, handle: dict[str, Any]) -> str | bytes:
        return self._s(handle["uuid"])

    def nvmlDeviceGetMemoryInfo(self, handle: dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(total=handle["mib"] * 2**20, free=0, used=0)

    def nvmlDeviceGetMigMode(self, handle: dict[str, Any]) -> list[int]:
        if handle["mig"] is None:
            raise FakeNotSupported("Not Supported")
        return [int(handle["mig"]), int(handle["mig"])]

    def nvmlDeviceGetPciInfo(self, handle: dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(busId=self._s(handle["bus"]))

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        return self._s("550.54.15")

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040


class LostGpuNvml(FakeNvml):
    """A GPU that has fallen off the bus: the second device's UUID lookup fails."""

    def nvmlDeviceGetUUID(self, handle: dict[str, Any]) -> str | bytes:
        if handle["uuid"] == "GPU-0001":
            raise FakeNVMLError("GPU is lost")
        return super().nvmlDeviceGetUUID(handle)


def h100(i: int, mig: bool | None = False) -> dict[str, Any]:
    return {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": f"GPU-{i:04d}",
        "mib": 81559,
        "mig": mig,
        "bus": f"00000000:{i:02X}:00.0",
    }


def test_two_gpus_one_with_mig() -> None:
    fake = FakeNvml([h100(0, mig=False), h100(1, mig=True)])
    host = discover(fake)
    assert not host.cpu_only and host.nvml_error is None
    assert host.gpus == (
        GpuInfo(0, "GPU-0000", "NVIDIA H100 80GB HBM3", 81559, False, "00000000:00:00.0"),
        GpuInfo(1, "GPU-0001", "NVIDIA H100 80GB HBM3", 81559, True, "00000000:01:00.0"),
    )
    assert host.driver_version == "550.54.15" and host.cuda_version == "12.4"
    assert host.summary() == "2 x NVIDIA H100 80GB HBM3, driver 550.54.15"
    assert host.cpu_count >= 1 and host.hostname


def test_bytes_from_older_bindings_are_decoded() -> None:
    host = discover(FakeNvml([h100(0)], as_bytes=True))
    gpu = host.gpus[0]
    assert (gpu.name, gpu.uuid, gpu.pci_bus_id) == ("NVIDIA H100 80GB HBM3", "GPU-0000", "00000000:00:00.0")
    assert host.driver_version == "550.54.15"


def test_mig_not_supported_means_no_mig() -> None:
    rtx = {"name": "NVIDIA GeForce RTX 4090", "uuid": "GPU-r", "mib": 24564, "mig": None, "bus": "00000000:41:00.0"}
    host = discover(FakeNvml([rtx]))
    assert host.gpus[0].mig_mode is False and host.nvml_error is None


def test_init_failure_is_cpu_only_with_reason() -> None:
    fake = FakeNvml([h100(0)], init_error="Driver Not Loaded")
    host = discover(fake)
    assert host.cpu_only and host.gpus == ()
    assert host.nvml_error is not None and "Driver Not Loaded" in host.nvml_error
    assert host.summary().startswith("CPU-only: NVML unavailable (") and "Driver Not Loaded" in host.summary()
    assert "shutdown" not in fake.calls  # never shut down what did not start


def test_zero_devices_is_cpu_only() -> None:
    fake = FakeNvml([])
    host = discover(fake)
    assert host.cpu_only and host.nvml_error is None and host.driver_version == "550.54.15"
    assert host.summary().startswith("CPU-only")
    assert fake.calls == ["init", "shutdown"]


def test_shutdown_after_success_and_after_a_failing_device() -> None:
    fake = FakeNvml([h100(0)])
    discover(fake)
    assert fake.calls == ["init", "shutdown"]

    broken = LostGpuNvml([h100(0), h100(1)])
    host = discover(broken)
    assert host.cpu_only and host.nvml_error is not None and "GPU is lost" in host.nvml_error
    assert broken.calls == ["init", "shutdown"]


@pytest.mark.parametrize(
    ("nvml_name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM-80G"),
        ("NVIDIA RTX 4090", "RTX-4090"),  # only matches once the "NVIDIA " prefix is stripped
        ("NVIDIA GeForce GTX 1080", None),
        ("", None),
    ],
)
def test_catalog_model(nvml_name: str, model: str | None) -> None:
    assert catalog_model(nvml_name) == model


def test_real_pynvml_on_this_host_never_raises() -> None:
    """Exercises the real `pynvml` path. Without an NVIDIA driver (CI, laptops) the host must come back CPU-only
    with the reason; on a GPU host the answer must be self-consistent."""
    host = discover()
    assert isinstance(host, HostInfo)
    assert host.cpu_count >= 1 and host.memory_mib > 0 and host.hostname
    if host.nvml_error is not None:
        assert host.cpu_only and host.nvml_error.strip()
        assert host.summary() == f"CPU-only: NVML unavailable ({host.nvml_error})"
    else:  # a real NVIDIA host
        assert host.driver_version
        assert all(g.name and g.uuid.startswith(("GPU-", "MIG-")) and g.memory_mib > 0 for g in host.gpus)


@pytest.mark.parametrize(
    ("files", "cpus", "memory_mib"),
    [
        ({"cpu.max": "max 100000", "memory.max": "max"}, None, None),  # cgroup v2, no limits
        ({"cpu.max": "150000 100000", "memory.max": str(3 << 30)}, 2, 3072),  # 1.5 CPUs round up
        ({"cpu.max": "50000 100000", "memory.max": str(1 << 20)}, 1, 1),  # half a CPU: one core, at least
        ({"cpu/cpu.cfs_quota_us": "400000", "cpu/cpu.cfs_period_us": "100000",
          "memory/memory.limit_in_bytes": str(1 << 30)}, 4, 1024),  # cgroup v1
        ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000",
          "memory/memory.limit_in_bytes": "9223372036854771712"}, None, None),  # v1 unlimited
    ],
)  # fmt: skip
def test_a_containers_cpu_quota_and_memory_limit_cap_what_the_host_reports(
    tmp_path: Path, files: dict[str, str], cpus: int | None, memory_mib: int | None
) -> None:
    """`os.cpu_count()` sees the machine; a container may use less. The node registers what it may use."""
    import os

    from suanli.telemetry.nvml import host_cpus, host_memory_mib

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text + "\n")
    usable = len(os.sched_getaffinity(0))
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    assert host_cpus(tmp_path) == (usable if cpus is None else min(usable, cpus))
    assert host_memory_mib(tmp_path) == (physical if memory_mib is None else min(physical, memory_mib))

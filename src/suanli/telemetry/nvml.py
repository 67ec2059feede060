"""Local GPU discovery through NVML, so the control plane can register "this host" as a node.

A host without NVIDIA GPUs (no libnvidia-ml, NVML init failing, zero devices) is a CPU-only node, never an
error: discovery reports the reason in `HostInfo.nvml_error` instead of raising.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from suanli import catalog

_MIG_ENABLE = 1  # pynvml.NVML_DEVICE_MIG_ENABLE


class NvmlLike(Protocol):
    """The slice of `pynvml` used here; the module itself satisfies it, tests pass an in-memory fake."""

    NVMLError: type[Exception]
    NVMLError_NotSupported: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...  # `.total` in bytes
    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]: ...  # [current, pending]
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...  # `.busId`
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str  # NVML product name, e.g. "NVIDIA H100 80GB HBM3"
    memory_mib: int
    mig_mode: bool
    pci_bus_id: str


@dataclass(frozen=True)
class HostInfo:
    hostname: str
    cpu_count: int
    memory_mib: int
    gpus: tuple[GpuInfo, ...]
    driver_version: str | None
    cuda_version: str | None
    nvml_error: str | None  # why NVML could not be used; None when it answered (even with zero GPUs)

    @property
    def cpu_only(self) -> bool:
        return not self.gpus

    def summary(self) -> str:
        """One line for logs and `node register` output; a CPU-only host says why."""
        if self.nvml_error is not None:
            return f"CPU-only: NVML unavailable ({self.nvml_error})"
        if self.cpu_only:
            return f"CPU-only: NVML found no GPUs (driver {self.driver_version or 'unknown'})"
        counts = Counter(g.name for g in self.gpus)
        gpus = ", ".join(f"{n} x {name}" for name, n in counts.items())
        return f"{gpus}, driver {self.driver_version or 'unknown'}"


def _text(value: str | bytes) -> str:
    """Older bindings return `bytes` for strings, newer ones `str`."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


CGROUP = Path("/sys/fs/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def host_cpus(cgroup: Path = CGROUP) -> int:
    """Cores this process may use: the CPUs it may run on, capped by its cgroup's CPU quota (a container's limit,
    which `os.cpu_count()` ignores); 0 when unknown."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 0)
    quota = None
    v2 = _read(cgroup / "cpu.max")  # "max 100000" or "200000 100000"
    if v2 is not None:
        parts = v2.split()
        if len(parts) == 2 and parts[0] != "max":
            quota = (int(parts[0]), int(parts[1]))
    else:
        q, p = _read(cgroup / "cpu" / "cpu.cfs_quota_us"), _read(cgroup / "cpu" / "cpu.cfs_period_us")
        if q is not None and p is not None and int(q) > 0:
            quota = (int(q), int(p))
    if quota is not None and quota[1] > 0:
        cpus = min(cpus, max(1, -(-quota[0] // quota[1])))
    return cpus


def host_memory_mib(cgroup: Path = CGROUP) -> int:
    """Memory this process may use: physical memory, capped by its cgroup's limit; 0 when unknown."""
    try:
        mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    except (ValueError, OSError, AttributeError):  # unknown name, or no sysconf at all (Windows)
        mib = 0
    limit = _read(cgroup / "memory.max") or _read(cgroup / "memory" / "memory.limit_in_bytes")
    if limit is not None and limit.isdigit():  # "max" (v2) or a huge number (v1) when unlimited
        capped = int(limit) // 2**20
        mib = min(mib, capped) if mib else capped
    return mib


def _cuda_version(nvml: Any) -> str | None:
    """CUDA version the driver supports, encoded by NVML as 1000*major + 10*minor."""
    get = getattr(nvml, "nvmlSystemGetCudaDriverVersion_v2", None) or nvml.nvmlSystemGetCudaDriverVersion
    try:
        v = int(get())
    except nvml.NVMLError:
        return None
    return f"{v // 1000}.{v % 1000 // 10}"


def _mig_enabled(nvml: NvmlLike, handle: Any) -> bool:
    unsupported = (
        nvml.NVMLError_NotSupported,
        getattr(nvml, "NVMLError_FunctionNotFound", nvml.NVMLError_NotSupported),
    )
    try:
        return nvml.nvmlDeviceGetMigMode(handle)[0] == _MIG_ENABLE
    except unsupported:  # pre-Ampere GPUs and old drivers have no MIG
        return False


def _gpu(nvml: NvmlLike, index: int) -> GpuInfo:
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    return GpuInfo(
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(h)),
        name=_text(nvml.nvmlDeviceGetName(h)),
        memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(h).total) // 2**20,
        mig_mode=_mig_enabled(nvml, h),
        pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(h).busId),
    )


def discover(nvml: NvmlLike | None = None) -> HostInfo:
    """Describe this host. Uses `pynvml` unless given a stand-in; never raises for a missing or broken NVML."""
    host = HostInfo(
        hostname=socket.gethostname(),
        cpu_count=host_cpus(),
        memory_mib=host_memory_mib(),
        gpus=(),
        driver_version=None,
        cuda_version=None,
        nvml_error=None,
    )
    if nvml is None:
        try:
            import pynvml as nvml_module
        except ImportError as e:
            return replace(host, nvml_error=f"pynvml not installed: {e}")
        nvml = nvml_module  # type: ignore[assignment]
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        return replace(host, nvml_error=f"init failed: {e}")
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        gpus = tuple(_gpu(nvml, i) for i in range(nvml.nvmlDeviceGetCount()))
        cuda = _cuda_version(nvml)
    except nvml.NVMLError as e:
        # A half-enumerated host is not advertised: better CPU-only and saying why than a wrong GPU count.
        return replace(host, nvml_error=f"device enumeration failed: {e}")
    finally:
        with contextlib.suppress(nvml.NVMLError):  # a failed shutdown must not lose a good answer
            nvml.nvmlShutdown()
    return replace(host, gpus=gpus, driver_version=driver, cuda_version=cuda)


def catalog_model(name: str) -> str | None:
    """Our catalog's GPU model for an NVML product name (full name, then without "NVIDIA "), or None if unknown."""
    candidates = [name]
    if name.startswith("NVIDIA "):
        candidates.append(name.removeprefix("NVIDIA "))
    for candidate in candidates:
        try:
            return catalog.gpu(candidate).name
        except catalog.CatalogError:
            continue
    return None

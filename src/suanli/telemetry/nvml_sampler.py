"""GPU metrics of this host through NVML, as `GpuSample`s for the node agent to send.

A host where NVML cannot be used (no `pynvml`, no driver, init failing) is not an error: the reason is logged once
on "suanli.telemetry" and `sample` returns [] from then on, cheaply, so the node keeps serving CPU work. A reading a
GPU does not support (power on some boards, ECC on GeForce, utilisation under MIG) is left at 0; a GPU that fails
as a whole (fallen off the bus, needing a reset) gives a sample with `error` set, which the health rules act on.

Utilisation is the mean over the whole interval since the previous reading, from NVML's own buffer of utilisation
samples (`nvmlDeviceGetSamples`, one sample every 1/6 to 1 s), not `nvmlDeviceGetUtilizationRates`, which covers
only the driver's last sample period: a tenant idling exactly when its GPUs are read would otherwise read as idle.
The mean is a plain one: a device's samples are evenly spaced, so it equals the time-weighted mean, and it needs no
guess at how long the first sample after the previous reading spans. The newest timestamp seen is kept per GPU and
passed back, and only samples stamped after it are counted, so none counts in two readings. Where the buffer has no
new sample (NVML_ERROR_NOT_FOUND) or cannot be read (not supported, no permission, older bindings), the reading
falls back to `nvmlDeviceGetUtilizationRates`; `util_source` says per GPU which was used.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

from suanli.telemetry.health import NVIDIA_RESET_XIDS
from suanli.telemetry.samples import GpuSample

log = logging.getLogger("suanli.telemetry")

# pynvml constants, copied so that an in-memory stand-in needs none of them (nvidia-ml-py 12.535 .. 13.x)
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_EVENT_TYPE_XID = 0x8  # nvmlEventTypeXidCriticalError
NVML_GPU_UTILIZATION_SAMPLES = 1  # nvmlSamplingType_t
# c_nvmlValue_t's member for each nvmlValueType_t (NVML_VALUE_TYPE_DOUBLE = 0 .. NVML_VALUE_TYPE_UNSIGNED_SHORT = 6)
_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
_MAX_EVENTS_PER_SAMPLE = 64  # drained per GPU per sample; more than this in one interval waits for the next


class NvmlMetricsLike(Protocol):
    """The slice of `pynvml` the sampler uses; the module itself satisfies it, tests pass an in-memory fake.

    Optional on the object (looked up with getattr, older bindings lack some): the error classes
    NVMLError_FunctionNotFound, NVMLError_NoPermission, NVMLError_Timeout, NVMLError_NotFound,
    nvmlDeviceGetCurrentClocksThrottleReasons (the pre-12.535 name of the clocks-event reasons) and
    nvmlDeviceGetSamples(handle, sampling_type, last_seen_us) -> (value type, [`.timeStamp` µs, `.sampleValue`])."""

    NVMLError: type[Exception]
    NVMLError_NotSupported: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...  # `.gpu` in %
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...  # `.used`, `.total` in bytes
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...  # °C
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...  # mW
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...  # mW
    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int: ...  # MHz
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int: ...  # bitmask
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None: ...
    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any: ...  # `.eventType`, `.eventData`
    def nvmlEventSetFree(self, event_set: Any) -> None: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any: ...


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _message(e: Exception) -> str:
    return str(e) or type(e).__name__


def mean_after(value_type: int, samples: list[Any], after: int) -> tuple[float, int] | None:
    """The plain mean of the samples stamped after `after` (µs) and the newest stamp; None when there is none.
    Samples at or before `after` are dropped even if the driver returns them: they were counted last time."""
    field = _VALUE_FIELDS[value_type] if 0 <= value_type < len(_VALUE_FIELDS) else "uiVal"
    values, newest = [], after
    for s in samples:
        ts = int(s.timeStamp)
        if ts > after:
            values.append(float(getattr(s.sampleValue, field)))
            newest = max(newest, ts)
    return (sum(values) / len(values), newest) if values else None


class NvmlSampler:
    """Reads every GPU of this node. NVML is initialised on the first `sample` and kept until `close`.
    Not thread-safe: one sampler per agent loop."""

    def __init__(self, node: str, nvml: NvmlMetricsLike | None = None) -> None:
        self.node = node
        self._given = nvml
        self._nvml: Any = None
        self._disabled: str | None = None  # why NVML is unusable here; set once, never retried
        self._handles: list[Any] = []
        self._uuids: list[str] = []
        self._events: list[Any] = []  # per GPU: its XID event set, or None where unsupported
        self._unsupported: tuple[type[Exception], ...] = ()
        self._last_seen: list[int] = []  # per GPU: newest utilisation sample counted (µs); 0: none yet
        self._buffered: list[bool] = []  # per GPU: False once its sample buffer proved unreadable
        self.mig_instances: dict[int, int] = {}  # GPU index -> MIG devices present at the last sample
        # GPU index -> where the last reading's utilisation came from: "average" (NVML's samples since the previous
        # reading), "instant" (nvmlDeviceGetUtilizationRates), "none" (neither answered: 0)
        self.util_source: dict[int, str] = {}

    @property
    def disabled_reason(self) -> str | None:
        """Why this host gives no samples ("pynvml not installed: …", "init failed: …"); None while it can."""
        return self._disabled

    def _disable(self, reason: str) -> None:
        self._disabled = reason
        log.warning("NVML unavailable on node %s, GPU metrics disabled: %s", self.node, reason)

    def _start(self) -> bool:
        nvml: Any = self._given
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError as e:
                self._disable(f"pynvml not installed: {e}")
                return False
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            self._disable(f"init failed: {_message(e)}")
            return False
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as e:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()
            self._disable(f"device count failed: {_message(e)}")
            return False
        self._nvml = nvml
        not_supported = nvml.NVMLError_NotSupported
        self._unsupported = tuple(
            getattr(nvml, name, not_supported)
            for name in ("NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_NoPermission")
        )
        self._handles = [None] * count
        self._uuids = [""] * count
        self._events = [None] * count
        self._last_seen = [0] * count
        self._buffered = [True] * count
        for i in range(count):
            with contextlib.suppress(nvml.NVMLError):  # a GPU lost already: retried, and reported, per sample
                self._device(i)
        return True

    def _device(self, i: int) -> Any:
        """The handle of GPU `i`, looked up (with its UUID and XID event set) the first time it answers."""
        nvml = self._nvml
        if self._handles[i] is None:
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            self._uuids[i] = _text(nvml.nvmlDeviceGetUUID(handle))
            self._handles[i] = handle
            self._events[i] = self._xid_events(handle, i)
        return self._handles[i]

    def _xid_events(self, handle: Any, i: int) -> Any:
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as e:
            log.info("node %s GPU %d: no XID events (%s)", self.node, i, _message(e))
            return None
        try:
            nvml.nvmlDeviceRegisterEvents(handle, NVML_EVENT_TYPE_XID, event_set)
        except nvml.NVMLError as e:  # NotSupported on some boards and inside some containers
            log.info("node %s GPU %d: no XID events (%s)", self.node, i, _message(e))
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(event_set)
            return None
        return event_set

    def sample(self, t: float) -> list[GpuSample]:
        """One sample per GPU, read now and stamped `t` (epoch seconds); [] where NVML cannot be used."""
        if self._disabled is not None:
            return []
        if self._nvml is None and not self._start():
            return []
        return [self._sample(i, t) for i in range(len(self._handles))]

    def _field(self, read: Callable[..., Any], *args: Any) -> Any:
        """A reading, or None when this GPU does not support it (any other NVML error fails the whole GPU)."""
        try:
            return read(*args)
        except self._unsupported:
            return None

    def _sample(self, i: int, t: float) -> GpuSample:
        nvml, f = self._nvml, self._field
        xid = 0
        try:
            h = self._device(i)
            xid = self._xid(i)  # first: a GPU failing below still reports the XID that came with it
            util = self._util(i, h)
            mem = f(nvml.nvmlDeviceGetMemoryInfo, h)
            sbe = f(nvml.nvmlDeviceGetTotalEccErrors, h, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC)
            dbe = f(nvml.nvmlDeviceGetTotalEccErrors, h, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC)
            sample = GpuSample(
                node=self.node,
                gpu=i,
                uuid=self._uuids[i],
                t=t,
                util=util,
                mem_used_mib=int(mem.used) // 2**20 if mem is not None else 0,
                mem_total_mib=int(mem.total) // 2**20 if mem is not None else 0,
                temp_c=float(f(nvml.nvmlDeviceGetTemperature, h, NVML_TEMPERATURE_GPU) or 0),
                power_w=(f(nvml.nvmlDeviceGetPowerUsage, h) or 0) / 1000,
                power_limit_w=(f(nvml.nvmlDeviceGetEnforcedPowerLimit, h) or 0) / 1000,
                sm_clock_mhz=int(f(nvml.nvmlDeviceGetClockInfo, h, NVML_CLOCK_SM) or 0),
                throttle=self._throttle(h),
                ecc_sbe=int(sbe or 0),
                ecc_dbe=int(dbe or 0),
                xid=xid,
            )
        except nvml.NVMLError as e:  # GPU lost, reset required, unknown: the GPU as a whole is unreadable
            return GpuSample(node=self.node, gpu=i, uuid=self._uuids[i], t=t, xid=xid, error=_message(e))
        self.mig_instances[i] = self._mig_count(h)
        return sample

    def _util(self, i: int, h: Any) -> float:
        """GPU `i`'s utilisation in %: the mean of its samples since the previous reading, else the instant one."""
        mean = self._util_average(i, h)
        if mean is not None:
            self.util_source[i] = "average"
            return mean
        util = self._field(self._nvml.nvmlDeviceGetUtilizationRates, h)
        self.util_source[i] = "none" if util is None else "instant"
        return 0.0 if util is None else float(util.gpu)

    def _util_average(self, i: int, h: Any) -> float | None:
        nvml = self._nvml
        read = getattr(nvml, "nvmlDeviceGetSamples", None)
        if read is None or not self._buffered[i]:
            return None
        try:
            value_type, samples = read(h, NVML_GPU_UTILIZATION_SAMPLES, self._last_seen[i])
        except self._unsupported as e:  # for good on this GPU (MIG, a container without permission): not retried
            self._buffered[i] = False
            log.info("node %s GPU %d: no NVML utilisation samples, instant readings (%s)", self.node, i, _message(e))
            return None
        except nvml.NVMLError as e:  # NotFound: no sample since the last read; else the instant read decides
            not_found = getattr(nvml, "NVMLError_NotFound", None)
            if not_found is None or not isinstance(e, not_found):
                log.debug("node %s GPU %d: utilisation samples failed: %s", self.node, i, _message(e))
            return None
        got = mean_after(int(value_type), list(samples), self._last_seen[i])
        if got is None:
            return None
        mean, self._last_seen[i] = got
        return mean

    def _throttle(self, h: Any) -> int:
        """Clocks-event reasons (renamed from "throttle reasons" in NVML 12.2; older bindings only have those)."""
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            read = getattr(self._nvml, name, None)
            if read is not None and (value := self._field(read, h)) is not None:
                return int(value)
        return 0

    def _xid(self, i: int) -> int:
        """The XID reported since the last sample, draining the GPU's event set without waiting; of several, a
        reset-class one wins over an application one (one field, so the one that drains a node is kept)."""
        nvml, event_set = self._nvml, self._events[i]
        if event_set is None:
            return 0
        timeout = getattr(nvml, "NVMLError_Timeout", None)
        seen = 0
        for _ in range(_MAX_EVENTS_PER_SAMPLE):
            try:
                data = nvml.nvmlEventSetWait(event_set, 0)
            except nvml.NVMLError as e:
                if timeout is None or not isinstance(e, timeout):  # Timeout: nothing pending, the usual case
                    log.debug("node %s GPU %d: XID event wait failed: %s", self.node, i, _message(e))
                break
            if int(data.eventType) & NVML_EVENT_TYPE_XID:
                xid = int(data.eventData)
                if xid in NVIDIA_RESET_XIDS or seen not in NVIDIA_RESET_XIDS:
                    seen = xid
        return seen

    def _mig_count(self, h: Any) -> int:
        """MIG devices present on a GPU (0 without MIG); kept beside the samples, as `GpuSample` has no field."""
        nvml = self._nvml
        try:
            slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(h))
        except nvml.NVMLError:
            return 0
        count = 0
        for k in range(slots):
            try:
                nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
            except nvml.NVMLError:  # NotFound: an empty slot
                continue
            count += 1
        return count

    def close(self) -> None:
        """Free the event sets and shut NVML down; a later `sample` starts again. Safe to call more than once."""
        nvml = self._nvml
        if nvml is None:
            return
        for event_set in self._events:
            if event_set is not None:
                with contextlib.suppress(nvml.NVMLError):
                    nvml.nvmlEventSetFree(event_set)
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
        self._nvml, self._handles, self._uuids, self._events = None, [], [], []
        self._last_seen, self._buffered = [], []
        self.mig_instances, self.util_source = {}, {}

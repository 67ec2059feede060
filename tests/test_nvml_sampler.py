"""NVML metrics sampler over an in-memory NVML: units, unsupported readings, lost GPUs, XID events, no NVML at all.
The fake's utilisation sample buffer is exercised in tests/test_nvml_util_average.py."""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from suanli.telemetry.nvml_sampler import NVML_EVENT_TYPE_XID, NvmlSampler
from suanli.telemetry.samples import GpuSample

LOGGER = "suanli.telemetry"


class FakeNVMLError(Exception):
    pass


class FakeNotSupported(FakeNVMLError):
    pass


class FakeGpuIsLost(FakeNVMLError):
    pass


class FakeTimeout(FakeNVMLError):
    pass


class FakeNotFound(FakeNVMLError):
    pass


def gpu(i: int, **over: Any) -> dict[str, Any]:
    """One GPU's readings in NVML's units; `unsupported` names readings that raise NotSupported, `lost` fails all."""
    g = {
        "uuid": f"GPU-{i:04d}",
        "util": 87,
        "used": 60_000 * 2**20 + 12345,  # bytes
        "total": 81_559 * 2**20,
        "temp": 71,
        "power_mw": 654_321,
        "limit_mw": 700_000,
        "sm_mhz": 1980,
        "reasons": 0x4,
        "sbe": 2,
        "dbe": 0,
        "mig": 0,  # MIG devices present (of 7 slots)
        "unsupported": set(),
        "lost": False,
        "events": [],  # pending (event type, data)
        "buffer": [],  # NVML's utilisation sample buffer: (timestamp µs, %), oldest first
        "value_type": 1,  # NVML_VALUE_TYPE_UNSIGNED_INT, as drivers report utilisation samples
    }
    g.update(over)
    return g


class FakeNvml:
    """In-memory stand-in for `pynvml`'s metrics calls; handles are the GPU dicts themselves.

    `inclusive`: the sample buffer also returns the sample stamped exactly `lastSeenTimeStamp` (a driver that
    does would count it twice unless the sampler filters it)."""

    NVMLError = FakeNVMLError
    NVMLError_NotSupported = FakeNotSupported
    NVMLError_GpuIsLost = FakeGpuIsLost
    NVMLError_Timeout = FakeTimeout
    NVMLError_NotFound = FakeNotFound

    def __init__(
        self, gpus: list[dict[str, Any]], init_error: str | None = None, events: bool = True, inclusive: bool = False
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.events = events
        self.inclusive = inclusive
        self.calls: list[str] = []
        self.seen: list[int] = []  # lastSeenTimeStamp of every nvmlDeviceGetSamples call

    def _read(self, handle: dict[str, Any], name: str) -> Any:
        if handle["lost"]:
            raise FakeGpuIsLost("GPU is lost")
        if name in handle["unsupported"]:
            raise FakeNotSupported("Not Supported")
        return handle[name]

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

    def nvmlDeviceGetUUID(self, handle: dict[str, Any]) -> bytes:
        return handle["uuid"].encode()  # older bindings: bytes

    def nvmlDeviceGetUtilizationRates(self, handle: dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(gpu=self._read(handle, "util"), memory=0)

    def nvmlDeviceGetSamples(
        self, handle: dict[str, Any], sampling_type: int, last_seen: int
    ) -> tuple[int, list[SimpleNamespace]]:
        assert sampling_type == 1  # NVML_GPU_UTILIZATION_SAMPLES
        self.seen.append(last_seen)
        if handle["lost"]:
            raise FakeGpuIsLost("GPU is lost")
        if "samples" in handle["unsupported"]:
            raise FakeNotSupported("Not Supported")
        new = [(ts, v) for ts, v in handle["buffer"] if ts > last_seen or (self.inclusive and ts == last_seen)]
        if not new:
            raise FakeNotFound("Not Found")  # what NVML answers when no sample is newer than lastSeenTimeStamp
        field = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")[handle["value_type"]]
        return handle["value_type"], [SimpleNamespace(timeStamp=ts, sampleValue=SimpleNamespace(**{field: v}))
                                      for ts, v in new]  # fmt: skip

    def nvmlDeviceGetMemoryInfo(self, handle: dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(used=self._read(handle, "used"), total=handle["total"], free=0)

    def nvmlDeviceGetTemperature(self, handle: dict[str, Any], sensor: int) -> int:
        assert sensor == 0  # NVML_TEMPERATURE_GPU
        return self._read(handle, "temp")

    def nvmlDeviceGetPowerUsage(self, handle: dict[str, Any]) -> int:
        return self._read(handle, "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: dict[str, Any]) -> int:
        return self._read(handle, "limit_mw")

    def nvmlDeviceGetClockInfo(self, handle: dict[str, Any], clock_type: int) -> int:
        assert clock_type == 1  # NVML_CLOCK_SM
        return self._read(handle, "sm_mhz")

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: dict[str, Any]) -> int:
        return self._read(handle, "reasons")

    def nvmlDeviceGetTotalEccErrors(self, handle: dict[str, Any], error_type: int, counter_type: int) -> int:
        assert counter_type == 0  # NVML_VOLATILE_ECC
        return self._read(handle, ("sbe", "dbe")[error_type])

    def nvmlEventSetCreate(self) -> dict[str, Any]:
        return {"handles": []}

    def nvmlDeviceRegisterEvents(self, handle: dict[str, Any], event_types: int, event_set: dict[str, Any]) -> None:
        assert event_types == NVML_EVENT_TYPE_XID == 8
        if not self.events:
            raise FakeNotSupported("Not Supported")
        event_set["handles"].append(handle)

    def nvmlEventSetWait(self, event_set: dict[str, Any], timeout_ms: int) -> SimpleNamespace:
        assert timeout_ms == 0  # the sampler never blocks
        for handle in event_set["handles"]:
            if handle["events"]:
                kind, data = handle["events"].pop(0)
                return SimpleNamespace(device=handle, eventType=kind, eventData=data)
        raise FakeTimeout("Timeout")

    def nvmlEventSetFree(self, event_set: dict[str, Any]) -> None:
        self.calls.append("free")

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: dict[str, Any]) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: dict[str, Any], index: int) -> object:
        if index >= handle["mig"]:
            raise FakeNotFound("Not Found")
        return object()


def test_readings_in_our_units() -> None:
    fake = FakeNvml([gpu(0), gpu(1, util=0, temp=34, reasons=0x1, mig=3)])
    sampler = NvmlSampler("n1", fake)
    first, second = sampler.sample(1234.5)
    assert first == GpuSample(
        node="n1", gpu=0, uuid="GPU-0000", t=1234.5, util=87.0, mem_used_mib=60_000, mem_total_mib=81_559,
        temp_c=71.0, power_w=654.321, power_limit_w=700.0, sm_clock_mhz=1980, throttle=0x4, ecc_sbe=2, ecc_dbe=0,
    )  # fmt: skip
    assert (second.gpu, second.uuid, second.util, second.temp_c, second.throttle) == (1, "GPU-0001", 0, 34, 0x1)
    assert sampler.mig_instances == {0: 0, 1: 3}
    assert fake.calls == ["init"]  # initialised lazily, once
    sampler.sample(1235.5)
    assert fake.calls == ["init"]
    sampler.close()
    assert fake.calls == ["init", "free", "free", "shutdown"]
    sampler.close()  # twice is harmless
    assert fake.calls == ["init", "free", "free", "shutdown"]


@pytest.mark.parametrize(
    ("unsupported", "zeroed"),
    [
        ({"util"}, {"util": 0.0}),  # MIG mode
        ({"power_mw", "limit_mw"}, {"power_w": 0.0, "power_limit_w": 0.0}),
        ({"sbe", "dbe"}, {"ecc_sbe": 0, "ecc_dbe": 0}),  # GeForce: no ECC
        ({"used"}, {"mem_used_mib": 0, "mem_total_mib": 0}),
        ({"reasons", "temp", "sm_mhz"}, {"throttle": 0, "temp_c": 0.0, "sm_clock_mhz": 0}),
    ],
)
def test_unsupported_readings_are_zero_not_errors(unsupported: set[str], zeroed: dict[str, float]) -> None:
    (x,) = NvmlSampler("n1", FakeNvml([gpu(0, unsupported=unsupported)])).sample(1.0)
    assert x.error == "" and x.uuid == "GPU-0000"
    assert {k: getattr(x, k) for k in zeroed} == zeroed
    assert x.sm_clock_mhz == (0 if "sm_mhz" in unsupported else 1980)


def test_old_bindings_fall_back_to_throttle_reasons() -> None:
    class OldNvml(FakeNvml):
        nvmlDeviceGetCurrentClocksEventReasons = None  # type: ignore[assignment]

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: dict[str, Any]) -> int:
            return 0x48

    (x,) = NvmlSampler("n1", OldNvml([gpu(0)])).sample(1.0)
    assert x.throttle == 0x48


def test_lost_gpu_gives_an_error_sample_and_the_others_still_read() -> None:
    bad = gpu(1)
    fake = FakeNvml([gpu(0), bad])
    sampler = NvmlSampler("n1", fake)
    assert [x.error for x in sampler.sample(1.0)] == ["", ""]
    bad["lost"] = True
    bad["events"].append((NVML_EVENT_TYPE_XID, 79))
    good, lost = sampler.sample(2.0)
    assert good.error == "" and good.util == 87
    assert lost == GpuSample(node="n1", gpu=1, uuid="GPU-0001", t=2.0, xid=79, error="GPU is lost")
    bad["lost"] = False  # reset: it reads again
    assert sampler.sample(3.0)[1].error == ""


def test_xid_events_are_drained_and_a_reset_class_one_wins() -> None:
    g = gpu(0)
    sampler = NvmlSampler("n1", FakeNvml([g]))
    assert sampler.sample(1.0)[0].xid == 0
    g["events"] += [(NVML_EVENT_TYPE_XID, 13), (NVML_EVENT_TYPE_XID, 48), (NVML_EVENT_TYPE_XID, 31), (0x1, 5)]
    assert sampler.sample(2.0)[0].xid == 48
    assert sampler.sample(3.0)[0].xid == 0 and g["events"] == []
    g["events"] += [(NVML_EVENT_TYPE_XID, 13), (NVML_EVENT_TYPE_XID, 43)]
    assert sampler.sample(4.0)[0].xid == 43


def test_no_xid_events_where_unsupported() -> None:
    g = gpu(0, events=[(NVML_EVENT_TYPE_XID, 79)])
    (x,) = NvmlSampler("n1", FakeNvml([g], events=False)).sample(1.0)
    assert x.xid == 0 and x.error == ""


def test_init_failure_is_logged_once_and_then_nothing(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml([gpu(0)], init_error="Driver Not Loaded")
    sampler = NvmlSampler("n1", fake)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert [sampler.sample(float(t)) for t in range(5)] == [[]] * 5
    assert len(caplog.records) == 1 and "Driver Not Loaded" in caplog.records[0].getMessage()
    assert "n1" in caplog.records[0].getMessage()
    assert fake.calls == ["init"]  # never retried, never shut down
    assert sampler.disabled_reason == "init failed: Driver Not Loaded"
    sampler.close()
    assert fake.calls == ["init"]


def test_missing_library_is_logged_once(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now raises ImportError
    sampler = NvmlSampler("n1")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert sampler.sample(1.0) == [] and sampler.sample(2.0) == []
    assert len(caplog.records) == 1 and "pynvml not installed" in caplog.records[0].getMessage()
    assert sampler.disabled_reason is not None and sampler.disabled_reason.startswith("pynvml not installed")


def test_zero_gpus_is_an_empty_sample_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        sampler = NvmlSampler("n1", FakeNvml([]))
        assert sampler.sample(1.0) == [] and sampler.disabled_reason is None
    assert caplog.records == []


def test_real_pynvml_on_this_host_never_raises() -> None:
    """Without an NVIDIA driver (CI) the sampler disables itself; on a GPU host every GPU gives a sample."""
    sampler = NvmlSampler("here")
    try:
        samples = sampler.sample(1.0)
        if sampler.disabled_reason is not None:
            assert samples == []
        else:
            assert [x.gpu for x in samples] == list(range(len(samples)))
            assert all(x.error or (x.uuid and x.mem_total_mib > 0) for x in samples)
            assert all(x.error or sampler.util_source[x.gpu] in ("average", "instant", "none") for x in samples)
    finally:
        sampler.close()

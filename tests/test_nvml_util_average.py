"""Utilisation averaged over NVML's sample buffer since the previous reading, on the in-memory NVML: a GPU busy
between reads is not read as idle, no sample counts twice, and the instant reading stands in where the buffer cannot."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from suanli.telemetry.nvml_sampler import NvmlSampler
from tests.test_nvml_sampler import LOGGER, FakeNvml, gpu

PERIOD_US = 166_667  # NVML's shortest utilisation sample period, 1/6 s


def run(g: dict[str, Any], seconds: float, util: int) -> int:
    """Append `seconds` of evenly spaced utilisation samples at `util` % to a GPU's buffer; the last timestamp."""
    ts = g["buffer"][-1][0] if g["buffer"] else 1_700_000_000_000_000  # NVML stamps samples in epoch µs
    for _ in range(round(seconds * 1_000_000 / PERIOD_US)):
        ts += PERIOD_US
        g["buffer"].append((ts, util))
    return ts


def test_util_is_the_mean_over_the_interval_not_the_instant_at_the_read() -> None:
    """Busy 100% for 4 s of a 5 s interval and idle when read: NVML's instant reading says 0, the reading 80."""
    g = gpu(0, util=0)
    run(g, 3, 100)
    sampler = NvmlSampler("n1", FakeNvml([g]))
    assert sampler.sample(1.0)[0].util == 100.0  # the first read averages what the buffer holds
    run(g, 4, 100)
    run(g, 1, 0)  # idle at read time: nvmlDeviceGetUtilizationRates reads 0
    (x,) = sampler.sample(6.0)
    assert x.util == pytest.approx(80.0) and x.error == ""
    assert sampler.util_source == {0: "average"}


def test_no_new_sample_falls_back_to_the_instant_reading() -> None:
    g = gpu(0, util=42)
    fake = FakeNvml([g])
    sampler = NvmlSampler("n1", fake)
    assert sampler.sample(1.0)[0].util == 42.0  # empty buffer: NotFound
    assert sampler.util_source == {0: "instant"}
    newest = run(g, 5, 10)
    assert sampler.sample(6.0)[0].util == 10.0 and sampler.util_source == {0: "average"}
    assert sampler.sample(11.0)[0].util == 42.0  # nothing since: the instant reading, not the old mean again
    assert sampler.util_source == {0: "instant"}
    assert fake.seen == [0, 0, newest]


@pytest.mark.parametrize("inclusive", [False, True])
def test_each_sample_counts_in_one_reading_only(inclusive: bool) -> None:
    g = gpu(0, util=0)
    fake = FakeNvml([g], inclusive=inclusive)
    sampler = NvmlSampler("n1", fake)
    first = run(g, 5, 50)
    assert sampler.sample(5.0)[0].util == 50.0
    second = run(g, 5, 100)
    assert sampler.sample(10.0)[0].util == 100.0  # not 75: the first interval's samples are not read again
    run(g, 2, 0)
    run(g, 3, 30)
    assert sampler.sample(15.0)[0].util == pytest.approx(18.0)  # (12 x 0 + 18 x 30) / 30
    assert fake.seen == [0, first, second]
    if inclusive:  # the boundary sample came back each time and was dropped: nothing new means the fallback
        assert sampler.sample(20.0)[0].util == 0.0 and sampler.util_source == {0: "instant"}
    sampler.close()  # a restarted sampler has seen nothing
    assert sampler.sample(25.0)[0].util == pytest.approx((30 * 50 + 30 * 100 + 12 * 0 + 18 * 30) / 90)
    assert fake.seen[-1] == 0


@pytest.mark.parametrize("value_type", [0, 1, 3])  # double, unsigned int, unsigned long long
def test_sample_values_are_read_by_their_type(value_type: int) -> None:
    g = gpu(0, util=0, value_type=value_type)
    run(g, 1, 100)
    run(g, 1, 40)
    assert NvmlSampler("n1", FakeNvml([g])).sample(1.0)[0].util == pytest.approx(70.0)


def test_buffer_not_supported_falls_back_and_is_not_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    g = gpu(0, util=55, unsupported={"samples"})
    run(g, 5, 100)
    fake = FakeNvml([g])
    sampler = NvmlSampler("n1", fake)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert [sampler.sample(float(t))[0].util for t in range(3)] == [55.0] * 3
    assert sampler.util_source == {0: "instant"} and fake.seen == [0]
    assert len(caplog.records) == 1 and "utilisation samples" in caplog.records[0].getMessage()


def test_no_utilisation_at_all_is_zero_from_no_source() -> None:
    g = gpu(0, unsupported={"samples", "util"})  # MIG mode: neither call answers
    sampler = NvmlSampler("n1", FakeNvml([g]))
    assert sampler.sample(1.0)[0].util == 0.0 and sampler.util_source == {0: "none"}


def test_bindings_without_the_sample_buffer_read_the_instant() -> None:
    class OldNvml(FakeNvml):
        nvmlDeviceGetSamples = None  # type: ignore[assignment]

    g = gpu(0, util=33)
    run(g, 5, 100)
    sampler = NvmlSampler("n1", OldNvml([g]))
    assert sampler.sample(1.0)[0].util == 33.0 and sampler.util_source == {0: "instant"}


def test_lost_gpu_while_averaging_is_an_error_sample() -> None:
    g = gpu(0)
    run(g, 5, 100)
    sampler = NvmlSampler("n1", FakeNvml([g]))
    assert sampler.sample(1.0)[0].util == 100.0
    g["lost"] = True
    assert sampler.sample(2.0)[0].error == "GPU is lost"

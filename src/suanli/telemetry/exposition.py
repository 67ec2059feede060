"""The fleet's GPU readings and the scheduler's state in the Prometheus text exposition format (for `/metrics`).

Per-GPU series carry dcgm-exporter's metric names, types, units, help texts and labels (`gpu`, `UUID`, `Hostname`,
`modelName`), so dashboards and alert rules written for dcgm-exporter work on a suanli fleet; suanli adds
`workload` and `org` ("" when the GPU is free). Platform series are prefixed `suanli_`. The format itself
(escaping, float spelling, HELP/TYPE lines) is the official `prometheus_client` library's, never hand-written.

`render` is a pure function of its inputs (no I/O, no clock), so the server decides what "latest" means and tests
can pin every byte.

Emitted, per GPU (gauges, dcgm-exporter's units): DCGM_FI_DEV_GPU_UTIL (%), DCGM_FI_DEV_GPU_TEMP (C),
DCGM_FI_DEV_FB_USED / DCGM_FI_DEV_FB_FREE (MiB), DCGM_FI_DEV_POWER_USAGE / DCGM_FI_DEV_POWER_MGMT_LIMIT (W),
DCGM_FI_DEV_SM_CLOCK (MHz), DCGM_FI_DEV_CLOCK_THROTTLE_REASONS (bitmask), DCGM_FI_DEV_XID_ERRORS (last XID, 0: none),
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL / DCGM_FI_DEV_ECC_DBE_VOL_TOTAL (volatile ECC error counts), suanli_gpu_healthy (1/0)
and suanli_gpu_sample_timestamp_seconds (when the reading was taken, for staleness alerts). A GPU whose sample has
an `error` could not be read: it gets suanli_gpu_healthy 0 and its timestamp, no readings.

Per platform: suanli_queued_workloads{class}, suanli_gpus{model,state="allocated"|"free"|"unhealthy"|"draining"} (one metric,
so `sum by (model)` is the model's fleet size), suanli_unhealthy_gpus, suanli_gpu_waste_ratio,
suanli_gpu_fragmentation_ratio, suanli_waste_gpu_seconds_total, suanli_queued_capacity_gpu_seconds_total,
suanli_scheduling_pass_seconds (histogram), suanli_revenue_per_hour{currency}, suanli_nodes{state}.

Lint: `promtool check metrics` parses all of it and finds nothing to say about the platform series; on per-GPU
series its one remark (exit status 3) is dcgm-exporter's camelCase `modelName` label, kept on purpose: renaming it
would break DCGM dashboards. The ECC counts are typed gauge, not counter as in
dcgm-exporter's (commented-out) csv: a counter must be named `..._total`, and both this library and promtool would
rename or flag `..._VOL_TOTAL`; `increase()` works on either type.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from suanli.telemetry.samples import GpuSample, Tagged

CONTENT_TYPE: str = CONTENT_TYPE_LATEST  # the Content-Type header for `render`'s bytes

GPU_LABELS = ("gpu", "UUID", "Hostname", "modelName", "workload", "org")
GPU_STATES = (
    "allocated",
    "free",
    "unhealthy",
    "draining",
)  # suanli_gpus{state}, in `Platform.gpus_by_model` tuple order


@dataclass(frozen=True)
class GpuSeries:
    """The latest sample of one GPU, with the node it sits in and whether suanli considers it schedulable."""

    tagged: Tagged  # sample + catalog model + workload + org ("" when free)
    hostname: str  # the node's name: dcgm-exporter's `Hostname` label
    healthy: bool


@dataclass(frozen=True)
class Platform:
    """The scheduler's view of the fleet at one moment, as the leader computed it."""

    queue_by_class: Mapping[str, int]  # "reserved" / "on-demand" / "spot" -> pending workloads
    gpus_by_model: Mapping[str, tuple[int, ...]]  # model -> (allocated, free, unhealthy, draining) GPUs
    waste_fraction: float  # idle GPUs while work is queued / all GPUs (0 with an empty queue)
    fragmentation: float  # idle GPUs no queued workload can use / all GPUs
    waste_gpu_seconds: float  # counter since the scheduler leader started
    queued_capacity_gpu_seconds: float  # counter since the scheduler leader started
    revenue_per_hour: float  # sum of the open allocations' rates
    currency: str
    sched_latency_buckets: Sequence[tuple[float, int]]  # cumulative (le seconds, count), ascending, +Inf last
    sched_latency_sum: float  # seconds, over all passes counted in the buckets
    nodes_by_state: Mapping[str, int]
    unhealthy_gpus: int


# dcgm-exporter's name and help text (etc/default-counters.csv, dcp-metrics-included.csv), and how to read it from a
# sample; None: this GPU does not report it (no power limit, no memory total), so the series is left out.
_DCGM: tuple[tuple[str, str, Callable[[GpuSample], float | None]], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda s: s.util),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda s: s.temp_c),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda s: s.mem_used_mib),
    (
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        lambda s: max(s.mem_total_mib - s.mem_used_mib, 0) if s.mem_total_mib > 0 else None,
    ),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda s: s.power_w),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).", lambda s: s.power_limit_w or None),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda s: s.sm_clock_mhz),
    (
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "Current clock throttle reasons (bitmask of DCGM_CLOCKS_THROTTLE_REASON_*).",
        lambda s: s.throttle,
    ),
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", lambda s: s.xid),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.", lambda s: s.ecc_sbe),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", lambda s: s.ecc_dbe),
)


def _gpu_label_values(series: GpuSeries) -> list[str]:
    t = series.tagged
    return [str(t.sample.gpu), t.sample.uuid, series.hostname, t.model, t.workload, t.org]


def _gpu_families(gpus: Sequence[GpuSeries]) -> Iterator[Metric]:
    ordered = sorted(gpus, key=lambda g: (g.hostname, g.tagged.sample.gpu, g.tagged.sample.uuid))
    families = {name: GaugeMetricFamily(name, doc, labels=GPU_LABELS) for name, doc, _ in _DCGM}
    healthy = GaugeMetricFamily(
        "suanli_gpu_healthy", "1 when the GPU answered and suanli schedules on it, 0 otherwise.", labels=GPU_LABELS
    )
    taken = GaugeMetricFamily(
        "suanli_gpu_sample_timestamp_seconds", "When the GPU's latest sample was read (Unix time).", labels=GPU_LABELS
    )
    for series in ordered:
        sample, labels = series.tagged.sample, _gpu_label_values(series)
        healthy.add_metric(labels, 1 if series.healthy and not sample.error else 0)
        taken.add_metric(labels, sample.t)
        if sample.error:  # it could not be read: its other fields are not readings
            continue
        for name, _, read in _DCGM:
            value = read(sample)
            if value is not None:
                families[name].add_metric(labels, value)
    yield from families.values()
    yield healthy
    yield taken


def _latency_buckets(buckets: Sequence[tuple[float, int]]) -> list[tuple[str, float]]:
    """Checked cumulative buckets in the library's (le string, count) form; none yet: the +Inf bucket at 0."""
    pairs = list(buckets) or [(math.inf, 0)]
    les, counts = [le for le, _ in pairs], [n for _, n in pairs]
    if les[-1] != math.inf or les != sorted(set(les)) or counts != sorted(counts):
        raise ValueError(f"scheduling latency buckets must be cumulative with ascending le, +Inf last: {pairs}")
    return [(floatToGoString(le), n) for le, n in pairs]


def _platform_families(p: Platform) -> Iterator[Metric]:
    queued = GaugeMetricFamily("suanli_queued_workloads", "Pending workloads by scheduling class.", labels=["class"])
    for cls in sorted(p.queue_by_class):
        queued.add_metric([cls], p.queue_by_class[cls])
    yield queued

    gpus = GaugeMetricFamily("suanli_gpus", "GPUs by catalog model and state.", labels=["model", "state"])
    for model in sorted(p.gpus_by_model):
        for state, n in zip(GPU_STATES, p.gpus_by_model[model], strict=True):
            gpus.add_metric([model, state], n)
    yield gpus
    yield GaugeMetricFamily("suanli_unhealthy_gpus", "GPUs the scheduler will not place work on.", p.unhealthy_gpus)
    yield GaugeMetricFamily(
        "suanli_gpu_waste_ratio", "Idle GPUs while work is queued, as a fraction of all GPUs.", p.waste_fraction
    )
    yield GaugeMetricFamily(
        "suanli_gpu_fragmentation_ratio",
        "Idle GPUs that no queued workload can use, as a fraction of all GPUs.",
        p.fragmentation,
    )
    yield CounterMetricFamily(
        "suanli_waste_gpu_seconds",
        "GPU-seconds left idle while work was queued, since the scheduler leader started.",
        p.waste_gpu_seconds,
    )
    yield CounterMetricFamily(
        "suanli_queued_capacity_gpu_seconds",
        "GPU-seconds requested by queued work while it waited, since the scheduler leader started.",
        p.queued_capacity_gpu_seconds,
    )
    yield HistogramMetricFamily(
        "suanli_scheduling_pass_seconds",
        "How long one scheduling pass took.",
        buckets=_latency_buckets(p.sched_latency_buckets),
        sum_value=p.sched_latency_sum,
    )
    revenue = GaugeMetricFamily(
        "suanli_revenue_per_hour", "Sum of the open allocations' rates, per hour.", labels=["currency"]
    )
    revenue.add_metric([p.currency], p.revenue_per_hour)
    yield revenue

    nodes = GaugeMetricFamily("suanli_nodes", "Registered nodes by state.", labels=["state"])
    for state in sorted(p.nodes_by_state):
        nodes.add_metric([state], p.nodes_by_state[state])
    yield nodes


class _Snapshot(Collector):
    """Yields the families of one fixed set of inputs; registered into a throwaway registry per render."""

    def __init__(self, gpus: Sequence[GpuSeries], platform: Platform | None) -> None:
        self._gpus, self._platform = gpus, platform

    def collect(self) -> Iterator[Metric]:
        yield from _gpu_families(self._gpus)
        if self._platform is not None:
            yield from _platform_families(self._platform)


def render(gpus: Sequence[GpuSeries], platform: Platform | None) -> bytes:
    """The exposition body for these GPUs and (when given: only the scheduler leader has it) the platform state.

    A fresh registry each call, never the library's global one, so nothing leaks between calls or processes.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(gpus, platform))
    return generate_latest(registry)

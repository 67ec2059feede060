"""GPU samples in the database: ingest (tagged with who held each GPU), rollups with bounded retention, reads.

Raw samples are kept for `raw_s`; a compaction pass rolls every finished minute into per-minute min/avg/max and
every finished hour into per-hour ones, and drops each resolution past its retention, so the tables hold at most
`GPUs x (raw_s / period + minute_s / 60 + hour_s / 3600)` rows however long the platform runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, case, delete, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from suanli.control.scheduling import inventory
from suanli.control.settings import Settings
from suanli.db.models import Allocation, Gpu, KeyValue, Node
from suanli.db.telemetry import GpuRollup, GpuSampleRow
from suanli.telemetry.samples import GpuSample, Tagged

MINUTE_MS, HOUR_MS = 60_000, 3_600_000
ROLLED = {60: "rolled_minute_ms", 3600: "rolled_hour_ms"}  # kv: rollups are complete before this time
ROLLING = "rolling_minute_gpu"  # kv: GPU rows below this are rolled up for the minute after ROLLED[60] (sliced)
SHARED = ("", "")  # the holder a GPU two workloads share is tagged with: its readings are the whole GPU's
GPU_SLICE = 2048  # GPU rows a sliced compaction rolls up per call: 123k samples at 1 Hz


def ms(t: datetime | float) -> int:
    return int((t.timestamp() if isinstance(t, datetime) else t) * 1000)


def at(t_ms: int) -> datetime:
    return datetime.fromtimestamp(t_ms / 1000, tz=UTC)


@dataclass(frozen=True)
class Retention:
    raw_s: int = 2 * 3600
    minute_s: int = 7 * 86400
    hour_s: int = 90 * 86400
    late_s: int = 30  # a minute is rolled up this long after it ends: samples still in flight get in


def retention_of(settings: Settings) -> Retention:
    return Retention(raw_s=settings.telemetry_raw_s, minute_s=settings.telemetry_minute_s,
                     hour_s=settings.telemetry_hour_s)  # fmt: skip


@dataclass
class FleetIndex:
    """GPU rows by (node name, index), and who holds each GPU: rebuilt when the inventory version moves."""

    version: tuple[int, int] = (-1, -1)
    gpus: dict[tuple[str, int], tuple[int, str]] = field(default_factory=dict)  # -> (gpus.id, model)
    node_ids: dict[str, str] = field(default_factory=dict)  # node name -> id
    holders: dict[tuple[str, int], tuple[str, str]] = field(default_factory=dict)  # -> (workload, org); SHARED

    def refresh(self, s: Session) -> FleetIndex:
        fleet = inventory.fleet_version(s)
        version = (fleet, s.scalar(select(KeyValue.value).where(KeyValue.key == inventory.INVENTORY_VERSION)) or 0)
        if version == self.version:
            return self
        if fleet != self.version[0]:
            rows = s.execute(select(Node.name, Node.id, Gpu.index, Gpu.id, Gpu.model).join(Gpu, Gpu.node_id == Node.id))
            self.gpus = {(name, idx): (gid, model) for name, _, idx, gid, model in rows}
            self.node_ids = dict(s.execute(select(Node.name, Node.id)).all())
        holders: dict[tuple[str, int], tuple[str, str]] = {}
        for placement, workload, org in s.execute(
            select(Allocation.placement, Allocation.workload, Allocation.org_id).where(Allocation.stopped_at.is_(None))
        ):
            for node, idx in (placement or {}).items():
                for g in idx:
                    key = (node, int(g))
                    # A GPU two workloads share (slices): its readings are the whole GPU's, so they name neither.
                    holders[key] = (workload, org) if holders.get(key, (workload, org))[0] == workload else SHARED
        self.holders, self.version = holders, version
        return self

    def models(self) -> dict[tuple[str, int], str]:
        """Catalog model of every GPU, by (node name, index): what the health rules' thresholds need."""
        return {key: model for key, (_, model) in self.gpus.items()}

    def tag(self, sample: GpuSample) -> Tagged:
        _, model = self.gpus.get((sample.node, sample.gpu), (0, ""))
        workload, org = self.holders.get((sample.node, sample.gpu), ("", ""))
        return Tagged(sample, model, workload, org)


@dataclass
class IngestReport:
    stored: int = 0
    late: int = 0  # stored after their minute was rolled up: in raw series only, not in the 1m/1h ones
    unknown: list[str] = field(default_factory=list)  # "node/gpu" of samples for GPUs nobody registered


def _insert_ignoring_duplicates(s: Session) -> Any:
    """A Core insert of the table (the ORM's bulk path costs a third more per row)."""
    return (pg_insert if s.get_bind().dialect.name == "postgresql" else sqlite_insert)(GpuSampleRow.__table__)


def ingest(s: Session, samples: Sequence[GpuSample], index: FleetIndex) -> tuple[IngestReport, list[Tagged]]:
    """Store samples (a retried batch stores nothing twice) and move each reporting node's heartbeat."""
    report = IngestReport()
    rows: list[dict[str, Any]] = []
    tagged: list[Tagged] = []
    seen: dict[str, float] = {}
    for x in samples:
        gpu = index.gpus.get((x.node, x.gpu))
        if gpu is None:
            report.unknown.append(f"{x.node}/{x.gpu}")
            continue
        t = index.tag(x)
        tagged.append(t)
        seen[x.node] = max(seen.get(x.node, 0.0), x.t)
        rows.append({"gpu_id": gpu[0], "t_ms": ms(x.t), "util": x.util, "mem_used_mib": x.mem_used_mib,
                     "temp_c": x.temp_c, "power_w": x.power_w, "sm_clock_mhz": x.sm_clock_mhz,
                     "throttle": x.throttle, "ecc_sbe": x.ecc_sbe, "ecc_dbe": x.ecc_dbe, "xid": x.xid,
                     "error": x.error[:500], "workload": t.workload, "org": t.org})  # fmt: skip
    if rows:
        s.execute(_insert_ignoring_duplicates(s).on_conflict_do_nothing(), rows)
        report.stored = len(rows)
        rolled = _kv(s, ROLLED[60])
        if rolled is not None:
            report.late = sum(1 for r in rows if r["t_ms"] < rolled)
    if seen:
        t = Node.__table__.c
        newer = (t.last_seen_at.is_(None)) | (t.last_seen_at < bindparam("seen"))  # an old batch moves nothing back
        s.execute(
            update(Node.__table__).where(t.id == bindparam("nid"), newer).values(last_seen_at=bindparam("seen")),
            [{"nid": index.node_ids[n], "seen": at(ms(x))} for n, x in seen.items() if n in index.node_ids],
        )
    return report, tagged


# ---- compaction ---------------------------------------------------------------------------------------------
def _kv(s: Session, key: str) -> int | None:
    return s.scalar(select(KeyValue.value).where(KeyValue.key == key))


def _set_kv(s: Session, key: str, value: int) -> None:
    ins = pg_insert if s.get_bind().dialect.name == "postgresql" else sqlite_insert
    s.execute(ins(KeyValue).values(key=key, value=value).on_conflict_do_update(index_elements=["key"],
                                                                               set_={"value": value}))  # fmt: skip


def _one(col: Any) -> Any:
    """A bucket names a workload only when every reading in it does (one that a shared GPU's or an idle one's
    readings went into names none): what a tenant's view of a slice may show."""
    return case((func.min(col) == func.max(col), func.max(col)), else_="")


def _roll_raw(s: Session, start: int, end: int, gpus: tuple[int, int] | None = None) -> None:
    """Minute buckets of raw samples (of GPU rows in [lo, hi) when `gpus` is given); an unreadable sample (error
    set) counts in `errors`, not in the readings."""
    r = GpuSampleRow
    bucket = (r.t_ms // MINUTE_MS) * MINUTE_MS
    ok = r.error == ""

    def agg(fn: Any, col: Any) -> Any:
        return func.coalesce(fn(case((ok, col))), 0.0)

    q = (
        select(r.gpu_id, 60, bucket, func.count(),
               agg(func.min, r.util), agg(func.avg, r.util), agg(func.max, r.util),
               agg(func.min, r.temp_c), agg(func.avg, r.temp_c), agg(func.max, r.temp_c),
               agg(func.min, r.power_w), agg(func.avg, r.power_w), agg(func.max, r.power_w),
               agg(func.min, r.mem_used_mib), agg(func.avg, r.mem_used_mib), agg(func.max, r.mem_used_mib),
               func.max(r.xid), func.sum(case((ok, 0), else_=1)), _one(r.workload))
        .where(r.t_ms >= start, r.t_ms < end)
        .group_by(r.gpu_id, bucket)
    )  # fmt: skip
    if gpus is not None:
        q = q.where(r.gpu_id >= gpus[0], r.gpu_id < gpus[1])
    cols = [c.name for c in GpuRollup.__table__.columns]
    s.execute(insert(GpuRollup).from_select(cols, q))


def _roll_minutes(s: Session, start: int, end: int) -> None:
    r = GpuRollup
    bucket = (r.t_ms // HOUR_MS) * HOUR_MS
    n = func.sum(r.n)
    q = (
        select(r.gpu_id, 3600, bucket, n, func.min(r.util_min), func.sum(r.util_avg * r.n) / n, func.max(r.util_max),
               func.min(r.temp_min), func.sum(r.temp_avg * r.n) / n, func.max(r.temp_max), func.min(r.power_min),
               func.sum(r.power_avg * r.n) / n, func.max(r.power_max), func.min(r.mem_min),
               func.sum(r.mem_avg * r.n) / n, func.max(r.mem_max), func.max(r.xid_max), func.sum(r.errors),
               _one(r.workload))
        .where(r.res_s == 60, r.t_ms >= start, r.t_ms < end)
        .group_by(r.gpu_id, bucket)
    )  # fmt: skip
    cols = [c.name for c in GpuRollup.__table__.columns]
    s.execute(insert(GpuRollup).from_select(cols, q))


@dataclass
class CompactReport:
    minutes: int = 0  # minute buckets rolled up
    hours: int = 0
    deleted: int = 0
    more: bool = False  # a sliced call left work for the next one


def compact(
    s: Session, now: datetime, keep: Retention, slice_s: int | None = None, keep_raw_from_ms: int | None = None
) -> CompactReport:
    """Roll up what has finished since the last pass, then drop what is past its retention. Idempotent: the
    watermarks move in the same transaction as the rows they cover. With `slice_s`, one call rolls up at most one
    minute and deletes at most `slice_s` seconds of raw samples, and says whether there is `more`: a caller
    running each call in its own transaction never holds the write lock long (SQLite has only one).
    `keep_raw_from_ms`: raw samples from then on stay however old (usage billing has yet to read them)."""
    report = CompactReport()
    now_ms = ms(now)
    minute_end = (now_ms - keep.late_s * 1000) // MINUTE_MS * MINUTE_MS
    first = s.scalar(select(func.min(GpuSampleRow.t_ms)))
    done = _kv(s, ROLLED[60])
    start = done if done is not None else (first // MINUTE_MS * MINUTE_MS if first is not None else minute_end)
    if slice_s is not None and minute_end > start + MINUTE_MS:
        minute_end, report.more = start + MINUTE_MS, True
    if minute_end > start and slice_s is not None:  # one minute, GPU_SLICE GPU rows at a time
        lo = _kv(s, ROLLING) or 0
        _roll_raw(s, start, minute_end, (lo, lo + GPU_SLICE))
        if lo + GPU_SLICE <= (s.scalar(select(func.max(GpuSampleRow.gpu_id))) or 0):  # max of the key: cheap
            _set_kv(s, ROLLING, lo + GPU_SLICE)
            minute_end, report.more = start, True  # this minute is not rolled up until every slice is
        else:
            _set_kv(s, ROLLING, 0)
    elif minute_end > start:
        lo = _kv(s, ROLLING) or 0  # a sliced pass stopped part-way through its minute: finish that one first
        _roll_raw(s, start, start + MINUTE_MS, (lo, 1 << 62))
        _roll_raw(s, start + MINUTE_MS, minute_end)
        _set_kv(s, ROLLING, 0)
    if minute_end > start:
        report.minutes = (minute_end - start) // MINUTE_MS
        _set_kv(s, ROLLED[60], minute_end)
    rolled_minutes = max(start, minute_end)
    hour_end = rolled_minutes // HOUR_MS * HOUR_MS
    done_h = _kv(s, ROLLED[3600])
    first_m = s.scalar(select(func.min(GpuRollup.t_ms)).where(GpuRollup.res_s == 60))
    start_h = done_h if done_h is not None else (first_m // HOUR_MS * HOUR_MS if first_m is not None else hour_end)
    if hour_end > start_h:
        _roll_minutes(s, start_h, hour_end)
        report.hours = (hour_end - start_h) // HOUR_MS
        _set_kv(s, ROLLED[3600], hour_end)
    raw_cut = min(now_ms - keep.raw_s * 1000, rolled_minutes)  # never drop what is not rolled up yet
    if keep_raw_from_ms is not None:
        raw_cut = min(raw_cut, keep_raw_from_ms)
    if slice_s is not None and first is not None and raw_cut > first + slice_s * 1000:
        raw_cut, report.more = first + slice_s * 1000, True
    for stmt in (
        delete(GpuSampleRow).where(GpuSampleRow.t_ms < raw_cut),
        delete(GpuRollup).where(GpuRollup.res_s == 60, GpuRollup.t_ms < min(now_ms - keep.minute_s * 1000,
                                                                            max(start_h, hour_end))),
        delete(GpuRollup).where(GpuRollup.res_s == 3600, GpuRollup.t_ms < now_ms - keep.hour_s * 1000),
    ):  # fmt: skip
        report.deleted += s.execute(stmt).rowcount or 0
    return report


# ---- reads ----------------------------------------------------------------------------------------------------
RESOLUTIONS = {"raw": 0, "1m": 60, "1h": 3600}
MAX_POINTS = 5000  # per GPU and request


def resolution_for(since: datetime, until: datetime, keep: Retention, now: datetime) -> str:
    """The finest resolution that still covers `since` and gives at most MAX_POINTS points a GPU."""
    span, age = (until - since).total_seconds(), (now - since).total_seconds()
    if age <= keep.raw_s and span <= 2 * 3600:
        return "raw"
    if age <= keep.minute_s and span <= MAX_POINTS * 60:
        return "1m"
    return "1h"


Window = tuple[int, int, int]  # (gpus.id, from ms, to ms)


def series(
    s: Session, windows: Iterable[Window], resolution: str, workload: str | None = None, whole: bool = True
) -> dict[int, list[dict[str, Any]]]:
    """Points per GPU row inside each window, oldest first (the newest MAX_POINTS): raw readings, or min/avg/max
    of a bucket. With `workload` (a tenant's view), raw samples are the ones tagged with it and buckets only those
    wholly inside the window, so nothing another holder of the GPU did shows; for a slice (not `whole`), which
    another workload may share, only buckets every reading of which is its own."""
    out: dict[int, list[dict[str, Any]]] = {}
    for gid, lo, hi in windows:
        if resolution == "raw":
            r = GpuSampleRow
            q = select(r.t_ms, r.util, r.temp_c, r.power_w, r.mem_used_mib, r.sm_clock_mhz, r.xid, r.error, r.workload)
            q = q.where(r.gpu_id == gid, r.t_ms >= lo, r.t_ms <= hi)
            if workload is not None:
                q = q.where(r.workload == workload)
            rows = list(s.execute(q.order_by(r.t_ms.desc()).limit(MAX_POINTS)))[::-1]
            pts = [{"t": at(t), "util": u, "temp_c": tc, "power_w": p, "mem_used_mib": m, "sm_clock_mhz": c,
                    "xid": x, "error": e, "workload": w} for t, u, tc, p, m, c, x, e, w in rows]  # fmt: skip
        else:
            g, res_ms = GpuRollup, RESOLUTIONS[resolution] * 1000
            q = select(g).where(g.gpu_id == gid, g.res_s == RESOLUTIONS[resolution])
            q = q.where(g.t_ms >= lo, g.t_ms + res_ms <= hi) if workload is not None else q.where(
                g.t_ms > lo - res_ms, g.t_ms <= hi)  # fmt: skip
            if workload is not None and not whole:
                q = q.where(g.workload == workload)
            rows = list(s.execute(q.order_by(g.t_ms.desc()).limit(MAX_POINTS)).scalars())[::-1]
            pts = [{"t": at(x.t_ms), "n": x.n, "util": x.util_avg, "util_min": x.util_min, "util_max": x.util_max,
                    "temp_c": x.temp_avg, "temp_min": x.temp_min, "temp_max": x.temp_max, "power_w": x.power_avg,
                    "power_min": x.power_min, "power_max": x.power_max, "mem_used_mib": x.mem_avg,
                    "xid": x.xid_max, "errors": x.errors, "workload": workload if workload is not None else x.workload}
                   for x in rows]  # fmt: skip
        out.setdefault(gid, []).extend(pts)
    return out


@dataclass(frozen=True)
class Latest:
    """The newest sample of one GPU with its inventory row."""

    node: str
    node_state: str
    gpu: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool
    health_reason: str
    sample: Tagged | None  # None: no sample inside the window


def latest(s: Session, now: datetime, window_s: float) -> list[Latest]:
    """Every registered GPU with its newest sample of the last `window_s` (older ones count as missing). One
    index seek per GPU on the samples' key (GPU, time), not a scan of the window: 10,000 GPUs at 1 Hz keep
    900,000 samples in a 90 s window."""
    r, g, n = GpuSampleRow.__table__.c, Gpu.__table__.c, Node.__table__.c
    since = ms(now) - int(window_s * 1000)
    newest = (
        select(func.max(r.t_ms)).where(r.gpu_id == g.id, r.t_ms >= since).correlate(Gpu.__table__).scalar_subquery()
    )
    q = (
        select(n.name, n.state, g.index, g.uuid, g.model, g.memory_mib, g.healthy, g.health_reason, r.t_ms, r.util,
               r.mem_used_mib, r.temp_c, r.power_w, r.sm_clock_mhz, r.throttle, r.ecc_sbe, r.ecc_dbe, r.xid, r.error,
               r.workload, r.org)
        .select_from(Node.__table__.join(Gpu.__table__, g.node_id == n.id)
                     .outerjoin(GpuSampleRow.__table__, (r.gpu_id == g.id) & (r.t_ms == newest)))
        .order_by(n.cluster_id, n.index, g.index)
    )  # fmt: skip
    out = []
    for x in s.execute(q):
        tagged = None
        if x.t_ms is not None:
            sample = GpuSample(node=x.name, gpu=x.index, uuid=x.uuid, t=x.t_ms / 1000, util=x.util,
                               mem_used_mib=x.mem_used_mib, mem_total_mib=x.memory_mib, temp_c=x.temp_c,
                               power_w=x.power_w, sm_clock_mhz=x.sm_clock_mhz, throttle=x.throttle, ecc_sbe=x.ecc_sbe,
                               ecc_dbe=x.ecc_dbe, xid=x.xid, error=x.error)  # fmt: skip
            tagged = Tagged(sample, x.model, x.workload, x.org)
        out.append(Latest(x.name, x.state, x.index, x.uuid, x.model, x.memory_mib, x.healthy, x.health_reason, tagged))
    return out


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

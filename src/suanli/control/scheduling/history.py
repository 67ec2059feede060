"""Runtime estimates for the scheduling pass, from each org's finished jobs in the database: what `suanli sim` feeds
its `RuntimeHistory` from the trace, here from the rows.

A job counts once it succeeded (ran to its end, as every trace job does) and ended at least `lag_s` before the pass;
its run time is the GPU-time all its attempts held (`attained_gpu_s`) over the GPUs it asked for, the same request
key as the simulator's (tenant = org, model preset, GPU count), taken through `sched.estimates.run_seconds` (a
non-positive time is no run; one past `LONGEST_RUN_S` counts as that). Each org has a `RuntimeHistory` of its own,
so the core's coarsest group ("everyone's") holds only that org's work: another tenant's jobs never reach an org's
estimates. A request's estimate is taken once, when a pass first sees it queued, through
`sched.estimates.for_request` (the spec's `duration` wins, its `max_duration` caps), as the simulator takes it at an
arrival.

Reads are bounded and incremental: the first pass reads the newest `startup_rows` ended workloads (any state, the
`finished_at` index, newest first), later passes only those that ended since the last one read, at most `batch_rows`
a pass (a burst is taken over several passes). A tenant with a million finished jobs costs a pass nothing more than
one with ten; the core keeps 64 run times per group.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from suanli.control.scheduling import placing
from suanli.db.models import Workload
from suanli.sched import Request
from suanli.sched.estimates import RuntimeHistory, for_request, run_seconds
from suanli.sched.types import FULL
from suanli.workloads.durations import MAX_DURATION_S
from suanli.workloads.spec import WorkloadSpec

LAG_S = 60.0  # a transaction that ends jobs at its `now` may commit after a pass read past that `now`, and the
# watermark never goes back: what ended within this long of the pass waits for the next one
SPEC_BATCH = 500  # specs parsed at a time: a spec may be up to the 1 MiB body limit
BATCH_ROWS = 1000  # ended workloads one pass reads at most, of every org and state
STARTUP_ROWS = 20_000  # the newest ended workloads the first pass reads (after a restart): enough to fill the core's
# 64-sample windows of the active orgs, bounded however long the table's history is
LONGEST_RUN_S = MAX_DURATION_S  # the longest `max_duration` a spec may set: a longer run counts as this long


def shape(r: Request) -> tuple[str, str | None, int]:
    """The history key of a request: (tenant, model preset, GPUs), as `suanli sim` keys its trace jobs."""
    return r.tenant, r.model.preset if r.model else None, r.gpus


@dataclass
class ServerHistory:
    lag_s: float = LAG_S
    batch_rows: int = BATCH_ROWS
    startup_rows: int = STARTUP_ROWS
    rows_read: int = 0  # ended workloads the last `refresh` read (tests and benchmarks check the bound)
    _orgs: dict[str, RuntimeHistory] = field(default_factory=dict, repr=False)
    _mark: tuple[datetime, str] | None = None  # (finished_at, id) of the last ended workload read

    def of(self, org: str) -> RuntimeHistory:
        """The org's own history (an empty one when it has none yet; not kept)."""
        return self._orgs.get(org) or RuntimeHistory()

    def version(self, org: str) -> int:
        """How many of the org's runs were recorded (`RuntimeHistory.version`): an estimate taken at another may be
        stale."""
        h = self._orgs.get(org)
        return h.version(org) if h is not None else 0

    def refresh(self, s: Session, now: datetime, parsed: dict[str, WorkloadSpec]) -> int:
        """Record the jobs that ended since the last refresh (`parsed`: specs the pass holds already, by workload
        id; the others are read). Returns the jobs recorded."""
        w = Workload
        upto = now - timedelta(seconds=self.lag_s)
        cols = (w.id, w.org_id, w.kind, w.state, w.attained_gpu_s, w.finished_at)
        if self._mark is None:
            rows = list(s.execute(select(*cols).where(w.finished_at <= upto)
                                  .order_by(w.finished_at.desc(), w.id.desc()).limit(self.startup_rows)))  # fmt: skip
            rows.reverse()
        else:
            t, last = self._mark
            rows = list(s.execute(
                select(*cols).where(w.finished_at >= t, or_(w.finished_at > t, w.id > last), w.finished_at <= upto)
                .order_by(w.finished_at, w.id).limit(self.batch_rows)
            ))  # fmt: skip
        self.rows_read = len(rows)
        if rows:
            self._mark = (rows[-1].finished_at, rows[-1].id)
        elif self._mark is None:
            self._mark = (upto, "")
        # only jobs that held GPUs: a flood of CPU-only jobs (specs up to the body limit each) is never read
        done = [r for r in rows if r.kind == "job" and r.state == "succeeded" and (r.attained_gpu_s or 0.0) > 0.0]
        n = 0
        for i in range(0, len(done), SPEC_BATCH):  # specs are read and dropped a batch at a time
            n += self._record(s, done[i : i + SPEC_BATCH], parsed)
        return n

    def _record(self, s: Session, done: list[Any], parsed: dict[str, WorkloadSpec]) -> int:
        unknown = [r.id for r in done if r.id not in parsed]
        raw = placing.specs_of(s, unknown) if unknown else {}
        n = 0
        for r in done:
            spec = parsed.get(r.id)
            if spec is None:
                try:
                    spec = WorkloadSpec.model_validate(raw.get(r.id))
                except ValueError:  # a row no spec of today's parses: nothing to learn from it
                    continue
            req = spec.to_request(r.id, 0.0, r.org_id)
            if req.gpus <= 0:  # CPU-only work never reaches the cycle
                continue
            took = run_seconds((r.attained_gpu_s or 0.0) / (req.gpus * req.milli / FULL), LONGEST_RUN_S)
            if took is None:
                continue
            if r.org_id not in self._orgs:
                self._orgs[r.org_id] = RuntimeHistory()
            self._orgs[r.org_id].record(*shape(req), took)
            n += 1
        return n

    def estimate(self, req: Request, spec: WorkloadSpec) -> Request:
        """The request with its estimate from its org's history (the spec's `duration` wins, `max_duration` caps)."""
        est, samples = for_request(self.of(req.tenant), *shape(req), declared=spec.duration, limit=spec.max_duration)
        if est == req.est_runtime and samples == req.est_samples:
            return req
        return replace(req, est_runtime=est, est_samples=samples)

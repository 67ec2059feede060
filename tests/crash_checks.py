"""What must hold after a crash, read from the database: the invariants of the crash loop (`tests/crash_loop.py`).

`check` counts, in one snapshot of the database, every violation of (`Invariants`; all must be 0):
- lost: a submission answered 201 whose workload is not stored;
- duplicated: a name stored twice (each submission has its own), an allocation of an attempt its workload never
  made (or of no workload), or a local attempt launched twice (each writes its attempt number to a file in its
  workdir when it starts);
- gpu_held_twice: two open allocations on one GPU, or two allocations of one GPU overlapping in time;
- unbalanced: a ledger transaction whose entries do not sum to zero;
- balance_mismatch: a running balance not exactly the sum of its entries;
- misbilled: an allocation whose ledger charges are not `cost_of(rate, seconds)` for its recorded start and stop
  (or, while it runs, for the windows it has been metered), or a charge posted twice (`tests.money_worker.audit`);
- refused: a submission (all are valid, and the tenants can afford them) answered with a 4xx;
- server_errors: a 5xx answer to a submission or a stop;
- unfinished (at the end only): a workload not ended, or an allocation not settled; except, when the caller does
  not wait for them, workloads left `starting` with no handle by a crash during their launch, which the server
  declares lost only `LAUNCH_GRACE_S` (120 s) later (counted as `launching`).

Also reported, and asserted at the end (`assert_charged_to_end`, `CHARGED_TO_END`): `past_end_s`, the seconds
billed after a workload ended by its executor's own record (the rank's exit-code file, the virtual run's end),
summed over allocations (`past_end` of them), however late the server learned of the end: after a restart, the
first pass may preempt a run that had already ended unseen (`tests/test_hardening_billing.py`).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from suanli.executors import executor
from suanli.storage import workdirs
from tests.money_worker import audit, billed_seconds

CHARGED_TO_END = True  # every run is charged to its executor's recorded end, however late the server learns it
WINDOW_S = 2  # the servers' metering window: short, so whole windows are charged while no loop watches
TERMINAL = ("succeeded", "failed", "stopped", "preempted")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass
class Invariants:
    lost: int = 0
    duplicated: int = 0
    gpu_held_twice: int = 0
    unbalanced: int = 0
    balance_mismatch: int = 0
    misbilled: int = 0
    refused: int = 0
    server_errors: int = 0
    unfinished: int = 0
    launching: int = 0  # reported only: left `starting` with no handle, within the launch grace
    past_end: int = 0  # reported only (issue 18 #4)
    past_end_s: int = 0
    problems: list[str] = field(default_factory=list)

    HARD = ("lost", "duplicated", "gpu_held_twice", "unbalanced", "balance_mismatch", "misbilled", "refused",
            "server_errors", "unfinished")  # fmt: skip

    def add(self, name: str, problem: str) -> None:
        setattr(self, name, getattr(self, name) + 1)
        self.problems.append(f"{name}: {problem}")

    def broken(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.HARD if getattr(self, k)}

    def counts(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "problems"}


@dataclass
class Submission:
    name: str
    tenant: int
    local: bool
    id: str | None = None  # answered 201
    status: int | None = None  # None: no answer (the server died under it)


@contextmanager
def snapshot(db: Any) -> Iterator[Session]:
    """One consistent view of the database while a server writes to it (PostgreSQL reads are otherwise per
    statement)."""
    if db.dialect == "sqlite":
        with db.read() as s, s.begin():
            yield s
        return
    with (
        Session(db.engine.execution_options(isolation_level="REPEATABLE READ"), expire_on_commit=False) as s,
        s.begin(),
    ):
        yield s


def launching(w: Any) -> bool:
    """Left `starting` with no handle by a crash during its launch: lost only `LAUNCH_GRACE_S` later."""
    return bool(w.state == "starting" and w.handle is None)


def check(
    db: Any, home: Path, subs: list[Submission], *, final: bool = False, wait_launches: bool = True
) -> Invariants:
    """Every invariant of the module docstring, read in one snapshot."""
    from suanli.db.models import Allocation, Workload

    inv = Invariants(server_errors=sum(1 for x in subs if x.status is not None and x.status >= 500))
    for x in subs:
        if x.status is not None and 400 <= x.status < 500:
            inv.add("refused", f"{x.name} answered {x.status}")
    with snapshot(db) as s:
        workloads = list(s.scalars(select(Workload)))
        allocations = list(s.scalars(select(Allocation)))
        for problem in audit(s, WINDOW_S):
            if problem.startswith("recompute: tx:"):
                inv.add("unbalanced", problem)
            elif problem.startswith("recompute: "):
                inv.add("balance_mismatch", problem)
            else:
                inv.add("misbilled", problem)
    by_id = {w.id: w for w in workloads}
    names = Counter(w.name for w in workloads)
    for x in subs:
        if x.id is not None and x.id not in by_id:
            inv.add("lost", f"{x.name} ({x.id}) was answered 201")
    for name, n in names.items():
        if n > 1:
            inv.add("duplicated", f"{n} workloads named {name}")
    for a in allocations:
        wid, _, attempt = a.id.rpartition(".")
        w = by_id.get(wid)
        if w is None or not attempt.isdigit() or not 1 <= int(attempt) <= w.attempt:
            inv.add("duplicated", f"allocation {a.id} of no attempt of a stored workload")
    for w in workloads:
        runs = workdirs.upload_dir(home, w.id) / "launches"
        if w.executor == "local" and runs.exists():
            launched = Counter(runs.read_text().split())
            inv.problems += [
                f"duplicated: {w.name} attempt {k} launched {n} times" for k, n in launched.items() if n > 1
            ]
            inv.duplicated += sum(1 for n in launched.values() if n > 1)
    _gpus_held_once(allocations, inv)
    if final:
        waiting = {w.allocation_id for w in workloads if not wait_launches and launching(w)}
        for w in workloads:
            if not wait_launches and launching(w):
                inv.launching += 1
            elif w.state not in TERMINAL:
                inv.add("unfinished", f"{w.name} is {w.state}")
        for a in allocations:
            if not a.settled and a.id not in waiting:
                inv.add("unfinished", f"allocation {a.id} is not settled")
    for a, over in charged_past_end(allocations, by_id):
        inv.past_end += 1
        inv.past_end_s += over
        inv.problems.append(f"past_end: {a.id} billed {over} s after its workload ended")
    return inv


def _gpus_held_once(allocations: list[Any], inv: Invariants) -> None:
    held: dict[tuple[str, int], list[Any]] = defaultdict(list)
    for a in allocations:
        if a.milli == 1000:  # (slices of one GPU may share it)
            for node, gpus in (a.placement or {}).items():
                for g in gpus:
                    held[(node, g)].append(a)
    for gpu, allocs in held.items():
        if sum(1 for a in allocs if a.stopped_at is None) > 1:
            inv.add("gpu_held_twice", f"{gpu} held by {[a.id for a in allocs if a.stopped_at is None]}")
            continue
        allocs.sort(key=lambda a: a.started_at)
        for before, after in pairwise(allocs):
            if before.stopped_at is None or after.started_at < before.stopped_at:
                inv.add("gpu_held_twice", f"{gpu}: {after.id} started while {before.id} held it")


def charged_past_end(allocations: list[Any], workloads: dict[str, Any]) -> list[tuple[Any, int]]:
    """Closed allocations of ended workloads billed for more seconds than the workload ran by its executor's
    record (asked of the executor, as the server asks it), with the seconds over."""
    out = []
    for a in allocations:
        w = workloads.get(a.id.rpartition(".")[0])
        if a.stopped_at is None or w is None or w.allocation_id != a.id or w.state not in TERMINAL or not w.handle:
            continue
        ended = executor(w.executor).poll(w.handle, time.time()).ended_at
        if ended is None:
            continue  # lost: no record of the end
        end = min(a.stopped_at, max(a.started_at, EPOCH + timedelta(seconds=ended)))
        over = billed_seconds(a.started_at, a.stopped_at) - billed_seconds(a.started_at, end)
        if over > 0:
            out.append((a, over))
    return out


def assert_charged_to_end(db: Any) -> None:
    """Every allocation of an ended workload is billed to the second its workload ended, by the executor's record
    (issue 18 #4), however late the server learned of the end (`CHARGED_TO_END`)."""
    from suanli.db.models import Allocation, Workload

    with snapshot(db) as s:
        workloads = {w.id: w for w in s.scalars(select(Workload))}
        over = charged_past_end(list(s.scalars(select(Allocation))), workloads)
    assert not over, [f"{a.id}: {n} s past the end" for a, n in over]

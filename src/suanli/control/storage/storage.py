"""Workdirs on the server's disk: uploads, each org's storage quota, and removing what is no longer needed.

An upload (`POST /workdirs`, or a small one inline in a submission) is unpacked under the bounds of one upload
(`workdir_max_bytes`, `workdir_max_files`) and under what is left of its org's `storage_quota_bytes`, then kept
as a staged workdir (a `workdirs` row) for the submission that names it: the first submission by its uploader uses
it, admitted or refused; one never named is removed after `STAGED_TTL`. Orgs cost nothing to create, so what one
user keeps staged is bounded over all their orgs too: at most `MAX_STAGED` uploads, and `storage_quota_bytes`. A job's workdir is counted as long as it
is kept: its upload as it came, and once the job ended what the job left there (a job without an upload too).
`sweep` removes it `workdir_retention_hours` after the job ended. An instance's disk is kept while the instance
exists and is not counted here.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import BinaryIO

from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session

from suanli.control.accounts import accounts, memberships
from suanli.control.accounts.accounts import Principal
from suanli.control.errors import Conflict, Invalid, NotFound, ServiceError
from suanli.control.ids import new_id
from suanli.control.settings import Settings
from suanli.db.engine import Database
from suanli.db.models import KeyValue, Org, User, Workdir, Workload, WorkloadEvent
from suanli.storage import workdirs

log = logging.getLogger("suanli.storage")
STAGED_TTL = timedelta(hours=1)  # an upload no submission named by then is removed
ORPHAN_AGE = timedelta(hours=2)  # a leftover in .incoming no row knows (a crash while unpacking) is removed
SWEEP_LAG = timedelta(seconds=60)  # jobs that ended this recently wait a pass: their end may not be committed yet
WATERMARK = "storage_finished_until"  # kv: jobs that ended up to here (µs since the epoch) were looked at
BATCH = 1000
MAX_STAGED = 100  # uploads one user may keep waiting for a submission at once, over all orgs (each a row, a directory)
TERMINAL = ("succeeded", "failed", "stopped", "preempted")


class InsufficientStorage(ServiceError):
    status = 507


@dataclass(frozen=True)
class Store:
    """The settings the storage rules read."""

    home: Path
    quota: int
    limits: workdirs.Limits
    retention: timedelta

    @classmethod
    def of(cls, settings: Settings) -> Store:
        return cls(
            home=settings.home,
            quota=settings.storage_quota_bytes,
            limits=workdirs.Limits(settings.workdir_max_bytes, settings.workdir_max_files),
            retention=timedelta(hours=settings.workdir_retention_hours),
        )

    def note(self) -> str:
        return f"finished jobs' workdirs are removed {self.retention.total_seconds() / 3600:g} hours after they end"


@dataclass(frozen=True)
class Upload:
    id: str
    org_id: str
    bytes: int
    files: int
    expires_at: datetime


def usage(s: Session, org_id: str) -> int:
    """Bytes of workdirs the org keeps on the server's disk (staged uploads and jobs' workdirs)."""
    return int(s.scalar(select(func.coalesce(func.sum(Workdir.bytes), 0)).where(Workdir.org_id == org_id)) or 0)


def staged_by(s: Session, user_id: str) -> tuple[int, int]:
    """(uploads, bytes) the user keeps staged, in every org: uploaded, not yet named by a submission, not yet
    removed (expired ones still hold their disk until the sweep)."""
    n, size = s.execute(
        select(func.count(), func.coalesce(func.sum(Workdir.bytes), 0))
        .where(Workdir.workload_id.is_(None), Workdir.user_id == user_id)
    ).one()  # fmt: skip
    return int(n), int(size or 0)


def _mine_over(field: str, store: Store, n: int, mine: int, rest: str) -> Conflict:
    if n >= MAX_STAGED:
        return Conflict(f"{field}: you have {n} uploads waiting for a submission, the most one user may keep; name "
                        f"them in submissions, or wait up to {STAGED_TTL.seconds // 60} minutes for them to expire")  # fmt: skip
    return Conflict(f"{field}: you keep {mine} bytes of uploads no submission has named yet, over all your "
                    f"organisations{rest}; each user may keep storage_quota_bytes ({store.quota}) of them")  # fmt: skip


def paying_org(s: Session, who: Principal, org: str | None) -> Org:
    """The org a submission (and its upload) is for: `org`, where the caller's role may submit (a viewer may not
    fill a team's storage), or its personal org."""
    found = s.get(Org, who.personal_org_id) if org is None or org == who.personal_org_id else None
    if found is not None:
        return found
    paying = accounts.org_for(s, who, org or who.personal_org_id)
    memberships.require(s, who, paying.id, "submit")
    return paying


def _over(field: str, org: Org, store: Store, used: int, rest: str) -> Conflict:
    return Conflict(f"{field}: {org.name} may keep {store.quota} bytes of workdirs (storage_quota_bytes); it keeps "
                    f"{used}{rest}; {store.note()}")  # fmt: skip


def admit(
    db: Database, who: Principal, org: str | None, store: Store, field: str = "upload"
) -> tuple[Org, int, int, int]:
    """Whether `who` may upload for `org` at all, asked before the body is read: a stranger's upload (404), a
    viewer's (403) and one for an org with no room left (409) are refused without taking in a byte of it. Returns
    the paying org, its usage, and the caller's staged uploads (count, bytes)."""
    with db.read() as s:
        paying = paying_org(s, who, org)
        used = usage(s, paying.id)
        n, mine = staged_by(s, who.user_id)
    _room(field, paying, store, used, n, mine)
    return paying, used, n, mine


def _room(field: str, paying: Org, store: Store, used: int, n: int, mine: int) -> int:
    """What the org's quota and the user's staged uploads leave; 409 when nothing is left."""
    if used >= store.quota:
        raise _over(field, paying, store, used, ", and none is left")
    if n >= MAX_STAGED or mine >= store.quota:
        raise _mine_over(field, store, n, mine, "")
    return min(store.quota - used, store.quota - mine)


def upload(
    db: Database, who: Principal, org: str | None, source: bytes | BinaryIO, store: Store, now: datetime,
    field: str = "upload",
) -> Upload:  # fmt: skip
    """Unpack an upload for `org` under the bounds of one upload and what is left of the org's quota, and keep it
    staged for the submission that names it. Refusals name `field`: 422 for the archive, 409 for the quota."""
    paying = admit(db, who, org, store, field)[0]
    upload_id = new_id("wd")
    used, n, mine, room = _reserve(db, who, paying, store, upload_id, now, field)
    dest = workdirs.staged_dir(store.home, upload_id)
    try:
        try:
            got = workdirs.unpack(source, dest, workdirs.Limits(min(store.limits.bytes, room), store.limits.entries))
        except workdirs.TooLarge as e:
            if e.what == "bytes" and e.limit < store.limits.bytes:
                left = f" and this unpacks to more than the {room} left"
                if room < store.quota - used:
                    raise _mine_over(field, store, n, mine, "," + left) from None
                raise _over(field, paying, store, used, left) from None
            setting = ("workdir_max_bytes, counting each file in whole 4 KiB blocks" if e.what == "bytes"
                       else "workdir_max_files")  # fmt: skip
            raise Invalid(f"{field}: {e} ({setting})") from None
        except workdirs.ArchiveError as e:
            raise Invalid(f"{field}: {e}") from None
        except workdirs.NoSpace:
            raise InsufficientStorage(f"{field}: the server's disk is full; try again later") from None
        expires = now + STAGED_TTL
        with db.write() as s, s.begin():
            row = s.get(Workdir, upload_id, with_for_update=True)
            if row is None:  # swept meanwhile (an unpack of over an hour)
                raise Invalid(f"{field}: the upload took too long to unpack; send it again")
            row.bytes, row.files, row.expires_at = got.bytes, got.files, expires
    except BaseException:
        _unreserve(db, upload_id)
        workdirs.remove_tree(dest)
        raise
    return Upload(upload_id, paying.id, got.bytes, got.files, expires)


def _reserve(
    db: Database, who: Principal, paying: Org, store: Store, upload_id: str, now: datetime, field: str
) -> tuple[int, int, int, int]:
    """Hold the room an upload may unpack to before a byte of it is written: a staged row of that size, counted by
    the org's and the user's quota checks at once. Checked after the bytes landed instead, N uploads sent together
    each unpacked into the same room, N times the quota on the disk. Returns (used, staged uploads, staged bytes,
    room) as they were before it."""
    with db.write() as s, s.begin():
        s.get(User, who.user_id, with_for_update=True)  # uploads of one user, then of one org, one at a time
        s.get(Org, paying.id, with_for_update=True)
        used = usage(s, paying.id)
        n, mine = staged_by(s, who.user_id)
        room = _room(field, paying, store, used, n, mine)
        s.add(Workdir(id=upload_id, org_id=paying.id, user_id=who.user_id, workload_id=None,
                      bytes=min(store.limits.bytes, room), files=0, created_at=now,
                      expires_at=now + STAGED_TTL))  # fmt: skip
    return used, n, mine, room


def _unreserve(db: Database, upload_id: str) -> None:
    with db.write() as s, s.begin():
        s.execute(delete(Workdir).where(Workdir.id == upload_id, Workdir.workload_id.is_(None)))


def staged(s: Session, who: Principal, upload_id: str, now: datetime) -> Workdir:
    """The caller's own upload, not yet used by a submission and not expired; another's does not exist."""
    row = s.get(Workdir, upload_id)
    if row is None or row.user_id != who.user_id or row.workload_id is not None or _expired(row, now):
        raise NotFound(f"workdir_upload: {upload_id} not found")
    return row


def _expired(row: Workdir, now: datetime) -> bool:
    return row.expires_at is not None and row.expires_at <= now


def claim(s: Session, upload_id: str, workload_id: str) -> None:
    """In the submission's write transaction, after its workload row: the upload is now that job's workdir (still
    counted, no longer expiring). Only once: a second submission naming it finds it gone."""
    row = s.get(Workdir, upload_id, with_for_update=True, populate_existing=True)
    if row is None or row.workload_id is not None:
        raise NotFound(f"workdir_upload: {upload_id} not found")
    row.workload_id, row.expires_at = workload_id, None


def lock_staged(s: Session, upload_id: str) -> None:
    """Before the submission's inserts: the upload is still there and unused (two submissions racing for one
    upload: the second waits here, then finds it used)."""
    row = s.get(Workdir, upload_id, with_for_update=True, populate_existing=True)
    if row is None or row.workload_id is not None:
        raise NotFound(f"workdir_upload: {upload_id} not found")


def drop(db: Database, upload_id: str, home: Path, workload_id: str | None = None) -> None:
    """A submission that named the upload was refused: the upload is used up (its row and files go). `workload_id`:
    the refused workload's workdir, if the upload was moved there before the refusal."""
    with db.write() as s, s.begin():
        s.execute(delete(Workdir).where(Workdir.id == upload_id, Workdir.workload_id.is_(None)))
    workdirs.remove_tree(workdirs.staged_dir(home, upload_id))
    if workload_id is not None:
        workdirs.remove_tree(workdirs.upload_dir(home, workload_id))


# ---- the sweep --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Swept:
    expired: int = 0  # staged uploads no submission named in time
    measured: int = 0  # ended jobs whose workdirs were counted
    removed: int = 0  # jobs' workdirs removed after the retention
    orphans: int = 0  # leftovers in .incoming that no row knew


def sweep(db: Database, store: Store, now: datetime, budget_s: float = 10.0) -> Swept:
    """One pass: expire staged uploads, count the workdirs of jobs that ended since the last pass, remove those
    whose retention is over, and leftovers of interrupted uploads. Safe to repeat and to interrupt."""
    deadline = time.monotonic() + budget_s
    expired = _expire(db, store, now)
    orphans = _orphans(db, store, now)
    measured = 0
    while time.monotonic() < deadline:
        n, more = _measure(db, store, now)
        measured += n
        if not more:
            break
    removed = 0
    while time.monotonic() < deadline:
        n = _remove(db, store, now)
        removed += n
        if n < BATCH:
            break
    return Swept(expired, measured, removed, orphans)


def _expire(db: Database, store: Store, now: datetime) -> int:
    with db.write() as s, s.begin():
        ids = list(s.scalars(select(Workdir.id).where(Workdir.workload_id.is_(None), Workdir.expires_at <= now)))
        if ids:
            s.execute(delete(Workdir).where(Workdir.id.in_(ids), Workdir.workload_id.is_(None)))
    for upload_id in ids:  # the rows first: a crash in between leaves an orphan for `_orphans`, not a dead row
        workdirs.remove_tree(workdirs.staged_dir(store.home, upload_id))
    return len(ids)


def _orphans(db: Database, store: Store, now: datetime) -> int:
    """Entries of .incoming older than ORPHAN_AGE that no staged row names: an unpack or a spooled body a crash
    interrupted, or an upload whose row a crash removed first."""
    root = workdirs.incoming_dir(store.home)
    try:
        entries = list(os.scandir(root))
    except OSError:
        return 0
    cutoff = (now - ORPHAN_AGE).timestamp()
    old = [e for e in entries if _mtime(e) < cutoff]
    if not old:
        return 0
    with db.read() as s:
        live = set(s.scalars(select(Workdir.id).where(Workdir.id.in_([e.name for e in old]))))
    gone = [e for e in old if e.name not in live]
    for e in gone:
        workdirs.remove_tree(Path(e.path))
    return len(gone)


def _mtime(e: os.DirEntry[str]) -> float:
    try:
        return e.stat(follow_symlinks=False).st_mtime
    except OSError:
        return float("inf")


def _micros(t: datetime) -> int:
    return int((t - EPOCH).total_seconds() * 1_000_000)


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _measure(db: Database, store: Store, now: datetime) -> tuple[int, bool]:
    """Count the workdirs of a batch of jobs that ended since the watermark (an empty one is removed at once, as
    is one whose retention is already over); (jobs looked at, whether more may be waiting)."""
    upto = now - SWEEP_LAG
    with db.read() as s:
        mark = s.scalar(select(KeyValue.value).where(KeyValue.key == WATERMARK)) or 0
        since = EPOCH + timedelta(microseconds=mark)
        ended = (Workload.finished_at > since, Workload.finished_at <= upto, Workload.kind == "job",
                 Workload.state.in_(TERMINAL))  # fmt: skip
        # A batch ends at a moment, with every job that ended at it: a pass ends many jobs at one `now`.
        last = s.scalar(select(Workload.finished_at).where(*ended).order_by(Workload.finished_at)
                        .offset(BATCH - 1).limit(1))  # fmt: skip
        jobs = s.execute(
            select(Workload.id, Workload.org_id, Workload.user_id, Workload.finished_at)
            .where(*ended, *(() if last is None else (Workload.finished_at <= last,)))
            .order_by(Workload.finished_at)
        ).all()  # fmt: skip
        rows = {
            r.workload_id: r for r in s.scalars(select(Workdir).where(Workdir.workload_id.in_([j.id for j in jobs])))
        }
    counted: list[tuple[str, str, str, workdirs.Unpacked]] = []
    gone: list[str] = []  # uncounted workdirs whose retention was over before anyone looked (`_remove` takes rows)
    measured = 0
    for j in jobs:
        path = workdirs.upload_dir(store.home, j.id)
        if not path.is_dir():
            continue
        if j.finished_at <= now - store.retention:
            if j.id not in rows:
                if any(os.scandir(path)):
                    gone.append(j.id)
                workdirs.remove_tree(path)
            continue
        got = workdirs.measure(path)
        measured += 1
        if got.files == 0 and j.id not in rows:
            workdirs.remove_tree(path)
            continue
        counted.append((j.id, j.org_id, j.user_id, got))
    with db.write() as s, s.begin():
        if gone:
            _removed_events(s, store, now, [(wid, s.get(Workload, wid).state) for wid in gone])  # type: ignore[union-attr]
        for wid, org_id, user_id, got in counted:
            if wid in rows:
                row = s.get(Workdir, rows[wid].id)
                if row is not None:
                    row.bytes, row.files = got.bytes, got.files
            else:
                s.add(Workdir(id=new_id("wd"), org_id=org_id, user_id=user_id, workload_id=wid, bytes=got.bytes,
                              files=got.files, created_at=now, expires_at=None))  # fmt: skip
        if jobs:
            _set_watermark(s, _micros(jobs[-1].finished_at))
    return measured, last is not None


def _set_watermark(s: Session, value: int) -> None:
    row = s.get(KeyValue, WATERMARK, with_for_update=True)
    if row is None:
        s.add(KeyValue(key=WATERMARK, value=value))
    elif value > row.value:
        row.value = value


def _remove(db: Database, store: Store, now: datetime) -> int:
    """Remove a batch of jobs' workdirs whose retention is over, with an event on each job."""
    cutoff = now - store.retention
    with db.read() as s:
        due = s.execute(
            select(Workdir.id, Workload.id, Workload.state).join(Workload, Workload.id == Workdir.workload_id)
            .where(Workload.kind == "job", Workload.state.in_(TERMINAL), Workload.finished_at <= cutoff)
            .limit(BATCH)
        ).all()  # fmt: skip
    if not due:
        return 0
    for _, wid, _ in due:
        workdirs.remove_tree(workdirs.upload_dir(store.home, wid))
    with db.write() as s, s.begin():
        s.execute(delete(Workdir).where(Workdir.id.in_([d for d, _, _ in due])))
        _removed_events(s, store, now, [(wid, state) for _, wid, state in due])
    return len(due)


def _removed_events(s: Session, store: Store, now: datetime, jobs: list[tuple[str, str]]) -> None:
    hours = f"{store.retention.total_seconds() / 3600:g}"
    reason = f"workdir removed: {hours} hours after the job ended (workdir_retention_hours)"
    s.execute(insert(WorkloadEvent), [{"workload_id": wid, "at": now, "state": state, "reason": reason}
                                      for wid, state in jobs])  # fmt: skip

"""Moving files in and out of a volume: who may, how much room is left, and keeping the volume's usage current.

The bytes themselves stream through `storage.volumes` (the API route feeds a `Writer` as the body arrives, and
streams reads out a chunk at a time): nothing is held whole in memory. A copy in is refused past the volume's size
(counted as the quota counts: files in whole 4 KiB blocks), and while the org's balance is exhausted (the volume is
read-only then). Paths are checked by `workloads.volumes.clean_path`; the tree is walked without following links.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from suanli.control.accounts.accounts import Principal
from suanli.control.errors import Invalid, PaymentRequired, ServiceError
from suanli.control.storage import volumes
from suanli.db.engine import Database
from suanli.db.volumes import Volume
from suanli.storage import volume_io as vio
from suanli.storage import volumes as store
from suanli.storage.s3 import S3Backend, S3Config
from suanli.storage.volume_room import Claim
from suanli.workloads import volumes as rules

log = logging.getLogger(__name__)


class InsufficientStorage(ServiceError):
    status = 507


@dataclass(frozen=True)
class Target:
    volume_id: str
    name: str
    paths: store.Paths
    room: int  # bytes a copy in may still add
    org_id: str = ""
    s3: S3Config | None = None  # an s3 volume's backend: every change is pushed to the bucket
    claim: Claim | None = None  # a copy in's bytes, counted against the room of the others at once (`done`)


def clean(path: str, *, allow_root: bool = True) -> str:
    try:
        return rules.clean_path(path, allow_root=allow_root)
    except rules.VolumeRuleError as e:
        raise Invalid(f"path: {e}") from None


def for_read(db: Database, who: Principal, ref: str, org: str | None, lim: volumes.Limits) -> Target:
    with db.read() as s:
        v = volumes.get(s, who, ref, org, volumes.READ)
        return Target(v.id, v.name, volumes.paths(lim, v), 0, v.org_id)


def for_write(
    db: Database, who: Principal, ref: str, org: str | None, lim: volumes.Limits, now: datetime, room: bool = True
) -> Target:
    """The volume, if the caller may write to it and it is writable; what it holds is measured now (workloads
    write to it too) and the room left is its size less that and less what other copies in are writing (none
    left: 507). A copy in (`room`) holds a claim on the room until `done`; a removal (not `room`) holds none."""
    with db.read() as s:
        v = volumes.get(s, who, ref, org, volumes.WRITE)
    if v.state == "full" and room:
        raise InsufficientStorage(f"volume {v.name} holds more than its size; remove files or resize it")
    if v.state == "read-only":
        raise PaymentRequired(f"volume {v.name} is read-only: its organisation's balance is exhausted; top up first")
    p = volumes.paths(lim, v)
    claim = Claim(p, v.size_bytes) if room else None  # registered before the measure: see storage.volume_room
    try:
        return _measured(db, v, p, claim, lim, now)
    except BaseException:
        if claim is not None:
            claim.close()
        raise


def _measured(db: Database, v: Volume, p: store.Paths, claim: Claim | None, lim: volumes.Limits,
              now: datetime) -> Target:  # fmt: skip
    s3 = lim.s3 if v.backend == "s3" else None
    try:
        used = store.measure(p.data)
    except store.TooDeep:
        if claim is not None:
            raise  # a 422 naming the volume: what it holds cannot be counted, so nothing more goes in
        return Target(v.id, v.name, p, 0, v.org_id, s3)  # a removal may go on
    _record(db, v.id, used.bytes, used.files, now)
    room = claim.measured(used.bytes) if claim is not None else v.size_bytes - used.bytes
    if room <= 0 and claim is not None:
        coming = v.size_bytes - used.bytes - room  # what other copies in are writing
        more = f", {coming} more on their way in" if coming > 0 else ""
        raise InsufficientStorage(f"volume {v.name} is full ({used.bytes} of {v.size_bytes} bytes{more}); "
                                  "remove files or resize it")  # fmt: skip
    volumes.s3_of(lim.s3, v)  # an s3 volume on a server without the backend: refused before any byte moves
    return Target(v.id, v.name, p, room, v.org_id, s3, claim)


def done(t: Target) -> None:
    """The copy in has ended (whether or not its bytes landed): its claim stops counting for later copies."""
    if t.claim is not None:
        t.claim.close()


def _record(db: Database, volume_id: str, used: int, files: int, now: datetime) -> None:
    with db.write() as s, s.begin():
        v = s.get(Volume, volume_id, with_for_update=True)
        if v is not None:
            v.used_bytes, v.files, v.measured_at = used, files, now
            if v.state == "full" and used <= v.size_bytes:
                v.state = "ready"


def wrote(db: Database, t: Target, now: datetime) -> store.Usage | None:
    """After a file is in place: the tree measured again, so `ls` and `describe` show its bytes and file count at
    once (a copy in already measures the tree as it starts: this is the second walk of the two)."""
    return remeasure(db, t, now)


def _push(t: Target) -> None:
    if t.s3 is not None:
        S3Backend(t.s3).push(t.paths, t.org_id, t.volume_id)


def remeasure(db: Database, t: Target, now: datetime) -> store.Usage | None:
    """The tree measured and recorded (and an s3 volume pushed) after a change; None, the record left as it was,
    while it is nested too deep to walk: the change is made either way, and the sweep holds such a volume full."""
    try:
        used: store.Usage | None = store.measure(t.paths.data)
    except store.TooDeep:
        used = None
    if used is not None:
        _record(db, t.volume_id, used.bytes, used.files, now)
        _push(t)  # (a tree too deep to walk is pushed once trimmed)
    return used


def room_error(t: Target, e: store.OverSize) -> InsufficientStorage:
    return InsufficientStorage(f"volume {t.name}: {e}; remove files or resize it")


def expire_partial(root: Path) -> int:
    """Drop uploads broken off or held past `vio.PARTIAL_TTL_S`, in every volume of this host; how many."""
    return vio.expire_partial_everywhere(root, time.time())


def measure_mounted(db: Database, root: Path, now: datetime, budget: int = 200, home: Path | None = None) -> int:
    """Measure the volumes live workloads mount writable (they may have written since): each is `full` while it
    holds more than its size, or directories nested too deep to count (`store.TooDeep`), so mounted read-only from
    the next launch and copies in refused, and `ready` again once it holds less. With `home` (the server's data
    directory), the running sandboxes of this host that mount a full volume writable have that mount turned
    read-only at once (`sandbox.readonly`). Returns how many were measured."""
    from sqlalchemy import select

    from suanli.db.models import Workload

    wanted: dict[tuple[str, str], list[tuple[str, int, str, str]]] = {}  # volume -> (workload, attempt, executor, path)
    with db.read() as s:
        q = select(Workload.id, Workload.attempt, Workload.executor, Workload.state, Workload.org_id, Workload.spec)
        for wid, attempt, executor, state, org_id, spec in s.execute(q.where(Workload.state.in_(volumes.ACTIVE))):
            for m in (spec or {}).get("volumes") or ():
                name = str(m.get("name", ""))
                if "@" not in name and not m.get("read_only"):
                    where = wanted.setdefault((org_id, name), [])
                    if state == "running" and executor == "local":
                        where.append((wid, attempt, executor, str(m.get("path"))))
        rows = [v for v in s.scalars(select(Volume).where(Volume.org_id.in_({o for o, _ in wanted})))
                if (v.org_id, v.name) in wanted][:budget]  # fmt: skip
    for v in rows:
        try:
            used: store.Usage | None = store.measure(volumes.paths(root, v).data)
        except store.TooDeep:  # what it holds cannot be counted: treated as more than its size
            used = None
        with db.write() as s, s.begin():
            row = s.get(Volume, v.id, with_for_update=True)
            if row is None:
                continue
            over = used is None or used.bytes > row.size_bytes
            if used is not None:
                row.used_bytes, row.files = used.bytes, used.files
            row.measured_at = now
            if row.state == "ready" and over:
                row.state = "full"
            elif row.state == "full" and not over:
                row.state = "ready"
            full = row.state == "full"
        if full and home is not None:
            _read_only_now(home, wanted[(v.org_id, v.name)])
    return len(rows)


def _read_only_now(home: Path, running: list[tuple[str, int, str, str]]) -> None:
    from suanli.sandbox.readonly import remount_read_only
    from suanli.storage import workdirs

    for wid, attempt, _, dest in running:
        for box in workdirs.log_dir(home, wid, attempt).glob("rank-*.sandbox.json"):
            remount_read_only(box, dest)


def push_idle(db: Database, root: Path, s3: S3Config | None, budget: int = 100) -> int:
    """Push the s3 volumes no live workload mounts writable (what a stopped workload wrote reaches the bucket
    within a sweep). Returns how many were pushed."""
    if s3 is None:
        return 0
    from sqlalchemy import select

    from suanli.db.models import Workload

    busy: set[tuple[str, str]] = set()
    with db.read() as s:
        for org_id, spec in s.execute(select(Workload.org_id, Workload.spec).where(Workload.state.in_(volumes.ACTIVE))):
            for m in (spec or {}).get("volumes") or ():
                if "@" not in str(m.get("name", "")) and not m.get("read_only"):
                    busy.add((org_id, str(m.get("name"))))
        rows = [v for v in s.scalars(select(Volume).where(Volume.backend == "s3").limit(budget))
                if (v.org_id, v.name) not in busy]  # fmt: skip
    backend = S3Backend(s3)
    for v in rows:
        try:
            backend.push(volumes.paths(root, v), v.org_id, v.id)
        except store.TooDeep:  # a workload nested it too deep to walk: pushed once trimmed
            continue
        except Exception:  # one volume's trouble (a tree, the bucket) must not stop the others' pushes
            log.exception("volume %s: push to the bucket failed", v.id)
    return len(rows)

"""Persistent volumes of an org: create, list, resize, remove, versions (snapshot, restore, clone, diff), who may do
what, and which workloads mount them.

Who may do what, by the caller's role in the volume's org (`control.accounts.memberships`):
  read   (every role, viewers too): list, describe, versions, diff, `ls`, copy out, mount read-only
  write  (`submit`: members, admins, owners): copy in, remove files, mount read-write; create and resize also
         spend the org's money (`spend`)
  manage (`others`: admins and owners): snapshot, restore, clone, remove the volume
Operators may do everything. Another org's volume does not exist for the caller (404, as its workloads).
Files are moved in and out by `control.storage.volume_files`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from suanli.control.accounts import memberships, spend_limits
from suanli.control.accounts.accounts import Principal
from suanli.control.errors import Conflict, Invalid, NotFound, PaymentRequired
from suanli.control.ids import new_id
from suanli.control.money import prices
from suanli.control.settings import Settings
from suanli.control.storage import volume_billing
from suanli.db.engine import Database
from suanli.db.models import Org, Workload
from suanli.db.volumes import Volume, VolumeVersion
from suanli.storage import volume_io
from suanli.storage import volume_room as room
from suanli.storage import volume_versions as versions_store
from suanli.storage import volumes as store
from suanli.storage.s3 import S3Backend, S3Config
from suanli.workloads import volumes as rules

ACTIVE = ("pending", "scheduled", "starting", "running")
READ, WRITE, MANAGE = ("read",), ("submit",), ("others",)
MAX_MESSAGE = 200


@dataclass(frozen=True)
class Limits:
    root: Path
    max_bytes: int
    per_org: int
    max_files: int
    s3: S3Config | None = None  # the S3 backend, where the operator set one up
    bytes_per_org: int = 10 << 40  # all of an org's volumes' sizes together
    snapshot_bytes_per_org: int = 10 << 40  # all of an org's versions' content together

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(settings.volumes_root, settings.volume_max_bytes, settings.volumes_per_org,
                   settings.volume_max_files, settings.volume_s3(), settings.volume_bytes_per_org,
                   settings.volume_snapshot_bytes_per_org)  # fmt: skip


def s3_of(s3: S3Config | None, v: Volume) -> S3Backend | None:
    """The S3 backend of an s3 volume (None for a local one)."""
    if v.backend != "s3":
        return None
    if s3 is None:
        raise Conflict(f"volume {v.name} is on S3, and this server has no S3 backend (volume_s3_bucket)")
    return S3Backend(s3)


def push(s3: S3Config | None, root: Path, v: Volume) -> None:
    backend = s3_of(s3, v)
    if backend is not None:
        backend.push(paths(root, v), v.org_id, v.id)


def paths(lim: Limits | Path, v: Volume) -> store.Paths:
    return store.paths(lim.root if isinstance(lim, Limits) else lim, v.org_id, v.id, v.org_uid)


def _invalid(field: str, e: rules.VolumeRuleError) -> Invalid:
    return Invalid(f"{field}: {e}")


def org_of(s: Session, who: Principal, org: str | None) -> str:
    """The org named by id or name (default: the caller's personal org), if the caller is in it (404 if not)."""
    if org is None or org == who.personal_org_id:
        return who.personal_org_id
    found = s.get(Org, org) or s.scalar(select(Org).where(Org.name == org))
    if found is None:
        raise NotFound(f"organisation {org} not found")
    memberships.access(s, who, found.id)
    return found.id


def get(
    s: Session, who: Principal, ref: str, org: str | None, rights: tuple[str, ...], *, lock: bool = False
) -> Volume:
    """A volume by id (`vol_…`) or by name in `org`, if the caller's role there has `rights`."""
    if ref.startswith("vol_"):
        v = s.get(Volume, ref, with_for_update=lock)
    else:
        try:
            rules.check_name(ref)
        except rules.VolumeRuleError as e:
            raise _invalid("volume", e) from None
        org_id = org_of(s, who, org)
        q = select(Volume).where(Volume.org_id == org_id, Volume.name == ref)
        v = s.scalar(q.with_for_update() if lock else q)
    if v is None:
        raise NotFound(f"volume {ref} not found")
    try:
        memberships.require(s, who, v.org_id, *rights)
    except NotFound:
        raise NotFound(f"volume {ref} not found") from None
    return v


def listing(s: Session, who: Principal, org: str | None) -> list[Volume]:
    if org is not None:
        org_ids = [org_of(s, who, org)]
    else:
        from suanli.db.models import Membership

        org_ids = list(s.scalars(select(Membership.org_id).where(Membership.user_id == who.user_id)))
    return list(s.scalars(select(Volume).where(Volume.org_id.in_(org_ids)).order_by(Volume.org_id, Volume.name)))


def create(s: Session, who: Principal, name: str, size: object, org: str | None, backend: str, lim: Limits,
           now: datetime) -> Volume:  # fmt: skip
    try:
        rules.check_name(name)
    except rules.VolumeRuleError as e:
        raise _invalid("name", e) from None
    nbytes = _size(size, lim)
    if backend not in rules.BACKENDS:
        raise Invalid(f"backend: one of {', '.join(rules.BACKENDS)}")
    if backend == "s3" and lim.s3 is None:
        raise Invalid("backend: s3 is not configured on this server (the operator sets volume_s3_bucket); use local")
    org_id = org_of(s, who, org)
    memberships.require(s, who, org_id, "submit", "spend")
    s.get(Org, org_id, with_for_update=True)  # an org's volumes are counted one creation at a time
    count = s.scalar(select(func.count()).select_from(Volume).where(Volume.org_id == org_id)) or 0
    if count >= lim.per_org:
        raise Conflict(f"name: the organisation has {count} volumes, the most it may have (volumes_per_org)")
    _may_allocate(s, org_id, nbytes, lim)
    _within_spend_limit(s, who, org_id, nbytes, now)
    if s.scalar(select(Volume.id).where(Volume.org_id == org_id, Volume.name == name)) is not None:
        raise Conflict(f"name: a volume called {name} exists already in this organisation")
    v = Volume(id=new_id("vol"), org_id=org_id, name=name, backend=backend, size_bytes=nbytes, used_bytes=0, files=0,
               snapshot_bytes=0, last_version=0, state="ready", created_by=who.user_id, created_at=now,
               measured_at=now, billed_until=now)  # fmt: skip
    s.add(v)
    s.flush()
    store.create(paths(lim, v))
    return v


def _size(size: object, lim: Limits) -> int:
    try:
        n = rules.parse_size(size)
    except rules.VolumeRuleError as e:
        raise _invalid("size", e) from None
    if n > lim.max_bytes:
        raise Invalid(f"size: at most {rules.format_size(lim.max_bytes)} on this server (volume_max_bytes)")
    return n


def _may_allocate(s: Session, org_id: str, nbytes: int, lim: Limits, volume_id: str | None = None) -> None:
    """An org allocates only while its balance is above zero (storage is billed by the hour; otherwise every empty
    team org a tenant makes would bring its own bound), and at most `bytes_per_org` over all its volumes (the
    org's row is locked by the caller: concurrent requests are counted one at a time)."""
    from suanli.control.money import ledger

    balance = ledger.org_balance(s, org_id)
    if balance <= 0:
        raise PaymentRequired(f"org: the organisation's balance is {balance}; volumes are billed by the hour: "
                              "top up first")  # fmt: skip
    q = select(func.coalesce(func.sum(Volume.size_bytes), 0)).where(Volume.org_id == org_id)
    if volume_id is not None:
        q = q.where(Volume.id != volume_id)
    others = int(s.scalar(q) or 0)
    if others + nbytes > lim.bytes_per_org:
        raise Conflict(f"size: the organisation's volumes would have {rules.format_size(others + nbytes)} "
                       f"allocated, more than the {rules.format_size(lim.bytes_per_org)} it may have "
                       f"(volume_bytes_per_org; {rules.format_size(others)} allocated now)")  # fmt: skip


def _within_spend_limit(s: Session, who: Principal, org_id: str, added: int, now: datetime) -> None:
    """A member with a monthly spend limit allocates only what an hour of it leaves within the limit (403 naming
    `monthly_spend_limit`): storage is charged to whoever made the volume, by the hour, for as long as it stays.
    Before, a member with a limit of 0 made a 1 TiB volume and spent the org's money on it every hour."""
    a = memberships.access(s, who, org_id)
    if a.spend_limit is not None:
        spend_limits.check_spend(s, who, a, now, price=prices.current(s)[1].storage_cost(added))


def resize(s: Session, who: Principal, ref: str, org: str | None, size: object, lim: Limits, now: datetime) -> Volume:
    v = get(s, who, ref, org, ("submit", "spend"), lock=True)
    n = _size(size, lim)
    if n > v.size_bytes:
        s.get(Org, v.org_id, with_for_update=True)
        _may_allocate(s, v.org_id, n, lim, v.id)
        _within_spend_limit(s, who, v.org_id, n - v.size_bytes, now)
    p = paths(lim, v)
    used = store.measure(p.data)
    v.used_bytes, v.files, v.measured_at = used.bytes, used.files, now
    if n < used.bytes:
        raise Conflict(f"size: {v.name} holds {used.bytes} bytes; it cannot shrink below that (remove files first)")
    if n < v.size_bytes:
        volume_billing.charge_begun(s, v, now)
    v.size_bytes = n
    if v.state == "full":
        v.state = "ready"
    s.flush()  # the row's writes done: what can still fail here is the size check below, or the commit
    try:  # the copies under way and to come see the new size; uploads held or arriving count against a shrink
        room.resize(p, n, lambda: store.measure(p.data).bytes + volume_io.waiting_bytes(p))
    except store.OverSize as e:
        raise Conflict(f"size: {v.name} cannot shrink to {n} bytes: {e}; wait for them, or remove some") from None
    return v


def mounted_by(s: Session, v: Volume) -> list[str]:
    """Names of the org's live workloads whose spec mounts the volume or one of its versions."""
    rows = s.execute(select(Workload.name, Workload.spec).where(Workload.org_id == v.org_id,
                                                                Workload.state.in_(ACTIVE)))  # fmt: skip
    out = []
    for name, spec in rows:
        for m in (spec or {}).get("volumes") or ():
            if str(m.get("name", "")).partition("@")[0] == v.name:
                out.append(name)
                break
    return sorted(out)


def _refuse_mounted(s: Session, v: Volume, what: str) -> None:
    names = mounted_by(s, v)
    if names:
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        raise Conflict(f"volume {v.name} is mounted by {shown}; stop them before you {what} it")


def remove(s: Session, who: Principal, ref: str, org: str | None, lim: Limits, now: datetime) -> Volume:
    v = get(s, who, ref, org, MANAGE, lock=True)
    _refuse_mounted(s, v, "remove")
    volume_billing.charge_begun(s, v, now)
    s.execute(delete(VolumeVersion).where(VolumeVersion.volume_id == v.id))
    s.delete(v)
    s.flush()
    return v


def destroy_files(lim: Limits, v: Volume) -> None:
    """After the removal committed: the tree, its versions, blobs nothing else links to (and its objects)."""
    backend = s3_of(lim.s3, v)
    if backend is not None:
        backend.destroy(v.org_id, v.id)
    versions_store.destroy(paths(lim, v))


# ---- versions --------------------------------------------------------------------------------------------------------
def snapshot(db: Database, who: Principal, ref: str, org: str | None, message: str, lim: Limits,
             now: datetime) -> VolumeVersion:  # fmt: skip
    """The number is taken in one short transaction and the row written in another: the files are walked and
    copied between them, holding no lock (a snapshot that fails leaves its number unused)."""
    if len(message) > MAX_MESSAGE or "\0" in message:
        raise Invalid(f"message: at most {MAX_MESSAGE} characters, no NUL")
    with db.read() as s:
        p = paths(lim, get(s, who, ref, org, MANAGE))
    with versions_store.one_at_a_time(p):  # the org's snapshots: each counted before the next checks its room
        with db.write() as s, s.begin():
            v = get(s, who, ref, org, MANAGE, lock=True)
            left = _may_snapshot(s, v, lim)
            v.last_version += 1
            number, vid = v.last_version, v.id
        try:
            got = versions_store.snapshot(p, number, most=left)
        except FileNotFoundError:  # its tree went with a removal under way
            raise NotFound(f"volume {ref} was removed meanwhile") from None
        except store.OverSize as e:  # files written after the check: what the version would add is over the room
            raise Conflict(f"version: {e} (volume_snapshot_bytes_per_org); remove files, or versions you no longer "
                           "need, and snapshot again") from None  # fmt: skip
        with db.write() as s, s.begin():
            v2 = s.get(Volume, vid, with_for_update=True)
            if v2 is None:  # removed while the snapshot ran: its files go with the removal, which waited for it
                raise NotFound(f"volume {ref} was removed meanwhile")
            row = VolumeVersion(volume_id=vid, number=number, message=message, bytes=got.bytes, files=got.files,
                                added_bytes=got.added_bytes, created_by=who.user_id, created_at=now)  # fmt: skip
            s.add(row)
            v2.snapshot_bytes += got.added_bytes
    return row


def _may_snapshot(s: Session, v: Volume, lim: Limits) -> int:
    """Versions hold disk too: a snapshot is taken while the volume's org pays (balance above zero, the volume not
    read-only) and while its versions, with at most the live tree's bytes more, stay within
    `snapshot_bytes_per_org`. Returns the bytes they have left, the most this version may add (files written after
    this check count too)."""
    from suanli.control.money import ledger

    if v.state == "read-only":
        raise PaymentRequired(f"volume {v.name} is read-only: its organisation's balance ran out; top up first")
    s.get(Org, v.org_id, with_for_update=True)
    balance = ledger.org_balance(s, v.org_id)
    if balance <= 0:
        raise PaymentRequired(f"org: the organisation's balance is {balance}; versions are billed by the hour: "
                              "top up first")  # fmt: skip
    held = int(s.scalar(select(func.coalesce(func.sum(Volume.snapshot_bytes), 0)).where(Volume.org_id == v.org_id))
               or 0)  # fmt: skip
    if held + v.used_bytes > lim.snapshot_bytes_per_org:
        raise Conflict(f"version: the organisation's versions hold {rules.format_size(held)}, and this one may add "
                       f"up to {rules.format_size(v.used_bytes)}: more than the "
                       f"{rules.format_size(lim.snapshot_bytes_per_org)} they may hold (volume_snapshot_bytes_per_org); "
                       "remove a volume whose versions you no longer need")  # fmt: skip
    return lim.snapshot_bytes_per_org - held


def versions(s: Session, who: Principal, ref: str, org: str | None) -> tuple[Volume, list[VolumeVersion]]:
    v = get(s, who, ref, org, READ)
    rows = s.scalars(select(VolumeVersion).where(VolumeVersion.volume_id == v.id).order_by(VolumeVersion.number))
    return v, list(rows)


def _version(s: Session, v: Volume, number: int, field: str = "version") -> VolumeVersion:
    row = s.get(VolumeVersion, (v.id, number)) if 1 <= number <= rules.MAX_VERSION else None
    if row is None:
        raise NotFound(f"{field}: {v.name} has no version {number}")
    return row


def restore(db: Database, who: Principal, ref: str, org: str | None, number: int, lim: Limits,
            now: datetime) -> Volume:  # fmt: skip
    """The live tree becomes a copy of version `number`; refused while a live workload mounts the volume."""
    with db.read() as s:
        v = get(s, who, ref, org, MANAGE)
        _version(s, v, number)
        if v.state == "read-only":
            raise PaymentRequired(f"volume {v.name} is read-only: its organisation's balance is exhausted")
        _refuse_mounted(s, v, "restore")
        p = paths(lim, v)
    try:
        got = versions_store.materialise(p, number, p, limit=v.size_bytes)
    except store.OverSize as e:
        raise Conflict(f"version: {v.name}@{number}: {e}; resize the volume first") from None
    with db.write() as s, s.begin():
        row = s.get(Volume, v.id, with_for_update=True)
        if row is None:
            raise NotFound(f"volume {ref} not found")
        row.used_bytes, row.files, row.measured_at = got.bytes, got.files, now
    push(lim.s3, lim.root, row)
    return row


def clone(db: Database, who: Principal, ref: str, org: str | None, number: int, name: str, lim: Limits,
          now: datetime) -> Volume:  # fmt: skip
    """A new volume of the same org and size whose live tree is a copy of version `number` (its blobs shared)."""
    with db.write() as s, s.begin():
        src = get(s, who, ref, org, MANAGE)
        _version(s, src, number)
        need = versions_store.blocks_of(versions_store.manifest(paths(lim, src), number))
        if need > src.size_bytes:
            raise Conflict(f"version: {src.name}@{number} takes {need} bytes, more than the volume's size")
        new = create(s, who, name, src.size_bytes, src.org_id, src.backend, lim, now)
        src_paths, new_id_ = paths(lim, src), new.id
    try:
        got = versions_store.materialise(src_paths, number, paths(lim, new))
    except BaseException:
        with db.write() as s, s.begin():
            gone = s.get(Volume, new_id_)
            if gone is not None:
                s.delete(gone)
        versions_store.destroy(paths(lim, new))
        raise
    with db.write() as s, s.begin():
        row = s.get(Volume, new_id_, with_for_update=True)
        assert row is not None
        row.used_bytes, row.files = got.bytes, got.files
    push(lim.s3, lim.root, row)
    return row


def diff(s: Session, who: Principal, ref: str, org: str | None, a: int, b: int, lim: Limits) -> rules.Diff:
    v = get(s, who, ref, org, READ)
    _version(s, v, a, "from")
    _version(s, v, b, "to")
    p = paths(lim, v)
    try:
        old, new = versions_store.manifest(p, a), versions_store.manifest(p, b)
    except versions_store.VersionError as e:
        raise NotFound(f"version: {e}") from None
    return rules.diff(versions_store.files_of(old), versions_store.files_of(new))


# ---- mounting ------------------------------------------------------------------------------------------------------
def check_spec_mounts(s: Session, who: Principal, org_id: str, mounts: tuple[rules.VolumeMount, ...]) -> None:
    """At submission: each named volume (and version) exists in the workload's org, and the caller's role may
    mount it as asked (a viewer cannot submit at all; writing needs `submit`)."""
    for i, m in enumerate(mounts):
        ref = m.ref
        v = s.scalar(select(Volume).where(Volume.org_id == org_id, Volume.name == ref.name))
        if v is None:
            raise NotFound(f"volumes.{i}.name: no volume called {ref.name} in this organisation")
        if ref.version is not None and s.get(VolumeVersion, (v.id, ref.version)) is None:
            raise NotFound(f"volumes.{i}.name: {ref.name} has no version {ref.version}")
        memberships.require(s, who, org_id, *(WRITE if m.writable else READ))


@dataclass(frozen=True)
class HostMount:
    source: str
    dest: str
    writable: bool
    note: str = ""  # why a mount asked writable is read-only


def host_mounts(s: Session, root: Path, org_id: str, mounts: tuple[rules.VolumeMount, ...]) -> list[HostMount]:
    """At launch: the host directories of a workload's volumes (a version's tree, read-only). A volume of an org
    whose money ran out (`read-only`) or over its size (`full`) is bound read-only, with a note for the events."""
    out = []
    for m in mounts:
        ref = m.ref
        v = s.scalar(select(Volume).where(Volume.org_id == org_id, Volume.name == ref.name))
        if v is None:
            raise store.VolumeFileError(f"volume {ref.name} no longer exists")
        p = paths(root, v)
        if ref.version is not None:
            out.append(HostMount(str(versions_store.tree(p, ref.version)), m.path, False))
            continue
        writable, note = m.writable, ""
        if writable and v.state != "ready":
            writable = False
            note = f"volume {v.name} is mounted read-only: " + (
                "its organisation's balance is exhausted" if v.state == "read-only" else "it is over its size"
            )
        out.append(HostMount(str(p.data), m.path, writable, note))
    return out

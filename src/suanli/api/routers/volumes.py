"""Volumes: create, list, describe, resize, remove; versions (snapshot, restore, clone, diff). Files: `volume_files`.

A volume is named by its id (`vol_…`) or by its name in `org` (default: the caller's personal org)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi import Path as PathParam
from pydantic import Field

from suanli.api.deps import Auth, in_thread
from suanli.api.schemas import In, Out, UtcTime, money
from suanli.api.strict_json import StrictJSONRoute
from suanli.billing.prices import PriceBook
from suanli.control.accounts import accounts
from suanli.control.errors import Invalid
from suanli.control.storage import volume_billing, volumes
from suanli.control.storage.volume_billing import hourly_cost
from suanli.db.volumes import Volume
from suanli.storage.archive import shown
from suanli.workloads import volumes as rules
from suanli.workloads.volumes import MAX_VERSION

router = APIRouter(route_class=StrictJSONRoute, tags=["volumes"])
OrgQ = Annotated[str | None, Query(max_length=128, description="org id or name; default: your personal org")]
Version = Annotated[int, Field(ge=1, le=MAX_VERSION)]
Ref = Annotated[str, PathParam(alias="volume", max_length=64, description="the volume's id, or its name in `org`")]


class VolumeIn(In):
    name: str = Field(max_length=63, description="lower-case letters, digits and '-', starting with a letter")
    size: str | int = Field(description="its limit and what is billed: 200Gi, 500G or bytes")
    org: str | None = Field(None, max_length=128, description="org id or name; default: your personal org")
    backend: str = Field("local", max_length=8, description="local (default) or s3")


class ResizeIn(In):
    size: str | int


class SnapshotIn(In):
    message: str = Field("", max_length=200)


class RestoreIn(In):
    version: Version


class CloneIn(In):
    version: Version
    name: str = Field(max_length=63)


class VolumeOut(Out):
    id: str
    org_id: str
    name: str
    backend: str
    size_bytes: int = Field(description="the limit: writes past it fail; billed per GB-month")
    used_bytes: int = Field(description="the live tree as last measured (files in whole 4 KiB blocks)")
    files: int
    snapshot_bytes: int = Field(description="the content its versions hold, each once (billed as well)")
    last_version: int
    state: str = Field(description="ready; read-only (its org's balance is exhausted); full (over its size)")
    created_at: datetime
    measured_at: datetime | None
    mounted_by: list[str] = Field(default_factory=list, description="live workloads that mount it")
    price_per_hour: str = Field("0", description="what it costs an hour now (size + versions' bytes), exact")


class VersionOut(Out):
    volume_id: str
    number: int
    message: str
    bytes: int
    files: int
    added_bytes: int = Field(
        description="content none of the volume's earlier versions held (what it adds to the bill)"
    )
    created_at: datetime


class DiffOut(Out):
    added: list[str]
    removed: list[str]
    changed: list[str]


def _out(v: Volume, mounted: list[str] | None = None, book: PriceBook | None = None) -> VolumeOut:
    price = money(hourly_cost(v, book)) if book is not None else "0"
    return VolumeOut.model_validate(v).model_copy(update={"mounted_by": mounted or [], "price_per_hour": price})


@router.post("/volumes", status_code=201)
@in_thread
def create_volume(body: VolumeIn, ctx: Auth) -> VolumeOut:
    """A volume of `size` (its limit) in `org`; the caller's role there must let them submit and spend."""
    lim = volumes.Limits.of(ctx.srv.settings)
    with ctx.db.write() as s, s.begin():
        v = volumes.create(s, ctx.who, body.name, body.size, body.org, body.backend, lim, ctx.now)
        return _out(v, book=ctx.srv.prices.current(s)[1])  # what it costs: a new volume is not free


@router.get("/volumes")
@in_thread
def list_volumes(ctx: Auth, org: OrgQ = None) -> list[VolumeOut]:
    """The volumes of `org`, or of every org the caller is a member of."""
    with ctx.db.read() as s:
        _, book = ctx.srv.prices.current(s)
        return [_out(v, book=book) for v in volumes.listing(s, ctx.who, org)]


@router.get("/volumes/{volume}")
@in_thread
def get_volume(ref: Ref, ctx: Auth, org: OrgQ = None) -> VolumeOut:
    with ctx.db.read() as s:
        v = volumes.get(s, ctx.who, ref, org, volumes.READ)
        return _out(v, volumes.mounted_by(s, v), ctx.srv.prices.current(s)[1])


@router.patch("/volumes/{volume}")
@in_thread
def resize_volume(ref: Ref, body: ResizeIn, ctx: Auth, org: OrgQ = None) -> VolumeOut:
    """A new size (larger, or smaller down to what it holds)."""
    lim = volumes.Limits.of(ctx.srv.settings)
    with ctx.db.write() as s, s.begin():
        v = volumes.resize(s, ctx.who, ref, org, body.size, lim, ctx.now)
        return _out(v, volumes.mounted_by(s, v), ctx.srv.prices.current(s)[1])


@router.delete("/volumes/{volume}", status_code=204)
@in_thread
def remove_volume(ref: Ref, ctx: Auth, org: OrgQ = None) -> Response:
    """Remove it with every version (owners and admins); 409 naming the live workloads that mount it."""
    lim = volumes.Limits.of(ctx.srv.settings)
    with ctx.db.write() as s, s.begin():
        v = volumes.remove(s, ctx.who, ref, org, lim, ctx.now)
    volumes.destroy_files(lim, v)
    return Response(status_code=204)


@router.post("/volumes/{volume}/versions", status_code=201)
@in_thread
def snapshot(ref: Ref, body: SnapshotIn, ctx: Auth, org: OrgQ = None) -> VersionOut:
    """A new version of what the volume holds now (mounted or not): unchanged files are not copied again."""
    lim = volumes.Limits.of(ctx.srv.settings)
    return VersionOut.model_validate(volumes.snapshot(ctx.db, ctx.who, ref, org, body.message, lim, ctx.now))


@router.get("/volumes/{volume}/versions")
@in_thread
def list_versions(ref: Ref, ctx: Auth, org: OrgQ = None) -> list[VersionOut]:
    with ctx.db.read() as s:
        _, rows = volumes.versions(s, ctx.who, ref, org)
        return [VersionOut.model_validate(r) for r in rows]


@router.post("/volumes/{volume}/restore")
@in_thread
def restore(ref: Ref, body: RestoreIn, ctx: Auth, org: OrgQ = None) -> VolumeOut:
    """The live tree becomes version `version` again (409 while a live workload mounts the volume)."""
    lim = volumes.Limits.of(ctx.srv.settings)
    return _out(volumes.restore(ctx.db, ctx.who, ref, org, body.version, lim, ctx.now))


@router.post("/volumes/{volume}/clone", status_code=201)
@in_thread
def clone(ref: Ref, body: CloneIn, ctx: Auth, org: OrgQ = None) -> VolumeOut:
    """A new volume `name` in the same org whose files are version `version`'s."""
    lim = volumes.Limits.of(ctx.srv.settings)
    return _out(volumes.clone(ctx.db, ctx.who, ref, org, body.version, body.name, lim, ctx.now))


@router.get("/volumes/{volume}/diff")
@in_thread
def diff(
    ref: Ref,
    ctx: Auth,
    a: Annotated[int, Query(ge=1, le=MAX_VERSION, alias="from")],
    b: Annotated[int, Query(ge=1, le=MAX_VERSION, alias="to")],
    org: OrgQ = None,
) -> DiffOut:
    """Files added, removed and changed (by content) from version `from` to version `to`."""
    lim = volumes.Limits.of(ctx.srv.settings)
    with ctx.db.read() as s:
        d = volumes.diff(s, ctx.who, ref, org, a, b, lim)
    return DiffOut(added=[shown(n) for n in d.added], removed=[shown(n) for n in d.removed],
                   changed=[shown(n) for n in d.changed])  # fmt: skip


# ---- storage in usage statements and quotes -------------------------------------------------------------------------
class StorageUsageOut(Out):
    volume_id: str
    volume: str = Field(description="its name (of a removed volume: as its last charge named it)")
    hours: int = Field(description="hours charged that start in the period")
    cost: str = Field(description="what the ledger took for them, exact")
    first_hour: datetime
    last_hour: datetime
    size_bytes: int | None = Field(description="its size now; null once removed")
    price_per_hour: str | None = Field(description="what an hour costs now (size + versions' bytes); null once removed")


@router.get("/orgs/{org_id}/usage/storage")
@in_thread
def storage_usage(
    org_id: str, ctx: Auth,
    since: Annotated[UtcTime | None, Query(description="hours from this one on (UTC if no zone)")] = None,
    until: Annotated[UtcTime | None, Query(description="hours before this one (UTC if no zone)")] = None,
) -> list[StorageUsageOut]:  # fmt: skip
    """The org's volume storage charges, one line per volume (removed ones too), most expensive first. Members
    and operators only."""
    with ctx.db.read() as s:
        accounts.org_for(s, ctx.who, org_id)
        rows = volume_billing.usage(s, org_id, since, until)
    return [StorageUsageOut.model_validate({**r, "cost": money(r["cost"]), "price_per_hour": None
                                            if r["price_per_hour"] is None else money(r["price_per_hour"])})
            for r in rows]  # fmt: skip


class StorageQuoteIn(In):
    size: str | int = Field(description="allocated: 200Gi, 500G or bytes (a volume's size plus its versions' bytes)")
    hours: int = Field(720, ge=1, le=24 * 366 * 10, description="how long (default 720: the month prices are per)")


class StorageQuoteOut(Out):
    bytes: int
    hours: int
    storage_gb_month: str = Field(description="the price book's price per GB (10^9 bytes) and month (720 h)")
    per_hour: str = Field(description="what one hour is charged, exact to 1e-8 (as the hourly meter charges it)")
    cost: str = Field(description="per_hour x hours")
    currency: str


@router.post("/quotes/storage")
@in_thread
def quote_storage(body: StorageQuoteIn, ctx: Auth) -> StorageQuoteOut:
    """What volume storage of `size` costs for `hours`, from the price book in force."""
    try:
        nbytes = rules.parse_size(body.size)
    except rules.VolumeRuleError as e:
        raise Invalid(f"size: {e}") from None
    with ctx.db.read() as s:
        _, book = ctx.srv.prices.current(s)
    q = volume_billing.quote(book, nbytes, body.hours)
    return StorageQuoteOut.model_validate({**q, "storage_gb_month": money(q["storage_gb_month"]),
                                           "per_hour": money(q["per_hour"]), "cost": money(q["cost"])})  # fmt: skip

"""The SDK's calls for volumes: create, list, resize, remove, versions, storage charges; copying files in and out is
`client.volume_copy`'s. A mixin of `suanli.client.Client`."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from suanli.client.models import load
from suanli.client.requests import _seg
from suanli.client.volume_copy import VolumeCopyCalls, _q

if TYPE_CHECKING:
    import httpx


@dataclass(frozen=True)
class Volume:
    id: str
    org_id: str
    name: str
    backend: str
    size_bytes: int
    used_bytes: int
    files: int
    snapshot_bytes: int
    last_version: int
    state: str
    created_at: datetime
    measured_at: datetime | None = None
    mounted_by: list[str] = field(default_factory=list)
    price_per_hour: str = "0"


@dataclass(frozen=True)
class VolumeVersion:
    volume_id: str
    number: int
    message: str
    bytes: int
    files: int
    added_bytes: int
    created_at: datetime


@dataclass(frozen=True)
class VolumeEntry:
    name: str
    kind: str
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class VolumeDiff:
    added: list[str]
    removed: list[str]
    changed: list[str]


@dataclass(frozen=True)
class StorageUsage:
    volume_id: str
    volume: str
    hours: int
    cost: Decimal
    first_hour: datetime
    last_hour: datetime
    size_bytes: int | None = None  # None once removed
    price_per_hour: Decimal | None = None


@dataclass(frozen=True)
class StorageQuote:
    bytes: int
    hours: int
    storage_gb_month: Decimal
    per_hour: Decimal
    cost: Decimal
    currency: str


class VolumeCalls(VolumeCopyCalls):
    if TYPE_CHECKING:  # provided by `Client`
        token: str | None
        server: str
        _http: httpx.Client

        def call(self, method: str, path: str, body: Any = None, *, params: Any = None, auth: bool = True) -> Any: ...
        def _org_id(self, org_id: str | None) -> str: ...
        def request(self, method: str, path: str, **kw: Any) -> httpx.Response: ...

    # ---- volumes ----
    def volumes(self, org: str | None = None) -> list[Volume]:
        """The volumes of `org` (id or name), or of every org you are a member of."""
        return [load(Volume, v) for v in self.call("GET", "/volumes", params=_q(org))]

    def volume(self, ref: str, org: str | None = None) -> Volume:
        """A volume by id, or by name in `org` (default: your personal org); `mounted_by` names live workloads."""
        return load(Volume, self.call("GET", f"/volumes/{_seg(ref)}", params=_q(org)))

    def volume_create(self, name: str, size: str | int, org: str | None = None, backend: str = "local") -> Volume:
        """A volume whose `size` (200Gi, 500G, bytes) is its limit and what is billed."""
        body = {"name": name, "size": size, "org": org, "backend": backend}
        return load(Volume, self.call("POST", "/volumes", body))

    def volume_resize(self, ref: str, size: str | int, org: str | None = None) -> Volume:
        return load(Volume, self.call("PATCH", f"/volumes/{_seg(ref)}", {"size": size}, params=_q(org)))

    def volume_remove(self, ref: str, org: str | None = None) -> None:
        """Remove it and every version (owners and admins); refused while a live workload mounts it."""
        self.request("DELETE", f"/volumes/{_seg(ref)}", params=_q(org))

    def volume_snapshot(self, ref: str, message: str = "", org: str | None = None) -> VolumeVersion:
        return load(VolumeVersion, self.call("POST", f"/volumes/{_seg(ref)}/versions", {"message": message},
                                             params=_q(org)))  # fmt: skip

    def volume_versions(self, ref: str, org: str | None = None) -> list[VolumeVersion]:
        return [load(VolumeVersion, v) for v in self.call("GET", f"/volumes/{_seg(ref)}/versions", params=_q(org))]

    def volume_restore(self, ref: str, version: int, org: str | None = None) -> Volume:
        return load(Volume, self.call("POST", f"/volumes/{_seg(ref)}/restore", {"version": version}, params=_q(org)))

    def volume_clone(self, ref: str, version: int, name: str, org: str | None = None) -> Volume:
        body = {"version": version, "name": name}
        return load(Volume, self.call("POST", f"/volumes/{_seg(ref)}/clone", body, params=_q(org)))

    def volume_diff(self, ref: str, a: int, b: int, org: str | None = None) -> VolumeDiff:
        return load(VolumeDiff, self.call("GET", f"/volumes/{_seg(ref)}/diff", params=_q(org, **{"from": a, "to": b})))

    def volume_ls(self, ref: str, path: str = "", org: str | None = None) -> list[VolumeEntry]:
        """Every entry of a directory of the volume, by name (fetched a page at a time)."""
        out: list[VolumeEntry] = []
        after = ""
        while True:
            page = self.call("GET", f"/volumes/{_seg(ref)}/ls", params=_q(org, path=path, after=after, limit=10_000))
            out += [load(VolumeEntry, e) for e in page]
            if len(page) < 10_000:
                return out
            after = page[-1]["name"]

    def volume_stat(self, ref: str, path: str, org: str | None = None, sha256: bool = False) -> dict[str, Any]:
        params = _q(org, path=path, sha256="true" if sha256 else None)
        return dict(self.call("GET", f"/volumes/{_seg(ref)}/stat", params=params))

    # ---- storage charges and quotes ----
    def storage_usage(self, org_id: str | None = None, *, since: datetime | str | None = None,
                      until: datetime | str | None = None) -> list[StorageUsage]:  # fmt: skip
        """The org's volume storage charges, one line per volume (removed ones too): hours charged that start in
        [since, until) and their exact cost, most expensive first."""
        params = {k: v.isoformat() if isinstance(v, datetime) else v
                  for k, v in {"since": since, "until": until}.items() if v is not None}  # fmt: skip
        rows = self.call("GET", f"/orgs/{_seg(self._org_id(org_id))}/usage/storage", params=params)
        return [load(StorageUsage, r) for r in rows]

    def quote_storage(self, size: str | int, hours: int = 720) -> StorageQuote:
        """What `size` of volume storage (a volume's size plus its versions' bytes) costs for `hours`."""
        return load(StorageQuote, self.call("POST", "/quotes/storage", {"size": size, "hours": hours}))

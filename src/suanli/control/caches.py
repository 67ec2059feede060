"""Per-process caches on the hot read path, each with a stated staleness bound.

- Tokens: a verified bearer token is trusted for `ttl_s` seconds (never past its expiry). Revoking a token in
  this process forgets it at once; another server process notices within `ttl_s`.
- Price book: parsed once per stored version; the version itself is read on every use, so a price change is
  seen by the next request on every process.
- Fleet: GPUs per model, recomputed when the fleet version (registrations, node states) changes; read on use.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from threading import Lock

from sqlalchemy import Connection, select
from sqlalchemy.orm import Session

from suanli.billing.prices import PriceBook, default_price_book
from suanli.control.accounts.accounts import Principal
from suanli.control.money import prices
from suanli.db.models import Node, PriceBookVersion
from suanli.sched import gpus_carried


@dataclass
class TokenCache:
    ttl_s: float = 5.0
    max_entries: int = 100_000
    _entries: dict[str, tuple[Principal, datetime]] = field(default_factory=dict)
    _lock: Lock = field(default_factory=Lock)

    def get(self, token_hash: str, now: datetime) -> Principal | None:
        hit = self._entries.get(token_hash)
        if hit is None or hit[1] <= now:
            return None
        return hit[0]

    def put(self, token_hash: str, who: Principal, expires_at: datetime | None, now: datetime) -> None:
        until = now + timedelta(seconds=self.ttl_s)
        if expires_at is not None:
            until = min(until, expires_at)
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[token_hash] = (who, until)

    def forget_all(self) -> None:
        """After a revocation or a role change in this process."""
        with self._lock:
            self._entries.clear()


@dataclass
class PriceCache:
    _books: dict[int, PriceBook] = field(default_factory=dict)
    _lock: Lock = field(default_factory=Lock)

    def current(self, s: Session | Connection) -> tuple[int, PriceBook]:
        version = prices.version(s)
        return version, self.book(s, version)

    def cached(self, version: int) -> PriceBook | None:
        """The book of a version without a query, if this process has read it (0: the shipped default)."""
        return self._books.get(version) if version else default_price_book()

    def book(self, s: Session | Connection, version: int) -> PriceBook:
        """The book of a version the caller already read (0: the shipped default)."""
        book = self.cached(version)
        if book is None:
            book = PriceBook.model_validate(
                s.scalar(select(PriceBookVersion.body).where(PriceBookVersion.id == version))
            )
            with self._lock:
                self._books[version] = book
        return book


@dataclass(frozen=True)
class ModelCapacity:
    gpus: int  # on nodes that are not down
    per_node: int  # the most on one node
    per_nvlink: int  # the most in one NVLink domain (of one cluster)
    per_leaf: int  # the most under one leaf switch
    hosts: tuple[tuple[int, int, int, int], ...] = ()  # (GPUs, cores, MiB, how many nodes) per kind of node
    per_cluster: int = 0  # the most in one cluster (a gang runs inside one); 0: not known, take `gpus`

    def largest_gang(self) -> int:
        return self.per_cluster or self.gpus

    def carries(self, gpus: int, cpu_milli: int, memory_mib: int) -> int:
        """How many GPUs of a request asking `cpu_milli` and `memory_mib` for `gpus` GPUs (taken per GPU) these
        nodes could carry with nothing else running: a node's unstated cores or memory are no limit."""
        if not self.hosts:  # nothing known of the hosts: no limit
            return self.gpus
        total = 0
        for n, cores, mib, count in self.hosts:
            room = n
            if cpu_milli and cores:
                room = min(room, gpus_carried(cores * 1000, cpu_milli, gpus))
            if memory_mib and mib:
                room = min(room, gpus_carried(mib, memory_mib, gpus))
            total += room * count
        return total


@dataclass
class FleetCache:
    """GPUs registered per model, recomputed only when nodes change (the fleet version), not when allocations
    do: submissions check feasibility against it without scanning every node."""

    _version: int = -1
    _models: dict[str, ModelCapacity] = field(default_factory=dict)
    _lock: Lock = field(default_factory=Lock)

    def models_at(self, s: Session, version: int) -> dict[str, ModelCapacity]:
        """For a fleet version the caller already read."""
        if version != self._version:
            totals: dict[str, list[int]] = {}
            hosts: dict[str, Counter[tuple[int, int, int]]] = defaultdict(Counter)
            domains: dict[tuple[str, str, int], int] = defaultdict(int)
            leaves: dict[tuple[str, str, int], int] = defaultdict(int)
            clusters: dict[tuple[str, str], int] = defaultdict(int)
            rows = s.execute(
                select(Node.gpu_model, Node.cluster_id, Node.nvlink_domain, Node.leaf, Node.gpu_count, Node.cpu_count,
                       Node.memory_mib).where(Node.gpu_model.is_not(None), Node.state != "down")
            )  # fmt: skip
            for m, cid, dom, leaf, n, cores, mib in rows:
                hosts[m][(n, cores, mib)] += 1
                t = totals.setdefault(m, [0, 0])
                t[0], t[1] = t[0] + n, max(t[1], n)
                domains[(m, cid, dom)] += n
                leaves[(m, cid, leaf)] += n
                clusters[(m, cid)] += n
            models = {
                m: ModelCapacity(total, per,
                                 max(v for (mm, _, _), v in domains.items() if mm == m),
                                 max(v for (mm, _, _), v in leaves.items() if mm == m),
                                 tuple((*kind, c) for kind, c in sorted(hosts[m].items())),
                                 max(v for (mm, _), v in clusters.items() if mm == m))
                for m, (total, per) in totals.items()
            }  # fmt: skip
            with self._lock:
                self._version, self._models = version, models
        return self._models

"""The serving tables: endpoints, their replicas (ordinary workloads, with the port the runtime listens on and
whether it answered its health probe), endpoint API keys (SHA-256 at rest), the endpoint's events, the load each
gateway process reports, and token usage per key per minute."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from suanli.db.columns import UTCDateTime
from suanli.db.models import Base


class Endpoint(Base):
    """One OpenAI-compatible endpoint of an org: its spec, the hub model's repository id, and the replica count the
    autoscaler wants now (`desired`), between the spec's bounds."""

    __tablename__ = "endpoints"
    __table_args__ = (UniqueConstraint("org_id", "name", name="uq_endpoints_org_id_name"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id"))
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))  # who deployed it: its replicas are submitted as them
    name: Mapped[str] = mapped_column(String(63))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    repo_id: Mapped[str] = mapped_column(String(200))
    min_replicas: Mapped[int] = mapped_column(Integer)
    max_replicas: Mapped[int] = mapped_column(Integer)
    desired: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime]
    changed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)  # desired last changed
    busy_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)  # load last needed all replicas


class EndpointReplica(Base):
    """A replica: a workload, the port its runtime listens on, and the attempt whose runtime answered its probe."""

    __tablename__ = "endpoint_replicas"
    workload_id: Mapped[str] = mapped_column(ForeignKey("workloads.id", ondelete="CASCADE"), primary_key=True)
    endpoint_id: Mapped[str] = mapped_column(String(32), index=True)
    port: Mapped[int] = mapped_column(Integer)
    address: Mapped[str] = mapped_column(String(64), default="127.0.0.1")
    ready_attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    ready_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime]
    # what its runtime requires of every request but its probe (`serving/replica_guard.py`); the gateway sends it
    secret: Mapped[str] = mapped_column(String(64), default="", server_default="")


class EndpointKey(Base):
    """An API key for one endpoint; only its SHA-256 is stored. `org_id` pays for what it uses."""

    __tablename__ = "endpoint_keys"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    endpoint_id: Mapped[str] = mapped_column(String(32), index=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id"))
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(128))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class EndpointEvent(Base):
    """Something the endpoint did and why: each autoscaling decision, a replica added, stopped or ready."""

    __tablename__ = "endpoint_events"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    endpoint_id: Mapped[str] = mapped_column(String(32), index=True)
    at: Mapped[datetime]
    kind: Mapped[str] = mapped_column(String(16))  # scale | replica | ready | error
    reason: Mapped[str] = mapped_column(Text)


class EndpointLoad(Base):
    """What one gateway process sees of an endpoint: requests in flight and waiting for a replica now, and when the
    last one arrived (the autoscaler sums the rows reported in the last few seconds)."""

    __tablename__ = "endpoint_load"
    endpoint_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    worker: Mapped[str] = mapped_column(String(128), primary_key=True)
    inflight: Mapped[int] = mapped_column(Integer, default=0)
    waiting: Mapped[int] = mapped_column(Integer, default=0)
    last_request_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    updated_at: Mapped[datetime]


class EndpointUsage(Base):
    """Tokens one key used in one minute, from the runtime's `usage`; what of them is charged."""

    __tablename__ = "endpoint_usage"
    __table_args__ = (Index("ix_endpoint_usage_endpoint_minute", "endpoint_id", "minute"),)
    endpoint_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    minute: Mapped[datetime] = mapped_column(primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    # Tokens of this row already charged to the key's org (another org's key on a priced endpoint): a late report
    # adds tokens, and only the rest is charged next time.
    charged_tokens: Mapped[int] = mapped_column(BigInteger, default=0)

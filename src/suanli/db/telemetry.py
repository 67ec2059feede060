"""Telemetry tables: GPU samples at full resolution, their per-minute and per-hour rollups, node health events
and the faults an operator injected into virtual nodes.

Samples are keyed by (GPU row, time in ms), so an agent that retries a batch stores nothing twice. Times are
epoch milliseconds, not datetimes: rollup buckets are then integer arithmetic in SQL on both SQLite and
PostgreSQL, and the hot insert path converts nothing.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Float, ForeignKey, Index, Integer, SmallInteger, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from suanli.db.columns import UTCDateTime
from suanli.db.models import Base

BIGINT = BigInteger().with_variant(Integer, "sqlite")


class GpuSampleRow(Base):
    __tablename__ = "gpu_samples"
    __table_args__ = (Index("ix_gpu_samples_t_ms", "t_ms"),)
    gpu_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # gpus.id (no FK: removal must stay cheap)
    t_ms: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    util: Mapped[float] = mapped_column(Float)
    mem_used_mib: Mapped[int] = mapped_column(Integer)
    temp_c: Mapped[float] = mapped_column(Float)
    power_w: Mapped[float] = mapped_column(Float)
    sm_clock_mhz: Mapped[int] = mapped_column(Integer)
    throttle: Mapped[int] = mapped_column(BigInteger)
    ecc_sbe: Mapped[int] = mapped_column(BigInteger)
    ecc_dbe: Mapped[int] = mapped_column(BigInteger)
    xid: Mapped[int] = mapped_column(Integer)
    error: Mapped[str] = mapped_column(Text)
    workload: Mapped[str] = mapped_column(String(32))  # who held the GPU when it was read; "" nobody
    org: Mapped[str] = mapped_column(String(32))


class GpuRollup(Base):
    """min/avg/max of one GPU over a minute (`res_s` 60) or an hour (3600); `n` samples went into it."""

    __tablename__ = "gpu_rollups"
    __table_args__ = (Index("ix_gpu_rollups_res_t", "res_s", "t_ms"),)
    gpu_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    res_s: Mapped[int] = mapped_column(Integer, primary_key=True)
    t_ms: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # bucket start
    n: Mapped[int] = mapped_column(Integer)
    util_min: Mapped[float] = mapped_column(Float)
    util_avg: Mapped[float] = mapped_column(Float)
    util_max: Mapped[float] = mapped_column(Float)
    temp_min: Mapped[float] = mapped_column(Float)
    temp_avg: Mapped[float] = mapped_column(Float)
    temp_max: Mapped[float] = mapped_column(Float)
    power_min: Mapped[float] = mapped_column(Float)
    power_avg: Mapped[float] = mapped_column(Float)
    power_max: Mapped[float] = mapped_column(Float)
    mem_min: Mapped[float] = mapped_column(Float)
    mem_avg: Mapped[float] = mapped_column(Float)
    mem_max: Mapped[float] = mapped_column(Float)
    xid_max: Mapped[int] = mapped_column(Integer)
    errors: Mapped[int] = mapped_column(Integer)  # samples that could not be read
    workload: Mapped[str] = mapped_column(String(32))  # the holder at the bucket's last sample


class NodeEvent(Base):
    """Something health-related happened to a node or one of its GPUs, with its cause."""

    __tablename__ = "node_events"
    id: Mapped[int] = mapped_column(BIGINT, primary_key=True, autoincrement=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    gpu: Mapped[int | None] = mapped_column(SmallInteger, nullable=True)  # None: the node as a whole
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    kind: Mapped[str] = mapped_column(String(32))  # the rule that fired, or the action taken
    reason: Mapped[str] = mapped_column(Text)


class InjectedFault(Base):
    """A fault an operator injected into a virtual node's simulated GPUs (to exercise health rules)."""

    __tablename__ = "injected_faults"
    id: Mapped[int] = mapped_column(BIGINT, primary_key=True, autoincrement=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    gpu: Mapped[int] = mapped_column(SmallInteger)
    kind: Mapped[str] = mapped_column(String(16))  # overtemp | xid | ecc_dbe | off_bus | silent
    xid: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    cleared_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)  # repaired, or reported once


class AgentToken(Base):
    """A node agent's token (`sla_…`): it posts samples for its one node and opens nothing else. Only its SHA-256
    is kept. An operator's token on every GPU node would hand the whole platform to whoever escapes a sandbox on
    any one of them."""

    __tablename__ = "agent_tokens"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

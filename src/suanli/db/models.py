"""The control plane's tables.

Money columns are exact on both databases (`db.columns.Money`). Balances are derived from ledger entries;
`account_balances` is a running sum kept in the same transaction as the entries, so a balance read is one row, and `control.money.ledger.recompute` can always check it against the entries.
Rows that background loops work on carry lease columns (`lock_owner`, `lock_expires_at`).
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from suanli.db.columns import MONEY, UTCDateTime

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON}  # noqa: RUF012


class Org(Base):
    """The billing entity: it holds the balance and the quota; users are its members."""

    __tablename__ = "orgs"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    personal: Mapped[bool] = mapped_column(Boolean, default=False)
    quota_gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)  # most GPUs held at once; None: no limit
    quota_cpus: Mapped[int | None] = mapped_column(Integer, nullable=True)  # most host CPU cores held at once
    quota_memory_gib: Mapped[int | None] = mapped_column(Integer, nullable=True)  # most host memory held, GiB
    created_at: Mapped[datetime]
    # The uid (and gid) a root server runs its sandboxes as, no other org's (control.accounts.sandbox_uids). Set
    # for every org; nullable in the schema only because 0028 added it to a table that had rows.
    sandbox_uid: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True, unique=True)


class User(Base):
    __tablename__ = "users"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    email: Mapped[str] = mapped_column(String(254), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    personal_org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id"))
    created_at: Mapped[datetime]


class Membership(Base):
    __tablename__ = "memberships"
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id", ondelete="CASCADE"), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))  # owner | admin | member | viewer (control.accounts.memberships)
    # The most this member may spend of the org's money in a calendar month (UTC); None: no limit of their own.
    monthly_spend_limit: Mapped[Decimal | None] = mapped_column(MONEY, nullable=True)


class ApiToken(Base):
    """A bearer token; only its SHA-256 is stored, the token itself is shown once."""

    __tablename__ = "api_tokens"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]


class SshKey(Base):
    """A user's SSH public key: the SSH gateway lets it into the instances of every org the user is a member of."""

    __tablename__ = "ssh_keys"
    __table_args__ = (UniqueConstraint("user_id", "fingerprint"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    algorithm: Mapped[str] = mapped_column(String(64))  # ssh-ed25519 | ecdsa-sha2-nistp256 | ssh-rsa ...
    public_key: Mapped[str] = mapped_column(Text)  # one OpenSSH line, "ALG BASE64", without its comment
    fingerprint: Mapped[str] = mapped_column(String(64), index=True)  # "SHA256:..." as ssh-keygen -l prints it
    created_at: Mapped[datetime]


class ProxySession(Base):
    """The instance proxy's grants, stored by the SHA-256 of their secret: a `ticket` (in a URL, single use, a
    minute long) is redeemed for a `session` (an HttpOnly cookie) of one user for one instance."""

    __tablename__ = "proxy_sessions"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # ticket | session
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    workload_id: Mapped[str] = mapped_column(ForeignKey("workloads.id", ondelete="CASCADE"))
    target: Mapped[str] = mapped_column(String(32))  # lab | port:N: where the ticket leads
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime] = mapped_column(index=True)
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # the API token that asked for it: the session ends when that token is revoked or expires (None: made before)
    token_id: Mapped[str | None] = mapped_column(String(32), nullable=True)


class ConsoleSecret(Base):
    """A secret a console form made (a token, an invitation's code, an endpoint key, top-up codes), held until the
    page its answer redirects to shows it once (`control/accounts/console_secrets.py`): any server process may
    answer that page. Sealed with a key only the browser's cookie holds, and stored by that key's SHA-256."""

    __tablename__ = "console_secrets"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)  # SHA-256 of the console session that made it
    page: Mapped[str] = mapped_column(String(64))  # SHA-256 of the path whose next GET shows it
    sealed: Mapped[bytes] = mapped_column(LargeBinary)  # nonce + AES-GCM of its JSON
    created_at: Mapped[datetime] = mapped_column(index=True)
    expires_at: Mapped[datetime] = mapped_column(index=True)


class LedgerTransaction(Base):
    __tablename__ = "ledger_transactions"
    # A member's month-to-date charges (their spend limit) read only that member's transactions of the month.
    __table_args__ = (Index("ix_ledger_transactions_org_user_time", "org_id", "user_id", "created_at"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(200), unique=True)  # idempotency key
    kind: Mapped[str] = mapped_column(String(32))
    memo: Mapped[str] = mapped_column(Text, default="")
    org_id: Mapped[str | None] = mapped_column(ForeignKey("orgs.id"), index=True, nullable=True)
    user_id: Mapped[str | None] = mapped_column(String(32), nullable=True)  # who caused it (usage: the workload's user)
    allocation_id: Mapped[str | None] = mapped_column(String(64), index=True, nullable=True)
    created_at: Mapped[datetime]
    entries: Mapped[list[LedgerEntry]] = relationship(back_populates="tx", lazy="selectin", order_by="LedgerEntry.id")


class LedgerEntry(Base):
    __tablename__ = "ledger_entries"
    # A statement page: its rows and the balance before them, read as one range of an org's entries in tx order.
    __table_args__ = (Index("ix_ledger_entries_account_tx", "account", "tx_id", "amount"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    tx_id: Mapped[int] = mapped_column(ForeignKey("ledger_transactions.id"), index=True)
    account: Mapped[str] = mapped_column(String(64), index=True)
    amount: Mapped[Decimal] = mapped_column(MONEY)
    tx: Mapped[LedgerTransaction] = relationship(back_populates="entries")


class AccountBalance(Base):
    __tablename__ = "account_balances"
    account: Mapped[str] = mapped_column(String(64), primary_key=True)
    balance: Mapped[Decimal] = mapped_column(MONEY, default=Decimal(0))


class PriceBookVersion(Base):
    """Every price book the operator set; the newest is in force. Old versions stay for audits."""

    __tablename__ = "price_books"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    body: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    created_by: Mapped[str | None] = mapped_column(String(32), nullable=True)


class ClusterRow(Base):
    """A registered set of nodes with their fabric: a cluster spec (preset, file, or this host)."""

    __tablename__ = "clusters"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    source: Mapped[str] = mapped_column(String(16))  # preset | spec | local
    spec: Mapped[dict[str, Any]]  # the ClusterSpec document, so the topology can be rebuilt exactly
    created_at: Mapped[datetime]


class Node(Base):
    __tablename__ = "nodes"
    __table_args__ = (UniqueConstraint("cluster_id", "index"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"), index=True)
    index: Mapped[int] = mapped_column(Integer)  # position in the cluster spec
    name: Mapped[str] = mapped_column(String(255), unique=True)
    kind: Mapped[str] = mapped_column(String(16))  # virtual | local
    state: Mapped[str] = mapped_column(String(16), default="ready")  # ready | draining | down
    state_reason: Mapped[str] = mapped_column(Text, default="")
    gpu_model: Mapped[str | None] = mapped_column(String(32), nullable=True)  # None: CPU-only node
    gpu_count: Mapped[int] = mapped_column(Integer)
    nvlink_domain: Mapped[int] = mapped_column(Integer)
    leaf: Mapped[int] = mapped_column(Integer)
    spine: Mapped[int] = mapped_column(Integer)
    cpu_count: Mapped[int] = mapped_column(Integer, default=0)
    memory_mib: Mapped[int] = mapped_column(BigInteger, default=0)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime]
    last_seen_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)  # its latest GPU sample


class Gpu(Base):
    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("node_id", "index"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    index: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str] = mapped_column(String(64), unique=True)
    model: Mapped[str] = mapped_column(String(32))
    memory_mib: Mapped[int] = mapped_column(Integer)
    mig_mode: Mapped[bool] = mapped_column(Boolean, default=False)
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)  # False: a health rule fired; no new placements
    health_reason: Mapped[str] = mapped_column(Text, default="")
    health_since: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class Allocation(Base):
    """GPUs (and host CPU and memory) held by one workload for a span of time: what metering charges for."""

    __tablename__ = "allocations"
    __table_args__ = (
        Index("ix_allocations_open", "stopped_at", "metered_until_s"),
        Index("ix_allocations_workload", "workload"),
        Index("ix_allocations_org_started", "org_id", "started_at", "id"),  # usage statement pages, newest first
        # Every submission sums its org's running rate: from this index alone, however long the history.
        Index(
            "ix_allocations_org_open",
            "org_id",
            "rate_per_hour",
            sqlite_where=text("stopped_at IS NULL"),
            postgresql_where=text("stopped_at IS NULL"),
        ),
    )
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id"), index=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    workload: Mapped[str] = mapped_column(String(128), default="")  # the workload's id or name, for statements
    gpu_model: Mapped[str | None] = mapped_column(String(32), nullable=True)
    gpus: Mapped[int] = mapped_column(Integer)
    milli: Mapped[int] = mapped_column(Integer, default=1000)  # < 1000: one slice of a GPU
    billing_mode: Mapped[str] = mapped_column(String(48), default="on-demand")  # on-demand | spot | usage | plan:<id>
    rate_per_hour: Mapped[Decimal] = mapped_column(MONEY)  # all of it: its GPUs' rate (usage: fully active) + host
    cpu_milli: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # host CPU held (1000: a core)
    memory_mib: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # host memory held
    host_rate_per_hour: Mapped[Decimal] = mapped_column(MONEY, default=Decimal(0), server_default="0")  # their part
    # `billing: usage` only (see billing/usage.py): the rate of its GPUs idle (None: billed by time), and the activity
    # integral (permille-GPU-seconds) of the seconds charged so far, moved in the transaction that charges them.
    floor_rate_per_hour: Mapped[Decimal | None] = mapped_column(MONEY, nullable=True)
    activity_permille_s: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    placement: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # node name -> GPU indices
    started_at: Mapped[datetime]
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    metered_until_s: Mapped[int] = mapped_column(Integer, default=0)  # seconds charged so far
    settled: Mapped[bool] = mapped_column(Boolean, default=False)  # stopped and fully charged
    charged: Mapped[Decimal] = mapped_column(MONEY, default=Decimal(0))
    lock_owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lock_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class Plan(Base):
    """GPUs reserved for a period, paid upfront at the plan's discount (a `plan_purchase` ledger transaction)."""

    __tablename__ = "plans"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id"), index=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    plan: Mapped[str] = mapped_column(String(32))  # hourly | daily | weekly | monthly (the price book's plans)
    gpu_model: Mapped[str] = mapped_column(String(32))
    gpus: Mapped[int] = mapped_column(Integer)
    price: Mapped[Decimal] = mapped_column(MONEY)
    purchase_key: Mapped[str] = mapped_column(String(200), unique=True)  # the ledger transaction's key
    starts_at: Mapped[datetime]
    ends_at: Mapped[datetime]
    created_at: Mapped[datetime]


class KeyValue(Base):
    """Small named values the server keeps: the inventory version that caches key on."""

    __tablename__ = "kv"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, default=0)


class Workload(Base):
    """A job or an interactive instance: its spec, where it is in its lifecycle, and where it runs."""

    __tablename__ = "workloads"
    __table_args__ = (
        Index("ix_workloads_state", "state", "queued_at"),
        Index("ix_workloads_org_name", "org_id", "name"),
        Index("ix_workloads_org_state", "org_id", "state"),  # an org's waiting work, counted at each submission
        Index("ix_workloads_scale_to", "scale_to"),  # the few with a size their owner asked for, each pass
        Index("ix_workloads_finished_at", "finished_at"),  # jobs that ended since the storage sweep last looked
    )
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id"))
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(63))
    kind: Mapped[str] = mapped_column(String(16))  # job | instance
    spec: Mapped[dict[str, Any]]  # the normalised spec
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")  # of the last transition
    pending_reason: Mapped[str] = mapped_column(Text, default="")  # the scheduler's, while pending
    queue_position: Mapped[int | None] = mapped_column(Integer, nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)  # placements so far (retries, instance restarts)
    retries: Mapped[int] = mapped_column(Integer, default=0)  # retries spent by the spec's retry policy
    allocation_id: Mapped[str | None] = mapped_column(String(64), nullable=True)  # the current attempt's
    executor: Mapped[str] = mapped_column(String(16), default="")  # local | virtual, once placed
    handle: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # the executor's, to re-attach
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    stop_requested: Mapped[str | None] = mapped_column(Text, nullable=True)  # why, once someone asked it to stop
    attained_gpu_s: Mapped[float] = mapped_column(Float, default=0.0)  # GPU-seconds of earlier attempts (LAS)
    has_workdir: Mapped[bool] = mapped_column(Boolean, default=False)
    # An instance started without its GPUs (`suanli start --no-gpu`) runs a CPU-only copy of its spec; this is the
    # spec it had with them, put back on its next ordinary start. None: `spec` is its own.
    gpu_spec: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime]
    # Its place in the queue: when its owner last submitted it (created it, or started a stopped instance again).
    # A retry after a preemption or a failure keeps that place, as in `suanli sim`.
    submitted_at: Mapped[datetime]
    queued_at: Mapped[datetime]  # when it last entered the queue, retries included: how long it has waited
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)  # of the current attempt
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # When the supervisor must look at a running workload again without being asked: its max_duration is up,
    # or (virtual executor) its run ends. Lets a pass skip thousands of running workloads with one query.
    deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    ends_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # How long a whole run lasts on the current allocation's GPUs (virtual executor): the perf model's prediction, or
    # an elastic spec's `duration` scaled to the GPUs it holds as `suanli sim` scales it. None: the spec's duration.
    predicted_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Elastic work its owner resized (`suanli scale`): the GPU count it runs at from the next scheduling pass on, and
    # keeps (the policy no longer grows or shrinks it) until its run ends. None: the policy decides, in the range.
    scale_to: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Why the next or current launch is a restart, given to its ranks as SUANLI_RESTART_REASON: resize, preemption,
    # failure, node-failure. None: a first start.
    restart_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # When a resize last restarted the run's ranks in place (a new attempt on the new allocation; `started_at`, the
    # run's start, is kept). None: never since it was queued.
    restarted_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class WorkloadEvent(Base):
    """One state transition of a workload, with its reason."""

    __tablename__ = "workload_events"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    workload_id: Mapped[str] = mapped_column(ForeignKey("workloads.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime]
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")


class Workdir(Base):
    """A workdir kept on the server's disk, counted against its org's storage quota: an upload waiting for the
    submission that names it (`workload_id` None, removed at `expires_at`), or a job's (its upload, or what a job
    without one wrote there), until the retention after the job ended removes it."""

    __tablename__ = "workdirs"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id"), index=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    workload_id: Mapped[str | None] = mapped_column(ForeignKey("workloads.id"), nullable=True, unique=True)
    bytes: Mapped[int] = mapped_column(BigInteger)  # on disk: files in whole 4 KiB blocks, a block per directory
    files: Mapped[int] = mapped_column(Integer)  # files and directories
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class Lease(Base):
    """A named lease one server process holds at a time (the scheduling loop's leader)."""

    __tablename__ = "leases"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(128))
    expires_at: Mapped[datetime]
    info: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # what the holder reports (its last pass)


# Telemetry and access tables (invitations, signup codes, login throttling) live in their own modules; importing them
# here puts them in `Base.metadata` for migrations.
from suanli.db.access import EmailVerification, Invitation, LoginThrottle, PasswordReset, SignupCode  # noqa: E402
from suanli.db.credit import TopupBatch, TopupCode  # noqa: E402
from suanli.db.hub import HubEntry  # noqa: E402
from suanli.db.serving import (  # noqa: E402
    Endpoint,
    EndpointEvent,
    EndpointKey,
    EndpointLoad,
    EndpointReplica,
    EndpointUsage,
)
from suanli.db.telemetry import GpuRollup, GpuSampleRow, InjectedFault, NodeEvent  # noqa: E402
from suanli.db.volumes import Volume, VolumeVersion  # noqa: E402

__all__ = ["EmailVerification", "Endpoint", "EndpointEvent", "EndpointKey", "EndpointLoad", "EndpointReplica",
           "EndpointUsage", "GpuRollup", "GpuSampleRow", "HubEntry", "InjectedFault", "Invitation", "LoginThrottle",
           "NodeEvent", "PasswordReset", "SignupCode", "TopupBatch", "TopupCode", "Volume", "VolumeVersion"]  # fmt: skip

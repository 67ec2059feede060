"""Tables of self-service credit: operators' batches of top-up codes and the codes themselves.

A code is stored as the SHA-256 of its normalised text only (`control.money.topup_codes` says why not argon2), with
a 4-character hint so an operator can match a printed card to its row. Redeeming a code sets `redeemed_*` and posts
a ledger transaction keyed by the code's id in one database transaction; payments received by webhook need no
table of their own: their ledger key (`payment:<provider>:<event id>`) is what makes a re-sent event post nothing.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import BigInteger, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from suanli.db.columns import MONEY, UTCDateTime
from suanli.db.models import Base


class TopupBatch(Base):
    """Codes made together: each worth `amount`, valid until `expires_at` (None: no expiry), for any org or only
    `org_id`."""

    __tablename__ = "topup_batches"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    amount: Mapped[Decimal] = mapped_column(MONEY)
    count: Mapped[int] = mapped_column(Integer)
    note: Mapped[str] = mapped_column(String(200), default="")
    org_id: Mapped[str | None] = mapped_column(ForeignKey("orgs.id"), nullable=True)
    created_by: Mapped[str] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class TopupCode(Base):
    """One code of a batch: unused, redeemed (by whom, into which org, by which ledger transaction) or voided."""

    __tablename__ = "topup_codes"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    batch_id: Mapped[str] = mapped_column(ForeignKey("topup_batches.id"), index=True)
    code_hash: Mapped[str] = mapped_column(String(64), unique=True)
    hint: Mapped[str] = mapped_column(String(8))  # the code's last 4 characters
    redeemed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    redeemed_by: Mapped[str | None] = mapped_column(String(32), nullable=True)  # a user id
    redeemed_org: Mapped[str | None] = mapped_column(String(32), nullable=True)
    tx_id: Mapped[int | None] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), nullable=True)
    voided_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

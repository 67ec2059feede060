"""Tables of who may get in: invitations to organisations, operators' signup codes, login throttling, mailed links,
and the mailboxes granted a trial.

Secrets (an invitation's code, a signup code) are stored as their SHA-256 only, like API tokens: shown once. The
throttle's keys are SHA-256 digests too, so the table holds neither emails nor addresses in the clear.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import ForeignKey, Index, Integer, String
from sqlalchemy import false as sa_false
from sqlalchemy.orm import Mapped, mapped_column

from suanli.db.columns import MONEY, UTCDateTime
from suanli.db.models import Base


class Invitation(Base):
    """An invitation to join an org with a role: the invitee (whoever holds `email`) accepts or declines it."""

    __tablename__ = "invitations"
    __table_args__ = (Index("ix_invitations_email_state", "email", "state"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id", ondelete="CASCADE"), index=True)
    email: Mapped[str] = mapped_column(String(254))  # normalised (stripped, lower case)
    role: Mapped[str] = mapped_column(String(16))
    monthly_spend_limit: Mapped[Decimal | None] = mapped_column(MONEY, nullable=True)
    code_hash: Mapped[str] = mapped_column(String(64), unique=True)  # signs the invitee up where signup is invite-only
    invited_by: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    state: Mapped[str] = mapped_column(String(16))  # pending | accepted | declined | cancelled
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class SignupCode(Base):
    """An operator's invite code: it lets `uses_left` more people sign up where signup is invite-only."""

    __tablename__ = "signup_codes"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    code_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    note: Mapped[str] = mapped_column(String(200), default="")
    uses_left: Mapped[int] = mapped_column(Integer)
    created_by: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class LoginThrottle(Base):
    """One rate-limit bucket (an account, an address, an account from an address, signups from an address) as a
    generic cell rate: `tat` is when the bucket will be empty again (`control.accounts.throttle`)."""

    __tablename__ = "login_throttle"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)  # SHA-256 of "kind:value"
    tat: Mapped[datetime]
    last_failure_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    expires_at: Mapped[datetime] = mapped_column(index=True)  # nothing is remembered past this: the row may go


class EmailVerification(Base):
    """A link mailed to a user to prove they hold their e-mail address; redeeming it releases the trial credit.
    The token is stored as its SHA-256 only, used once, and expires (`control.accounts.verification`). A user whose
    row has `used_at` set has verified their address."""

    __tablename__ = "email_verifications"
    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    email: Mapped[str] = mapped_column(String(254))  # the address it was sent to
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # whether redeeming it grants the trial credit: a signup's link, and a new one asked for by a user who had one;
    # not a link asked for by a user an operator made (who got the credit at creation, or was meant not to)
    grants_trial: Mapped[bool] = mapped_column(default=False, server_default=sa_false())


class PasswordReset(Base):
    """A link mailed to a user who forgot their password; redeeming it sets a new one. The token is stored as its
    SHA-256 only, used once, and expires within the hour (`control.accounts.password_resets`)."""

    __tablename__ = "password_resets"
    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class TrialMailbox(Base):
    """A mailbox (its SHA-256: `control.accounts.trials.mailbox`) whose user was granted the sign-up trial credit:
    no other user of that mailbox gets one (plus-addresses and Gmail's dots reach one inbox)."""

    __tablename__ = "trial_mailboxes"
    mailbox_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    granted_at: Mapped[datetime]

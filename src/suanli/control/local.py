"""What `suanli up` sets up on a single host: this host as a node, and an operator account the CLI is logged in
as, so the platform is ready to use from the first command."""

from __future__ import annotations

import os
import secrets
import socket
from datetime import datetime
from decimal import Decimal
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from suanli.control.accounts import accounts
from suanli.control.errors import ServiceError
from suanli.control.scheduling import inventory
from suanli.db.models import ClusterRow, User
from suanli.telemetry.nvml import discover

OPERATOR_EMAIL = "operator@suanli.local"
PASSWORD_FILE = "operator-password"


def ensure_host(s: Session, now: datetime) -> tuple[ClusterRow, bool]:
    """This host as a `local` node (its GPUs through NVML, or CPU-only), registered once."""
    existing = s.scalar(select(ClusterRow).where(ClusterRow.source == "local", ClusterRow.name == socket.gethostname()))
    if existing is not None:
        return existing, False
    return inventory.register_host(s, discover(), now), True


def token_works(s: Session, token: str | None, now: datetime) -> bool:
    """Whether a saved CLI token is valid on this database (a fresh database makes old tokens stale)."""
    if not token:
        return False
    try:
        accounts.authenticate(s, token, now)
    except ServiceError:
        return False
    return True


def operator_token(s: Session, home: Path, now: datetime, credit: Decimal = Decimal(0)) -> tuple[str, str]:
    """(email, a new API token) of the local operator, created on first use with a random password kept in
    `home/operator-password` (mode 0600) for `suanli login`, and `credit` (the trial credit): CPU-only work is
    charged too, so the first `suanli run` on a fresh install needs a balance."""
    user = s.scalar(select(User).where(User.email == OPERATOR_EMAIL))
    if user is None:
        password = secrets.token_urlsafe(18)
        user, _ = accounts.create_user(s, OPERATOR_EMAIL, password, now, admin=True, trial_credit=credit)
        home.mkdir(parents=True, exist_ok=True)
        fd = os.open(home / PASSWORD_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
    _, token = accounts.issue_token(s, user, "suanli up", now)
    return OPERATOR_EMAIL, token

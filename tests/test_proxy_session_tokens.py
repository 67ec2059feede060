"""An instance proxy session ends with the API token that opened it: revoked (`DELETE /tokens/{id}`, logout) or
expired. Found by a hostile review: the session row kept only the user, so a leaked CI token revoked at once still
gave 12 hours inside the owner's running instances, and a one-hour token opened a twelve-hour session."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from suanli.control.accounts import accounts
from suanli.control.accounts.accounts import Principal
from suanli.control.errors import Forbidden
from suanli.control.ids import utcnow
from suanli.control.workloads import proxy
from suanli.db.models import Workload


def _box(s: Any, org: str, user: str) -> None:
    now = utcnow()
    spec = {"name": "box", "kind": "instance", "ports": []}
    s.add(Workload(id="wl_box", org_id=org, user_id=user, name="box", kind="instance", spec=spec, state="running",
                   executor="local", handle={"ranks": []}, created_at=now, submitted_at=now, queued_at=now))  # fmt: skip


def _setup(db: Any, days: float) -> tuple[Principal, str, Any]:
    now = utcnow()
    with db.write() as s, s.begin():
        alice, org = accounts.create_user(s, "alice@example.com", "password-123", now)
        _box(s, org.id, alice.id)
        tok, _ = accounts.issue_token(s, alice, "ci", now, now + timedelta(days=days))
        who = Principal(alice.id, alice.email, False, org.id, tok.id, tok.expires_at)
    with db.write() as s, s.begin():
        accounts.check_live(s, who)  # what the route does
        ticket = proxy.open_ticket(s, who, "wl_box", None, now)[1]
    with db.write() as s, s.begin():
        secret, _, ends = proxy.redeem(s, "wl_box", ticket, now)
    return who, secret, ends


def test_revoking_the_token_ends_the_proxy_session_it_opened(db: Any) -> None:
    who, secret, _ = _setup(db, 30)
    now = utcnow()
    with db.read() as s:
        assert proxy.session(s, "wl_box", secret, now).user_id == who.user_id  # it works until then
    with db.write() as s, s.begin():
        accounts.revoke_token(s, who, who.token_id, now)
    with db.read() as s, pytest.raises(Forbidden):
        proxy.session(s, "wl_box", secret, now + timedelta(seconds=1))


def test_a_proxy_session_does_not_outlive_its_token(db: Any) -> None:
    who, secret, ends = _setup(db, 1 / 24)  # a token good for one hour
    assert who.token_expires_at is not None
    assert ends <= who.token_expires_at, (ends, who.token_expires_at)
    with db.read() as s:
        assert proxy.session(s, "wl_box", secret, who.token_expires_at - timedelta(minutes=1)).user_id == who.user_id
    with db.read() as s, pytest.raises(Forbidden):
        proxy.session(s, "wl_box", secret, who.token_expires_at + timedelta(minutes=1))

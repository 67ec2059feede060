"""The instance proxy's tickets and sessions over the database (both backends): a ticket works once, within its
minute, for its own instance; a session ends when it expires or when its user leaves the instance's org; only
members of the org get a ticket (operators too are refused), only into a running instance on this host, and only
for a port its spec lists."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from suanli.control.accounts import accounts, memberships
from suanli.control.accounts.accounts import Principal
from suanli.control.errors import Conflict, Forbidden, Invalid, NotFound
from suanli.control.ids import token_hash, utcnow
from suanli.control.workloads import proxy
from suanli.db.models import Membership, ProxySession, Workload


def _principal(user: Any, admin: bool = False) -> Principal:
    return Principal(user.id, user.email, admin, user.personal_org_id, "tok")


def _workload(s: Any, wid: str, org: str, user: str, *, state: str = "running", executor: str = "local",
              kind: str = "instance", ports: tuple[int, ...] = ()) -> None:  # fmt: skip
    now = utcnow()
    spec = {"name": wid.replace("_", "-"), "kind": kind, "ports": list(ports)}
    if kind == "job":
        spec["command"] = "true"
    s.add(Workload(id=wid, org_id=org, user_id=user, name=spec["name"], kind=kind, spec=spec, state=state,
                   executor=executor, handle={"ranks": []}, created_at=now, submitted_at=now, queued_at=now))  # fmt: skip


@pytest.fixture
def world(db: Any) -> dict[str, Any]:
    now = utcnow()
    with db.write() as s, s.begin():
        alice, _ = accounts.create_user(s, "alice@example.com", "password-123", now)
        bob, _ = accounts.create_user(s, "bob@example.com", "password-123", now)
        ops, _ = accounts.create_user(s, "ops@example.com", "password-123", now, admin=True)
        mallory, _ = accounts.create_user(s, "mallory@example.com", "password-123", now)
        team = accounts.create_org(s, _principal(alice), "team", now)
        invitation, _ = memberships.invite(s, _principal(alice), team.id, "bob@example.com", "member", None, now)
        memberships.accept(s, _principal(bob), invitation.id, now)
        _workload(s, "wl_box", team.id, alice.id, ports=(6006,))
        _workload(s, "wl_other", team.id, alice.id)
        _workload(s, "wl_stopped", team.id, alice.id, state="stopped")
        _workload(s, "wl_virtual", team.id, alice.id, executor="virtual")
        _workload(s, "wl_job", team.id, alice.id, kind="job", ports=(7000,))
        # each with a token of their own, as a request has (a proxy session ends with the token that opened it)
        who = {}
        for name, u in (("alice", alice), ("bob", bob), ("ops", ops), ("mallory", mallory)):
            tok, _ = accounts.issue_token(s, u, "test", now)
            who[name] = Principal(u.id, u.email, name == "ops", u.personal_org_id, tok.id)
    return {**who, "team": team.id, "now": now}


def _ticket(db: Any, who: Principal, ref: str, port: int | None = None, now: Any = None) -> str:
    with db.write() as s, s.begin():
        return proxy.open_ticket(s, who, ref, port, now or utcnow())[1]


def test_a_ticket_is_redeemed_once_for_a_session(db: Any, world: dict[str, Any]) -> None:
    ticket = _ticket(db, world["bob"], "wl_box")  # bob is a member of the instance's team
    now = utcnow()
    with db.write() as s, s.begin():
        secret, target, ends = proxy.redeem(s, "wl_box", ticket, now)
    assert target == "lab" and secret != ticket and ends == now + timedelta(seconds=proxy.SESSION_S)
    with db.write() as s, s.begin(), pytest.raises(Forbidden):
        proxy.redeem(s, "wl_box", ticket, now)  # used
    with db.read() as s:
        assert proxy.session(s, "wl_box", secret, now).user_id == world["bob"].user_id
        with pytest.raises(Forbidden):
            proxy.session(s, "wl_other", secret, now)  # another instance of the same org
        with pytest.raises(Forbidden):
            proxy.session(s, "wl_box", ticket, now)  # a ticket is no session
        with pytest.raises(Forbidden):
            proxy.session(s, "wl_box", secret, ends + timedelta(seconds=1))  # expired
        # Stored by hash only: neither secret is in the table.
        ids = {r.id for r in s.query(ProxySession)}
        assert secret not in ids and ticket not in ids and token_hash(secret) in ids


def test_a_ticket_dies_after_its_minute_and_on_another_instance(db: Any, world: dict[str, Any]) -> None:
    issued = utcnow()
    ticket = _ticket(db, world["alice"], "wl_box", now=issued)
    with db.write() as s, s.begin(), pytest.raises(Forbidden):
        proxy.redeem(s, "wl_other", ticket, issued)
    with db.write() as s, s.begin(), pytest.raises(Forbidden):
        proxy.redeem(s, "wl_box", ticket, issued + timedelta(seconds=proxy.TICKET_S + 1))


def test_a_member_who_leaves_loses_the_session(db: Any, world: dict[str, Any]) -> None:
    ticket = _ticket(db, world["bob"], "wl_box")
    with db.write() as s, s.begin():
        secret, _, _ = proxy.redeem(s, "wl_box", ticket, utcnow())
    with db.write() as s, s.begin():
        s.query(Membership).filter_by(user_id=world["bob"].user_id, org_id=world["team"]).delete()
    with db.read() as s, pytest.raises(Forbidden, match="no longer a member"):
        proxy.session(s, "wl_box", secret, utcnow())


def test_a_viewer_gets_no_ticket_and_a_member_made_viewer_loses_the_session(db: Any, world: dict[str, Any]) -> None:
    ticket = _ticket(db, world["bob"], "wl_box")
    with db.write() as s, s.begin():
        secret, _, _ = proxy.redeem(s, "wl_box", ticket, utcnow())
        memberships.set_member(s, world["alice"], world["team"], world["bob"].user_id, role="viewer")
    with db.read() as s, pytest.raises(Forbidden, match="viewer"):
        proxy.session(s, "wl_box", secret, utcnow())
    with pytest.raises(Forbidden, match="viewers read only"):
        _ticket(db, world["bob"], "wl_box")


def test_who_gets_a_ticket_into_what(db: Any, world: dict[str, Any]) -> None:
    with pytest.raises(NotFound):
        _ticket(db, world["mallory"], "wl_box")
    with pytest.raises(NotFound):
        _ticket(db, world["ops"], "wl_box")  # operators see every workload, and get into none
    with pytest.raises(Conflict, match="stopped"):
        _ticket(db, world["alice"], "wl_stopped")
    with pytest.raises(Conflict, match="virtual"):
        _ticket(db, world["alice"], "wl_virtual")
    with pytest.raises(Invalid, match="job"):
        _ticket(db, world["alice"], "wl_job")  # JupyterLab is for instances ...
    assert _ticket(db, world["alice"], "wl_job", 7000)  # ... a job's listed port opens
    with pytest.raises(Invalid, match="port: 7001"):
        _ticket(db, world["alice"], "wl_job", 7001)
    assert _ticket(db, world["alice"], "wl-box", 6006)  # by name too


def test_expired_grants_are_swept(db: Any, world: dict[str, Any]) -> None:
    old = utcnow() - timedelta(days=1)
    _ticket(db, world["alice"], "wl_box", now=old)
    _ticket(db, world["alice"], "wl_box")  # sweeps what expired before now
    with db.read() as s:
        assert s.query(ProxySession).count() == 1


def test_the_proxy_url_setting_names_each_instances_own_host() -> None:
    from suanli.control.settings import load

    assert load({"proxy_url": "https://{id}.i.example.com/"}, {}, None).proxy_url == "https://{id}.i.example.com"
    for bad in ("https://i.example.com", "ftp://{id}.x", "https://x.{id}.example.com", "https://{id}.x/path"):
        with pytest.raises(Exception, match="proxy_url"):
            load({"proxy_url": bad}, {}, None)
    assert (
        proxy.origin_of("https://{id}.i.example.com", "wl_0123456789abcdef")
        == "https://wl-0123456789abcdef.i.example.com"
    )
    assert proxy.workload_of_host_label("wl-0123456789abcdef") == "wl_0123456789abcdef"
    assert proxy.workload_of_host_label("wl-0123456789abcdeg") is None and proxy.origin_of(None, "wl_x") == ""

"""Access taken away is taken away everywhere (a hostile review of authorization drift): a member removed or demoted,
a token revoked or expired, a password changed or reset, an operator unmade, and what each keeps of work, invitations,
tokens, proxy sessions, endpoint keys and SSH connections. Three of its findings are kept here as tests: a reset left
the endpoint keys the account made charging its orgs, an unmade operator's owner invitation still admitted an owner,
and a pending invitation kept a limit its maker no longer had. In-process on both databases."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from suanli.api.proxy import GRANT_TTL_S, ProxyState
from suanli.control.accounts.accounts import Principal
from suanli.control.caches import TokenCache
from suanli.control.errors import Forbidden, Unauthorized
from suanli.control.ids import new_secret, token_hash, utcnow
from suanli.control.scheduling.placing import preempt
from suanli.control.scheduling.scheduling import SchedulingPass
from suanli.control.serving import endpoints
from suanli.control.storage import hub
from suanli.control.workloads import proxy
from suanli.control.workloads.supervisor import Supervisor
from suanli.db.access import Invitation
from suanli.db.models import ApiToken, ProxySession, Workload
from tests.control_plane import Tenant, admin_token, bearer, join, signup, team_with_member

API = "/api/v1"


def _db(api: TestClient) -> Any:
    return api.app.state.server.db  # type: ignore[attr-defined]


def _token_id(api: TestClient, t: Tenant) -> str:
    with _db(api).read() as s:
        return str(s.scalar(select(ApiToken.id).where(ApiToken.token_hash == token_hash(t.token))))


# ---- workloads ------------------------------------------------------------------------------------------------------
def test_a_removed_member_loses_describe_logs_stop_start_scale_of_their_own_work(api: TestClient) -> None:
    _, owner, alice, org = team_with_member(api)
    spec = {"name": "box", "kind": "instance", "command": "x", "resources": {"gpus": 0}}
    r = api.post(f"{API}/workloads", json={"spec": spec, "org": org}, headers=alice.headers)
    assert r.status_code == 201, r.text
    wid = r.json()["id"]
    assert api.delete(f"{API}/orgs/{org}/members/{alice.user_id}", headers=owner.headers).status_code == 204
    for method, path, body in (("GET", "", None), ("GET", "/logs", None), ("POST", "/stop", None),
                               ("POST", "/start", {}), ("POST", "/scale", {"gpus": 2})):  # fmt: skip
        for ref in (wid, "box"):
            r = api.request(method, f"{API}/workloads/{ref}{path}", json=body, headers=alice.headers)
            assert r.status_code == 404, (method, path, ref, r.status_code, r.text)
    assert api.get(f"{API}/workloads", params={"org": org}, headers=alice.headers).status_code == 404
    assert all(w["id"] != wid for w in api.get(f"{API}/workloads", headers=alice.headers).json())
    with _db(api).read() as s:  # queued at removal: stopped
        assert s.get(Workload, wid).state == "stopped"


def test_a_member_with_a_zero_limit_is_refused_at_placement_of_a_retry(api: TestClient) -> None:
    """The control for the failing removal probe: a member who stays, capped at 0, is not placed again."""
    _, owner, alice, org = team_with_member(api)
    t0 = utcnow().replace(microsecond=0) + timedelta(seconds=5)
    spec = {"name": "long", "command": "train", "duration": 3600, "resources": {"gpu": "H20", "gpus": 1},
            "retry": {"on": ["preemption"], "limit": 5}}  # fmt: skip
    wid = api.post(f"{API}/workloads", json={"spec": spec, "org": org}, headers=alice.headers).json()["id"]
    db = _db(api)
    sup = Supervisor(api.app.state.server.settings.home)  # type: ignore[attr-defined]
    SchedulingPass().run(db, t0)
    sup.run(db, t0)
    r = api.patch(f"{API}/orgs/{org}/members/{alice.user_id}", json={"monthly_spend_limit": "0"},
                  headers=owner.headers)  # fmt: skip
    assert r.status_code == 200, r.text
    with db.write() as s, s.begin():
        assert preempt(s, [(wid, "preempted for on-demand work", "")], t0 + timedelta(seconds=30)) == 1
    sup.run(db, t0 + timedelta(seconds=31))
    SchedulingPass().run(db, t0 + timedelta(seconds=40))
    with db.read() as s:
        w = s.get(Workload, wid)
        assert w.state == "pending" and "spend limit" in w.pending_reason, (w.state, w.pending_reason)


# ---- invitations ----------------------------------------------------------------------------------------------------
def test_invitations_die_with_their_makers_right(api: TestClient) -> None:
    _, owner, _, org = team_with_member(api)
    adm, adm2 = signup(api, "adm@example.com"), signup(api, "adm2@example.com")
    join(api, owner, org, adm, "admin")
    join(api, owner, org, adm2, "admin")
    x, y = signup(api, "x@example.com"), signup(api, "y@example.com")
    ix = api.post(f"{API}/orgs/{org}/invitations", json={"email": x.email, "role": "admin"}, headers=adm.headers)
    iy = api.post(f"{API}/orgs/{org}/invitations", json={"email": y.email, "role": "member"}, headers=adm2.headers)
    assert ix.status_code == iy.status_code == 201
    r = api.patch(f"{API}/orgs/{org}/members/{adm.user_id}", json={"role": "member"}, headers=owner.headers)
    assert r.status_code == 200
    assert api.delete(f"{API}/orgs/{org}/members/{adm2.user_id}", headers=owner.headers).status_code == 204
    for who, inv in ((x, ix), (y, iy)):
        r = api.post(f"{API}/invitations/{inv.json()['id']}/accept", headers=who.headers)
        assert r.status_code == 409 and "cancelled" in r.text, r.text
    # the demoted (now member) admin cannot invite; a viewer cannot either
    r = api.post(f"{API}/orgs/{org}/invitations", json={"email": "z@example.com", "role": "viewer"},
                 headers=adm.headers)  # fmt: skip
    assert r.status_code == 403, r.text


def test_an_invitation_is_good_once_for_its_own_address(api: TestClient) -> None:
    _, owner, _, org = team_with_member(api)
    bob, mallory = signup(api, "bob@example.com"), signup(api, "mallory@example.com")
    inv = api.post(f"{API}/orgs/{org}/invitations", json={"email": bob.email, "role": "member"},
                   headers=owner.headers).json()  # fmt: skip
    assert api.post(f"{API}/invitations/{inv['id']}/accept", headers=mallory.headers).status_code == 404
    assert api.post(f"{API}/invitations/{inv['id']}/accept", headers=bob.headers).status_code == 200
    assert api.delete(f"{API}/orgs/{org}/members/{bob.user_id}", headers=bob.headers).status_code == 204  # leaves
    r = api.post(f"{API}/invitations/{inv['id']}/accept", headers=bob.headers)  # and comes back with it
    assert r.status_code == 409, r.text
    inv2 = api.post(f"{API}/orgs/{org}/invitations", json={"email": bob.email, "role": "member"},
                    headers=owner.headers).json()  # fmt: skip
    assert api.delete(f"{API}/orgs/{org}/invitations/{inv2['id']}", headers=owner.headers).status_code == 200
    assert api.post(f"{API}/invitations/{inv2['id']}/accept", headers=bob.headers).status_code == 409
    inv3 = api.post(f"{API}/orgs/{org}/invitations", json={"email": bob.email, "role": "member"},
                    headers=owner.headers).json()  # fmt: skip
    with _db(api).write() as s, s.begin():
        s.get(Invitation, inv3["id"]).expires_at = utcnow() - timedelta(seconds=1)
    assert api.post(f"{API}/invitations/{inv3['id']}/accept", headers=bob.headers).status_code == 409


# ---- tokens ---------------------------------------------------------------------------------------------------------
def test_revoked_token_dies_at_once_and_a_password_change_kills_the_others(api: TestClient) -> None:
    alice = signup(api, "alice@example.com")
    extra = api.post(f"{API}/tokens", json={"name": "ci", "password": "tenant-password"}, headers=alice.headers)
    assert extra.status_code == 201, extra.text
    other = bearer(extra.json()["token"])
    assert api.get(f"{API}/me", headers=other).status_code == 200  # cached now
    assert api.delete(f"{API}/tokens/{extra.json()['id']}", headers=alice.headers).status_code == 200
    assert api.get(f"{API}/me", headers=other).status_code == 401
    third = api.post(f"{API}/tokens", json={"name": "ci2", "password": "tenant-password"}, headers=alice.headers)
    assert api.get(f"{API}/me", headers=bearer(third.json()["token"])).status_code == 200
    r = api.put(f"{API}/me/password", json={"current_password": "tenant-password", "new_password": "another-pass-1"},
                headers=alice.headers)  # fmt: skip
    assert r.status_code == 200, r.text
    assert api.get(f"{API}/me", headers=bearer(third.json()["token"])).status_code == 401
    assert api.get(f"{API}/me", headers=alice.headers).status_code == 200


def test_the_token_cache_never_serves_a_token_past_its_expiry() -> None:
    cache, now = TokenCache(ttl_s=60.0), datetime(2030, 1, 1)
    who = Principal("usr_x", "x@example.com", False, "org_x", "tok_x", now + timedelta(seconds=2))
    cache.put("h", who, who.token_expires_at, now)
    assert cache.get("h", now + timedelta(seconds=1)) is who
    assert cache.get("h", now + timedelta(seconds=2)) is None


# ---- the instance proxy ---------------------------------------------------------------------------------------------
def _session_row(api: TestClient, who: Tenant, wid: str) -> str:
    secret, now, tok = new_secret(), utcnow(), _token_id(api, who)
    with _db(api).write() as s, s.begin():
        s.add(ProxySession(id=token_hash(secret), kind="session", user_id=who.user_id, workload_id=wid, target="lab",
                           created_at=now, expires_at=now + timedelta(hours=12), token_id=tok))  # fmt: skip
    return secret


def _instance(api: TestClient, who: Tenant, org: str) -> str:
    spec = {"name": "box", "kind": "instance", "command": "x", "resources": {"gpus": 0}}
    r = api.post(f"{API}/workloads", json={"spec": spec, "org": org}, headers=who.headers)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


@pytest.mark.parametrize("how", ["removed", "viewer", "token-revoked", "password-changed"])
def test_a_proxy_session_ends_when_its_grant_does(api: TestClient, how: str, tmp_path: Path) -> None:
    _, owner, alice, org = team_with_member(api)
    wid = _instance(api, alice, org)
    secret = _session_row(api, alice, wid)
    with _db(api).read() as s:
        assert proxy.session(s, wid, secret, utcnow()).user_id == alice.user_id
    state = ProxyState(_db(api), tmp_path)
    asyncio.run(state.grant(wid, secret, utcnow()))  # cached
    if how == "removed":
        assert api.delete(f"{API}/orgs/{org}/members/{alice.user_id}", headers=owner.headers).status_code == 204
    elif how == "viewer":
        r = api.patch(f"{API}/orgs/{org}/members/{alice.user_id}", json={"role": "viewer"}, headers=owner.headers)
        assert r.status_code == 200
    elif how == "token-revoked":
        assert api.delete(f"{API}/tokens/{_token_id(api, alice)}", headers=alice.headers).status_code == 200
    else:
        spare = api.post(f"{API}/tokens", json={"name": "x", "password": "tenant-password"}, headers=alice.headers)
        r = api.put(f"{API}/me/password", json={"current_password": "tenant-password",
                                                "new_password": "another-pass-1"},
                    headers=bearer(spare.json()["token"]))  # fmt: skip
        assert r.status_code == 200, r.text
    with _db(api).read() as s, pytest.raises(Forbidden):
        proxy.session(s, wid, secret, utcnow())
    # the proxy's per-process cache holds a grant at most GRANT_TTL_S
    later = time.monotonic() + GRANT_TTL_S + 1
    real = time.monotonic
    try:
        time.monotonic = lambda: later  # type: ignore[assignment]
        with pytest.raises(Forbidden):
            asyncio.run(state.grant(wid, secret, utcnow()))
    finally:
        time.monotonic = real  # type: ignore[assignment]


# ---- endpoint keys --------------------------------------------------------------------------------------------------
def _hub_model(api: TestClient) -> None:
    home = api.app.state.server.settings.home  # type: ignore[attr-defined]
    src = home / "tiny-src"
    src.mkdir(parents=True)
    (src / "config.json").write_text('{"model_type": "llama"}')
    hub.add(_db(api), hub.store_of(None, home), "model", "tiny", str(src), utcnow(), repo_id="acme/tiny")


SPEC = {"name": "chat", "kind": "service", "model": "tiny", "replicas": 0, "resources": {"gpu": "H20", "gpus": 1}}


@pytest.mark.parametrize("how", ["removed", "viewer"])
def test_endpoint_keys_of_a_removed_or_demoted_member_stop_working(api: TestClient, how: str) -> None:
    _, owner, alice, org = team_with_member(api)
    _hub_model(api)
    ep = api.post(f"{API}/endpoints", json={"spec": SPEC, "org": org}, headers=owner.headers).json()["id"]
    seller = signup(api, "seller@example.com")
    op = bearer(admin_token(api))
    api.post(f"{API}/admin/orgs/{seller.org_id}/transactions", json={"amount": "100", "key": "s2"}, headers=op)
    priced = api.post(f"{API}/endpoints", json={"spec": {**SPEC, "name": "shop", "price_per_1m_tokens": "5"}},
                      headers=seller.headers)  # fmt: skip
    assert priced.status_code == 201, priced.text
    own = api.post(f"{API}/endpoints/{ep}/keys", json={"name": "a", "password": "tenant-password"},
                   headers=alice.headers).json()["key"]  # fmt: skip
    buy = api.post(f"{API}/endpoints/{priced.json()['id']}/keys",
                   json={"name": "b", "org": org, "password": "tenant-password"}, headers=alice.headers)  # fmt: skip
    assert buy.status_code == 201, buy.text
    with _db(api).read() as s:
        assert endpoints.authenticate_key(s, own).org_id == org
        assert endpoints.authenticate_key(s, buy.json()["key"]).org_id == org
    if how == "removed":
        assert api.delete(f"{API}/orgs/{org}/members/{alice.user_id}", headers=owner.headers).status_code == 204
    else:
        r = api.patch(f"{API}/orgs/{org}/members/{alice.user_id}", json={"role": "viewer"}, headers=owner.headers)
        assert r.status_code == 200
    for secret in (own, buy.json()["key"]):
        with _db(api).read() as s, pytest.raises(Unauthorized):
            endpoints.authenticate_key(s, secret)


def test_an_unmade_operators_endpoint_key_paid_by_a_foreign_org_stops(api: TestClient) -> None:
    """An operator may make a buyer key that any org pays; unmade, it no longer opens the endpoint."""
    operator, _, _, org = team_with_member(api)
    _hub_model(api)
    seller = signup(api, "seller@example.com")
    api.post(f"{API}/admin/orgs/{seller.org_id}/transactions", json={"amount": "100", "key": "s2"}, headers=operator)
    priced = api.post(f"{API}/endpoints", json={"spec": {**SPEC, "name": "shop", "price_per_1m_tokens": "5"}},
                      headers=seller.headers)  # fmt: skip
    assert priced.status_code == 201, priced.text
    rogue = signup(api, "rogue@example.com")
    assert api.patch(f"{API}/admin/users/{rogue.user_id}", json={"admin": True}, headers=operator).status_code == 200
    key = api.post(f"{API}/endpoints/{priced.json()['id']}/keys",
                   json={"name": "r", "org": org, "password": "tenant-password"}, headers=rogue.headers)  # fmt: skip
    assert key.status_code == 201, key.text
    with _db(api).read() as s:
        assert endpoints.authenticate_key(s, key.json()["key"]).org_id == org
    assert api.patch(f"{API}/admin/users/{rogue.user_id}", json={"admin": False}, headers=operator).status_code == 200
    with _db(api).read() as s, pytest.raises(Unauthorized):
        endpoints.authenticate_key(s, key.json()["key"])


# ---- SSH ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["removed", "viewer", "key-removed"])
def test_open_ssh_connections_are_closed_when_the_grant_ends(api: TestClient, how: str) -> None:
    from suanli.control.workloads.ssh_gateway import DbAccess
    from suanli.ssh.keys import parse
    from suanli.ssh.server import Grant, Refused
    from tests.test_ssh_keys import _ed25519_text

    _, owner, alice, org = team_with_member(api)
    wid = _instance(api, alice, org)
    text = _ed25519_text(7)
    k = api.post(f"{API}/keys", json={"public_key": text, "password": "tenant-password"}, headers=alice.headers)
    assert k.status_code == 201, k.text
    with _db(api).write() as s, s.begin():
        w = s.get(Workload, wid)
        w.state, w.executor, w.handle = "running", "virtual", {"ranks": []}
    key = parse(text)
    access = DbAccess(_db(api))
    grant = asyncio.run(access.authorize(wid, key.fingerprint, key.openssh))
    assert isinstance(grant, Grant) and grant.user_id == alice.user_id
    assert asyncio.run(access.revoked([grant])) == {}
    if how == "removed":
        assert api.delete(f"{API}/orgs/{org}/members/{alice.user_id}", headers=owner.headers).status_code == 204
    elif how == "viewer":
        r = api.patch(f"{API}/orgs/{org}/members/{alice.user_id}", json={"role": "viewer"}, headers=owner.headers)
        assert r.status_code == 200
    else:
        assert api.delete(f"{API}/keys/{k.json()['id']}", headers=alice.headers).status_code == 200
    assert grant in asyncio.run(access.revoked([grant]))
    with pytest.raises(Refused):
        asyncio.run(access.target(grant))  # a new session or forward over the open connection
    assert asyncio.run(access.authorize(wid, key.fingerprint, key.openssh)) is None


# ---- found by the review, now refused -------------------------------------------------------------------
def test_a_pending_invitation_does_not_outgrow_its_makers_lowered_spend_limit(api: TestClient) -> None:
    """An admin may give nobody more than their own spend limit (`_within_own`). An unlimited admin invites a
    second account of theirs with no limit; the owner then caps the admin at 5. The invitation is not cancelled or
    capped then; the second account joins with the admin's limit as it is when it accepts."""
    _, owner, _, org = team_with_member(api)
    adm = signup(api, "adm@example.com")
    join(api, owner, org, adm, "admin")
    sock = signup(api, "sock@example.com")
    inv = api.post(f"{API}/orgs/{org}/invitations", json={"email": sock.email, "role": "member"},
                   headers=adm.headers)  # fmt: skip
    assert inv.status_code == 201, inv.text
    r = api.patch(f"{API}/orgs/{org}/members/{adm.user_id}", json={"monthly_spend_limit": "5"}, headers=owner.headers)
    assert r.status_code == 200, r.text
    r = api.post(f"{API}/invitations/{inv.json()['id']}/accept", headers=sock.headers)
    assert r.status_code == 200, r.text
    members = api.get(f"{API}/orgs/{org}/members", headers=owner.headers).json()
    limit = next(m["monthly_spend_limit"] for m in members if m["user_id"] == sock.user_id)
    assert limit is not None and Decimal(limit) == 5, f"joined with limit {limit} through the admin (capped at 5)"


def test_an_unmade_operators_invitation_no_longer_admits_an_owner(api: TestClient) -> None:
    """An operator may invite anyone into any org, as owner. Unmade (`PATCH /admin/users`), a user keeps no
    operator power: an owner invitation they sent into a team they are not a member of no longer admits."""
    operator, _owner, _, org = team_with_member(api)
    rogue = signup(api, "rogue@example.com")
    r = api.patch(f"{API}/admin/users/{rogue.user_id}", json={"admin": True}, headers=operator)
    assert r.status_code == 200, r.text
    sock = signup(api, "puppet@example.com")
    inv = api.post(f"{API}/orgs/{org}/invitations", json={"email": sock.email, "role": "owner"},
                   headers=rogue.headers)  # fmt: skip
    assert inv.status_code == 201, inv.text
    r = api.patch(f"{API}/admin/users/{rogue.user_id}", json={"admin": False}, headers=operator)
    assert r.status_code == 200, r.text
    r = api.post(f"{API}/invitations/{inv.json()['id']}/accept", headers=sock.headers)
    orgs = {o["id"]: o["role"] for o in api.get(f"{API}/me", headers=sock.headers).json()["orgs"]}
    assert r.status_code in (404, 409) and org not in orgs, (r.status_code, r.text, orgs)


def test_a_password_reset_revokes_the_endpoint_keys_the_account_made(api: TestClient) -> None:
    """A reset (and `suanli admin set-password`) revokes every token and removes the SSH keys, because whoever had
    the account before may have added one; it revokes the endpoint keys the account made too: a thief who held the
    account made a buyer key on their own priced endpoint, paid by the victim's org."""
    from suanli.control.accounts import accounts, password_resets
    from suanli.control.errors import Unauthorized
    from suanli.control.serving import endpoints
    from suanli.control.storage import hub

    operator = bearer(admin_token(api))
    assert api.post(f"{API}/admin/clusters", json={"preset": "1x8:H20"}, headers=operator).status_code == 201
    thief, victim = signup(api, "thief@example.com"), signup(api, "victim@example.com")
    for t in (thief, victim):
        r = api.post(f"{API}/admin/orgs/{t.org_id}/transactions", json={"amount": "100", "key": f"s{t.user_id}"},
                     headers=operator)  # fmt: skip
        assert r.status_code == 201, r.text
    home = api.app.state.server.settings.home  # type: ignore[attr-defined]
    db = api.app.state.server.db  # type: ignore[attr-defined]
    src = home / "tiny-src"
    src.mkdir(parents=True)
    (src / "config.json").write_text('{"model_type": "llama"}')
    hub.add(db, hub.store_of(None, home), "model", "tiny", str(src), utcnow(), repo_id="acme/tiny")
    spec = {"name": "shop", "kind": "service", "model": "tiny", "replicas": 0, "price_per_1m_tokens": "1000",
            "resources": {"gpu": "H20", "gpus": 1}}  # fmt: skip
    ep = api.post(f"{API}/endpoints", json={"spec": spec}, headers=thief.headers)
    assert ep.status_code == 201, ep.text
    # with the victim's stolen credentials: a buyer key that the victim's personal org pays for
    key = api.post(f"{API}/endpoints/{ep.json()['id']}/keys", json={"name": "x", "password": "tenant-password"},
                   headers=victim.headers)  # fmt: skip
    assert key.status_code == 201, key.text
    secret = key.json()["key"]
    with db.read() as s:
        assert endpoints.authenticate_key(s, secret).org_id == victim.org_id
    with db.write() as s, s.begin():  # the victim regains the account (what the reset route and the CLI run)
        password_resets.set_password(s, victim.user_id, accounts.hash_password("brand-new-pass"), utcnow(),
                                     drop_ssh_keys=True)  # fmt: skip
    api.app.state.server.tokens.forget_all()  # type: ignore[attr-defined]  # as the routes do after a reset
    assert api.get(f"{API}/me", headers=victim.headers).status_code == 401  # the thief's tokens are dead
    with db.read() as s, pytest.raises(Unauthorized):
        endpoints.authenticate_key(s, secret)


def test_a_proxy_session_reaches_no_port_once_its_workload_runs_off_this_host(api: TestClient, tmp_path: Path) -> None:
    """A ticket is refused for work on Ray or Slurm nodes; a session opened while the work ran here must not carry
    over to an attempt placed there: its sandbox record names pids of another host, which the listener check would
    read as this host's."""
    from sqlalchemy import update

    from suanli.control.errors import Conflict

    _, _, alice, org = team_with_member(api)
    spec = {"name": "ported", "kind": "instance", "command": "x", "resources": {"gpus": 0}, "ports": [8080]}
    r = api.post(f"{API}/workloads", json={"spec": spec, "org": org}, headers=alice.headers)
    assert r.status_code == 201, r.text
    wid = r.json()["id"]
    handle = {"ranks": [{"node_rank": 0, "sandbox_file": str(tmp_path / "rank-0.sandbox.json")}]}
    with _db(api).write() as s, s.begin():
        s.execute(update(Workload).where(Workload.id == wid).values(state="running", executor="local", handle=handle))
    with _db(api).read() as s:
        assert proxy.upstream(s, tmp_path, wid, "port:8080").port == 8080
    with _db(api).write() as s, s.begin():
        s.execute(update(Workload).where(Workload.id == wid).values(executor="ray"))
    with _db(api).read() as s, pytest.raises(Conflict, match="runs on ray nodes"):
        proxy.upstream(s, tmp_path, wid, "port:8080")

"""Issue: anyone could add anyone to their org, even as owner, and any member could spend the team's money and stop
other members' work; adding a member, creating an org and signing up told which emails are registered; signup
could not be closed. Attacks first; in-process on both databases."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from suanli.api.app import create_app
from suanli.billing.ledger import REVENUE, org_account, transfer
from suanli.control.accounts import memberships, spend_limits
from suanli.control.ids import utcnow
from suanli.control.money import ledger
from suanli.control.settings import load
from suanli.db.access import Invitation
from tests.control_plane import Tenant, admin_token, bearer, join, settings, signup

API = "/api/v1"
JOB = {"name": "train", "command": "sleep 100", "resources": {"gpus": 0}}


@dataclass
class Team:
    id: str
    owner: Tenant
    admin: Tenant
    alice: Tenant  # a member
    bob: Tenant  # a member
    viewer: Tenant
    operator: dict[str, str]


@pytest.fixture
def team(api: TestClient) -> Team:
    operator = bearer(admin_token(api))
    assert api.post(f"{API}/admin/clusters", json={"preset": "1x8:H20"}, headers=operator).status_code == 201
    owner, adm, alice, bob, viewer = (signup(api, f"{n}@example.com") for n in ("owner", "admin", "alice", "bob",
                                                                                "viewer"))  # fmt: skip
    org = api.post(f"{API}/orgs", json={"name": "lab"}, headers=owner.headers).json()["id"]
    for who, role in ((adm, "admin"), (alice, "member"), (bob, "member"), (viewer, "viewer")):
        join(api, owner, org, who, role)
    r = api.post(f"{API}/admin/orgs/{org}/transactions", json={"amount": "100"}, headers=operator)
    assert r.status_code == 201, r.text
    return Team(org, owner, adm, alice, bob, viewer, operator)


def _submit(api: TestClient, who: Tenant, org: str, name: str = "train") -> Any:
    return api.post(f"{API}/workloads", json={"spec": {**JOB, "name": name}, "org": org}, headers=who.headers)


def _role(api: TestClient, t: Team, user: Tenant) -> str:
    return next(m["role"] for m in api.get(f"{API}/orgs/{t.id}/members", headers=t.owner.headers).json()
                if m["user_id"] == user.user_id)  # fmt: skip


# ---- consent --------------------------------------------------------------------------------------------------
def test_nobody_is_added_without_consent(api: TestClient) -> None:
    mallory, victim = signup(api, "mallory@example.com"), signup(api, "victim@example.com")
    evil = api.post(f"{API}/orgs", json={"name": "evil"}, headers=mallory.headers).json()["id"]
    assert api.post(f"{API}/orgs/{evil}/members", json={"email": victim.email}, headers=mallory.headers
                    ).status_code in (404, 405), "no route adds a member directly"  # fmt: skip
    inv = api.post(f"{API}/orgs/{evil}/invitations", json={"email": victim.email, "role": "owner"},
                   headers=mallory.headers).json()  # fmt: skip
    assert inv["state"] == "pending"
    assert evil not in {o["id"] for o in api.get(f"{API}/me", headers=victim.headers).json()["orgs"]}
    assert [m["email"] for m in api.get(f"{API}/orgs/{evil}/members", headers=mallory.headers).json()] == [
        mallory.email]  # fmt: skip
    # Another user cannot accept it in the victim's name, not even the inviter.
    for who in (mallory, signup(api, "other@example.com")):
        r = api.post(f"{API}/invitations/{inv['id']}/accept", headers=who.headers)
        assert r.status_code == 404, r.text
    r = api.post(f"{API}/invitations/{inv['id']}/decline", headers=victim.headers)
    assert r.status_code == 200 and r.json()["state"] == "declined"
    r = api.post(f"{API}/invitations/{inv['id']}/accept", headers=victim.headers)
    assert r.status_code == 409 and "declined" in r.json()["detail"]
    assert evil not in {o["id"] for o in api.get(f"{API}/me", headers=victim.headers).json()["orgs"]}
    assert api.get(f"{API}/invitations", headers=victim.headers).json() == []


def test_an_expired_or_cancelled_invitation_cannot_be_accepted(api: TestClient) -> None:
    owner, guest = signup(api, "owner@example.com"), signup(api, "guest@example.com")
    org = api.post(f"{API}/orgs", json={"name": "lab"}, headers=owner.headers).json()["id"]
    first = api.post(f"{API}/orgs/{org}/invitations", json={"email": guest.email}, headers=owner.headers).json()
    with api.app.state.server.db.write() as s, s.begin():  # type: ignore[attr-defined]
        s.get(Invitation, first["id"]).expires_at = utcnow() - timedelta(seconds=1)
    r = api.post(f"{API}/invitations/{first['id']}/accept", headers=guest.headers)
    assert r.status_code == 409 and "expired" in r.json()["detail"]
    second = api.post(f"{API}/orgs/{org}/invitations", json={"email": guest.email}, headers=owner.headers).json()
    assert api.delete(f"{API}/orgs/{org}/invitations/{second['id']}", headers=owner.headers).json()["state"] == (
        "cancelled")  # fmt: skip
    assert api.post(f"{API}/invitations/{second['id']}/accept", headers=guest.headers).status_code == 409
    assert api.get(f"{API}/orgs/{org}/invitations", headers=owner.headers).json() == []


# ---- privacy: nothing says which emails are registered ----------------------------------------------------------
def _shape(r: Any) -> tuple[int, list[str], dict[str, Any]]:
    body = r.json()
    same = {k: v for k, v in body.items() if k not in ("id", "email", "code", "created_at", "expires_at")}
    return r.status_code, sorted(body), same


def test_inviting_answers_the_same_for_registered_and_unknown_emails(api: TestClient) -> None:
    owner = signup(api, "owner@example.com")
    signup(api, "bob@example.com")
    org = api.post(f"{API}/orgs", json={"name": "lab"}, headers=owner.headers).json()["id"]
    known = api.post(f"{API}/orgs/{org}/invitations", json={"email": "bob@example.com"}, headers=owner.headers)
    ghost = api.post(f"{API}/orgs/{org}/invitations", json={"email": "ghost@example.com"}, headers=owner.headers)
    assert known.status_code == 201 and _shape(known) == _shape(ghost)
    assert "no user" not in ghost.text and "registered" not in ghost.text
    listed = api.get(f"{API}/orgs/{org}/invitations", headers=owner.headers).json()
    assert {i["email"]: i["state"] for i in listed} == {"bob@example.com": "pending", "ghost@example.com": "pending"}


def test_creating_an_org_named_like_an_email_answers_alike_whoever_registered_it(api: TestClient) -> None:
    mallory = signup(api, "mallory@example.com")
    signup(api, "bob@example.com")
    known = api.post(f"{API}/orgs", json={"name": "bob@example.com"}, headers=mallory.headers)
    ghost = api.post(f"{API}/orgs", json={"name": "ghost@example.com"}, headers=mallory.headers)
    assert known.status_code == ghost.status_code == 422 and known.json() == ghost.json()
    api.post(f"{API}/orgs", json={"name": "lab"}, headers=mallory.headers)
    taken = api.post(f"{API}/orgs", json={"name": "lab"}, headers=signup(api, "eve@example.com").headers)
    assert taken.status_code == 409 and "exists" not in taken.text and "lab" not in taken.json()["detail"]


def test_signup_with_a_taken_email_does_not_say_it_is_registered(api: TestClient) -> None:
    signup(api, "bob@example.com")
    r = api.post(f"{API}/signup", json={"email": "bob@example.com", "password": "another-password"})
    assert r.status_code == 409 and "registered" not in r.text and "bob" not in r.text


# ---- roles ------------------------------------------------------------------------------------------------------
def test_a_member_cannot_stop_another_members_work(api: TestClient, team: Team) -> None:
    t = team
    theirs = _submit(api, t.alice, t.id, "alices")
    assert theirs.status_code == 201, theirs.text
    wid = theirs.json()["id"]
    r = api.post(f"{API}/workloads/{wid}/stop", headers=t.bob.headers)
    assert r.status_code == 403 and "another member's work" in r.json()["detail"], r.text
    assert api.get(f"{API}/workloads/{wid}", headers=t.bob.headers).json()["state"] == "pending"
    r = api.post(f"{API}/workloads/{wid}/stop", headers=t.viewer.headers)
    assert r.status_code == 403
    assert api.post(f"{API}/workloads/{wid}/stop", headers=t.admin.headers).json()["state"] == "stopped"
    own = _submit(api, t.bob, t.id, "bobs").json()["id"]
    assert api.post(f"{API}/workloads/{own}/stop", headers=t.bob.headers).json()["state"] == "stopped"


def test_a_viewer_reads_only(api: TestClient, team: Team) -> None:
    t = team
    r = _submit(api, t.viewer, t.id)
    assert r.status_code == 403 and "viewer cannot submit" in r.json()["detail"], r.text
    r = api.post(f"{API}/orgs/{t.id}/plans", json={"plan": "hourly", "gpu": "H20", "gpus": 1}, headers=t.viewer.headers)
    assert r.status_code == 403 and "viewer cannot spend" in r.json()["detail"], r.text
    r = api.post(f"{API}/orgs/{t.id}/invitations", json={"email": "x@example.com"}, headers=t.viewer.headers)
    assert r.status_code == 403
    for path in ("", "/balance", "/members", "/transactions", "/usage", "/plans"):
        assert api.get(f"{API}/orgs/{t.id}{path}", headers=t.viewer.headers).status_code == 200, path
    assert api.get(f"{API}/workloads", params={"org": t.id}, headers=t.viewer.headers).status_code == 200
    balance = api.get(f"{API}/orgs/{t.id}/balance", headers=t.owner.headers).json()["exact"]
    assert balance == "100.00000000"


def test_an_admin_cannot_demote_or_remove_the_owner_nor_raise_itself(api: TestClient, team: Team) -> None:
    t = team
    members = f"{API}/orgs/{t.id}/members"
    r = api.patch(f"{members}/{t.owner.user_id}", json={"role": "member"}, headers=t.admin.headers)
    assert r.status_code == 403 and "owners" in r.json()["detail"], r.text
    assert api.delete(f"{members}/{t.owner.user_id}", headers=t.admin.headers).status_code == 403
    r = api.patch(f"{members}/{t.admin.user_id}", json={"role": "owner"}, headers=t.admin.headers)
    assert r.status_code == 403
    r = api.patch(f"{members}/{t.admin.user_id}", json={"monthly_spend_limit": None}, headers=t.admin.headers)
    assert r.status_code == 403 and "your own" in r.json()["detail"]
    r = api.post(f"{API}/orgs/{t.id}/invitations", json={"email": "x@example.com", "role": "owner"},
                 headers=t.admin.headers)  # fmt: skip
    assert r.status_code == 403
    # The last owner cannot step down, even by their own hand; with a second owner they can.
    r = api.patch(f"{members}/{t.owner.user_id}", json={"role": "admin"}, headers=t.owner.headers)
    assert r.status_code == 409 and "at least one owner" in r.json()["detail"]
    assert _role(api, t, t.owner) == "owner"
    # What an admin may do: members below owner, their roles and limits.
    r = api.patch(f"{members}/{t.alice.user_id}", json={"role": "viewer"}, headers=t.admin.headers)
    assert r.status_code == 200 and r.json()["role"] == "viewer"
    assert api.delete(f"{members}/{t.bob.user_id}", headers=t.admin.headers).status_code == 204
    assert api.patch(f"{members}/{t.admin.user_id}", json={"role": "owner"}, headers=t.owner.headers).status_code == 200
    assert (
        api.patch(f"{members}/{t.owner.user_id}", json={"role": "member"}, headers=t.owner.headers).status_code == 200
    )


def test_two_owners_demoting_each_other_leave_one(db: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from suanli.control.accounts import accounts
    from suanli.control.accounts.accounts import Principal

    now = utcnow()
    with db.write() as s, s.begin():
        users = [accounts.create_user(s, f"o{i}@example.com", "password-123", now)[0] for i in range(2)]
        who = [Principal(u.id, u.email, False, u.personal_org_id, "tok") for u in users]
        org = accounts.create_org(s, who[0], "lab", now).id
        inv, _ = memberships.invite(s, who[0], org, who[1].email, "owner", None, now)
        memberships.accept(s, who[1], inv.id, now)

    def demote(i: int) -> str:
        try:
            with db.write() as s, s.begin():
                memberships.set_member(s, who[i], org, who[1 - i].user_id, role="member")
            return "ok"
        except (memberships.Conflict, memberships.Forbidden):  # no owner left to demote; or no longer one
            return "refused"

    with ThreadPoolExecutor(2) as pool:
        outcomes = sorted(pool.map(demote, range(2)))
    with db.read() as s:
        roles = sorted(m.role for m in s.query(memberships.Membership).filter_by(org_id=org))
    assert outcomes == ["ok", "refused"] and roles == ["member", "owner"], (outcomes, roles)


# ---- spend limits -----------------------------------------------------------------------------------------------
def _charge(api: TestClient, t: Team, who: Tenant, amount: str, key: str, when: Any = None) -> None:
    """Usage of `who`'s work posted to the team's account (as metering would)."""
    with api.app.state.server.db.write() as s, s.begin():  # type: ignore[attr-defined]
        tx = transfer(key, "usage", org_account(t.id), REVENUE, Decimal(amount), "usage")
        ledger.post(s, tx, when or utcnow(), org_id=t.id, user_id=who.user_id, allow_negative=[org_account(t.id)])


def test_a_member_over_their_spend_limit_is_refused_with_the_reason(api: TestClient, team: Team) -> None:
    t = team
    members = f"{API}/orgs/{t.id}/members"
    r = api.patch(f"{members}/{t.alice.user_id}", json={"monthly_spend_limit": "10.00"}, headers=t.admin.headers)
    assert r.status_code == 200 and r.json()["monthly_spend_limit"] == "10.00000000"
    last_month = spend_limits.month_start(utcnow()) - timedelta(seconds=1)
    _charge(api, t, t.alice, "50", "old", last_month)  # last month's charges do not count
    _charge(api, t, t.alice, "9.99", "now")
    _charge(api, t, t.bob, "5", "bobs")  # nor do another member's
    row = next(m for m in api.get(members, headers=t.alice.headers).json() if m["user_id"] == t.alice.user_id)
    assert row["month_to_date"] == "9.99000000"
    r = _submit(api, t.alice, t.id)
    assert r.status_code == 403, r.text
    why = r.json()["detail"]
    assert why.startswith("monthly_spend_limit: you may spend 10.00") and "9.99 is charged this month" in why, why
    before = api.get(f"{API}/orgs/{t.id}/balance", headers=t.owner.headers).json()["exact"]
    r = api.post(f"{API}/orgs/{t.id}/plans", json={"plan": "hourly", "gpu": "H20", "gpus": 1}, headers=t.alice.headers)
    assert r.status_code == 403 and r.json()["detail"].startswith("monthly_spend_limit"), r.text
    assert api.get(f"{API}/orgs/{t.id}/balance", headers=t.owner.headers).json()["exact"] == before, "nothing charged"
    assert _submit(api, t.bob, t.id, "bobs").status_code == 201, "a member without a limit is not held back"
    api.patch(f"{members}/{t.alice.user_id}", json={"monthly_spend_limit": "20"}, headers=t.owner.headers)
    assert _submit(api, t.alice, t.id).status_code == 201
    api.patch(f"{members}/{t.alice.user_id}", json={"monthly_spend_limit": None}, headers=t.owner.headers)
    assert _submit(api, t.alice, t.id, "again").status_code == 201


@pytest.mark.parametrize("limit", [-1, "-0.01", "1000000001", 1.5, "1e400", "0.000000001"])
def test_a_bad_spend_limit_is_a_422_naming_it(api: TestClient, team: Team, limit: object) -> None:
    r = api.patch(f"{API}/orgs/{team.id}/members/{team.alice.user_id}", json={"monthly_spend_limit": limit},
                  headers=team.owner.headers)  # fmt: skip
    assert r.status_code == 422 and "monthly_spend_limit" in r.json()["detail"], r.text


# ---- signup: open, invite, closed -------------------------------------------------------------------------------
@pytest.fixture
def make_api(db_url: str, tmp_path: Path, cheap_password_hashing: None) -> Any:
    clients = []

    def make(**overrides: Any) -> TestClient:
        c = TestClient(create_app(settings(tmp_path / f"home{len(clients)}", db_url, **overrides)))
        clients.append(c.__enter__())
        return c

    yield make
    for c in clients:
        c.__exit__(None, None, None)


def _signup(api: TestClient, email: str, invite: str | None = None) -> Any:
    body = {"email": email, "password": "long-password", **({"invite": invite} if invite else {})}
    return api.post(f"{API}/signup", json=body)


def test_signup_closed_and_the_setting_from_the_environment(make_api: Any) -> None:
    assert load({"home": "/nonexistent"}, environ={"SUANLI_SIGNUP": "invite"}).signup == "invite"
    api = make_api(signup="closed")
    r = _signup(api, "new@example.com")
    assert r.status_code == 403 and "closed" in r.json()["detail"]
    operator = bearer(admin_token(api))
    r = api.post(f"{API}/admin/users", json={"email": "new@example.com", "password": "long-password"}, headers=operator)
    assert r.status_code == 201, "operators still create users"


def test_signup_by_invitation_only(make_api: Any) -> None:
    api = make_api(signup="invite")
    operator = bearer(admin_token(api))
    assert _signup(api, "new@example.com").status_code == 403
    assert _signup(api, "new@example.com", "si_guessed").status_code == 403
    # An operator's code: as many signups as it has uses, and a failed signup uses nothing up.
    code = api.post(f"{API}/admin/invites", json={"uses": 1, "note": "for new"}, headers=operator).json()
    assert code["uses_left"] == 1 and code["code"].startswith("si_")
    taken = _signup(api, "ops@example.com", code["code"])
    assert taken.status_code == 409 and "cannot sign up with these details" in taken.json()["detail"]
    first = _signup(api, "new@example.com", code["code"])
    assert first.status_code == 201, first.text
    second = _signup(api, "newer@example.com", code["code"])
    assert second.status_code == 403 and second.json()["detail"].startswith("invite: not a valid")
    # An invitation's code signs up the email it was made out to (and no other), who joins the org.
    owner = first.json()["token"]
    org = api.post(f"{API}/orgs", json={"name": "lab"}, headers=bearer(owner)).json()["id"]
    inv = api.post(f"{API}/orgs/{org}/invitations", json={"email": "hire@example.com", "role": "viewer"},
                   headers=bearer(owner)).json()  # fmt: skip
    assert _signup(api, "mallory@example.com", inv["code"]).status_code == 403
    hired = _signup(api, "hire@example.com", inv["code"])
    assert hired.status_code == 201, hired.text
    orgs = api.get(f"{API}/me", headers=bearer(hired.json()["token"])).json()["orgs"]
    assert {(o["id"], o["role"]) for o in orgs} >= {(org, "viewer")}
    # A revoked operator's code signs nobody up.
    spare = api.post(f"{API}/admin/invites", json={"uses": 5}, headers=operator).json()
    assert api.delete(f"{API}/admin/invites/{spare['id']}", headers=operator).json()["revoked_at"] is not None
    assert _signup(api, "late@example.com", spare["code"]).status_code == 403
    listing = api.get(f"{API}/admin/invites", headers=operator).json()
    assert {c["id"]: c["uses_left"] for c in listing} == {code["id"]: 0, spare["id"]: 5}
    assert all("code" not in c for c in listing), "shown once, at creation"

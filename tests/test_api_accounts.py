"""Accounts over HTTP: sign-up and its trial credit, login, the caller, API tokens, team organisations.

Every test runs in-process on SQLite and on PostgreSQL (the `api` fixture)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.control_plane import Tenant, bearer, join, signup

API = "/api/v1"


def _detail(r: Any) -> str:
    body = r.json()
    assert isinstance(body.get("detail"), str) and body["detail"], r.text
    return body["detail"]


# ---- sign-up and login ----------------------------------------------------------------------------------------
def test_signup_gives_trial_credit_and_a_working_token(api: Any) -> None:
    r = api.post(f"{API}/signup", json={"email": "Alice@Example.com", "password": "correct-horse"})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["balance"] == "10.00" and body["currency"] == "CNY"
    assert body["user"]["email"] == "alice@example.com"  # normalised
    assert body["org"]["personal"] is True and body["org"]["role"] == "owner"
    assert body["org"]["id"] == body["user"]["personal_org_id"]
    me = api.get(f"{API}/me", headers=bearer(body["token"]))
    assert me.status_code == 200, me.text
    assert me.json()["user"]["id"] == body["user"]["id"]
    bal = api.get(f"{API}/orgs/{body['org']['id']}/balance", headers=bearer(body["token"])).json()
    assert (bal["balance"], bal["exact"], bal["currency"]) == ("10.00", "10.00000000", "CNY")


def test_duplicate_email_is_a_conflict_that_does_not_say_registered(api: Any) -> None:
    signup(api, "bob@example.com")
    for email in ("bob@example.com", "  BOB@example.COM "):
        r = api.post(f"{API}/signup", json={"email": email, "password": "another-password"})
        assert r.status_code == 409, r.text
        assert _detail(r).startswith("signup: cannot sign up with these details"), r.text
        assert "registered" not in r.text and "bob" not in r.text.lower()
        assert "reset link" in _detail(r)  # the address's owner, whoever took it first, has a way back in


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"email": "not-an-email", "password": "long-enough-1"}, "email"),
        ({"email": "a b@example.com", "password": "long-enough-1"}, "email"),
        ({"email": "carol@example.com", "password": "short"}, "password"),
        ({"email": "carol@example.com", "password": ""}, "password"),
        ({"email": "carol@example.com"}, "password"),
        ({"password": "long-enough-1"}, "email"),
    ],
)
def test_bad_signup_is_422_naming_the_field(api: Any, body: dict[str, str], field: str) -> None:
    r = api.post(f"{API}/signup", json=body)
    assert r.status_code == 422, r.text
    assert _detail(r).startswith(field), r.text


def test_login_wrong_password_is_401_and_does_not_reveal_which_part_was_wrong(api: Any) -> None:
    signup(api, "dave@example.com", "dave-password")
    wrong = api.post(f"{API}/login", json={"email": "dave@example.com", "password": "not-dave-password"})
    unknown = api.post(f"{API}/login", json={"email": "nobody@example.com", "password": "dave-password"})
    assert wrong.status_code == unknown.status_code == 401
    assert _detail(wrong) == _detail(unknown)
    ok = api.post(f"{API}/login", json={"email": "DAVE@example.com", "password": "dave-password"})
    assert ok.status_code == 200, ok.text
    assert api.get(f"{API}/me", headers=bearer(ok.json()["token"])).status_code == 200


def test_me_lists_the_personal_org_as_owner(api: Any) -> None:
    t = signup(api, "erin@example.com")
    me = api.get(f"{API}/me", headers=t.headers).json()
    assert me["user"]["email"] == "erin@example.com" and me["user"]["is_admin"] is False
    assert [(o["id"], o["personal"], o["role"]) for o in me["orgs"]] == [(t.org_id, True, "owner")]


# ---- tokens ---------------------------------------------------------------------------------------------------
def test_token_is_shown_once_and_listed_by_prefix_only(api: Any) -> None:
    t = signup(api, "frank@example.com")
    r = api.post(f"{API}/tokens", json={"name": "ci", "expires_in_days": 7}, headers=t.headers)
    assert r.status_code == 201, r.text
    new = r.json()
    assert new["token"].startswith("sl_") and new["token"].startswith(new["prefix"])
    assert len(new["prefix"]) < len(new["token"]) and new["expires_at"] is not None
    listed = api.get(f"{API}/tokens", headers=t.headers)
    assert new["token"] not in listed.text
    rows = {row["id"]: row for row in listed.json()}
    assert set(rows) >= {new["id"]} and "token" not in rows[new["id"]]
    assert rows[new["id"]]["prefix"] == new["prefix"] and rows[new["id"]]["name"] == "ci"
    assert api.get(f"{API}/me", headers=bearer(new["token"])).json()["user"]["id"] == t.user_id


@pytest.mark.parametrize("days", [0, -1, -36500, 3651, "soon", 1.5])
def test_token_expiry_must_be_in_the_future_and_bounded(api: Any, days: object) -> None:
    t = signup(api, "gina@example.com")
    r = api.post(f"{API}/tokens", json={"name": "x", "expires_in_days": days}, headers=t.headers)
    assert r.status_code == 422, r.text
    assert _detail(r).startswith("expires_in_days"), r.text


def test_revoked_token_gets_401_and_others_keep_working(api: Any) -> None:
    t = signup(api, "hank@example.com")
    new = api.post(f"{API}/tokens", json={"name": "laptop", "expires_in_days": 7}, headers=t.headers).json()
    assert api.get(f"{API}/me", headers=bearer(new["token"])).status_code == 200
    r = api.delete(f"{API}/tokens/{new['id']}", headers=t.headers)
    assert r.status_code == 200, r.text
    assert r.json()["revoked_at"] is not None
    denied = api.get(f"{API}/me", headers=bearer(new["token"]))
    assert denied.status_code == 401 and "revoked" in _detail(denied)
    assert api.get(f"{API}/me", headers=t.headers).status_code == 200
    again = api.delete(f"{API}/tokens/{new['id']}", headers=t.headers)  # idempotent
    assert again.status_code == 200 and again.json()["revoked_at"] == r.json()["revoked_at"]


def test_logout_revokes_only_the_current_token(api: Any) -> None:
    t = signup(api, "ivan@example.com")
    other = api.post(f"{API}/tokens", json={"name": "other", "expires_in_days": 7}, headers=t.headers).json()
    assert api.post(f"{API}/logout", headers=t.headers).status_code == 204
    assert api.get(f"{API}/me", headers=t.headers).status_code == 401
    assert api.post(f"{API}/logout", headers=t.headers).status_code == 401
    rows = {row["name"]: row for row in api.get(f"{API}/tokens", headers=bearer(other["token"])).json()}
    assert rows["login"]["revoked_at"] is not None and rows["other"]["revoked_at"] is None


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ({}, "missing bearer token"),
        ({"Authorization": ""}, "missing bearer token"),
        ({"Authorization": "Bearer"}, "missing bearer token"),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, "missing bearer token"),
        ({"Authorization": "Bearer garbage"}, "not a suanli token"),
        ({"Authorization": "Bearer sl_" + "A" * 43}, "unknown token"),
        ({"Authorization": "Bearer sl_\u00e9\u00e9".encode()}, "unknown token"),  # raw UTF-8 bytes
    ],
)
def test_missing_or_garbage_authorization_is_401_with_a_message(api: Any, headers: dict[str, Any], says: str) -> None:
    for method, path in (("GET", "/me"), ("GET", "/tokens"), ("POST", "/orgs"), ("GET", "/offers")):
        r = api.request(method, f"{API}{path}", headers=headers, json={"name": "team"} if method == "POST" else None)
        assert r.status_code == 401, (path, r.text)
        assert says in _detail(r), (path, r.text)
        assert r.headers.get("www-authenticate", "").lower().startswith("bearer")


# ---- team organisations --------------------------------------------------------------------------------------
def _team(api: Any, owner: Tenant, name: str = "lab") -> str:
    r = api.post(f"{API}/orgs", json={"name": name}, headers=owner.headers)
    assert r.status_code == 201, r.text
    assert (r.json()["personal"], r.json()["role"]) == (False, "owner")
    return r.json()["id"]


def test_team_org_members_and_owners(api: Any) -> None:
    owner, member, outsider = (signup(api, f"{n}@example.com") for n in ("olga", "max", "nina"))
    org = _team(api, owner)
    assert api.post(f"{API}/orgs", json={"name": "lab"}, headers=member.headers).status_code == 409

    r = api.post(f"{API}/orgs/{org}/invitations", json={"email": "MAX@example.com"}, headers=owner.headers)
    assert r.status_code == 201, r.text
    assert (r.json()["email"], r.json()["role"], r.json()["state"]) == ("max@example.com", "member", "pending")
    assert api.get(f"{API}/orgs/{org}/balance", headers=member.headers).status_code == 404, "not before accepting"
    mine = api.get(f"{API}/invitations", headers=member.headers).json()
    assert [(i["id"], i["org_name"], i["invited_by"]) for i in mine] == [(r.json()["id"], "lab", owner.email)]
    joined = api.post(f"{API}/invitations/{mine[0]['id']}/accept", headers=member.headers)
    assert joined.status_code == 200 and (joined.json()["id"], joined.json()["role"]) == (org, "member")
    members = api.get(f"{API}/orgs/{org}/members", headers=member.headers).json()
    assert {(m["email"], m["role"]) for m in members} == {("olga@example.com", "owner"), ("max@example.com", "member")}

    bal = api.get(f"{API}/orgs/{org}/balance", headers=member.headers)
    assert bal.status_code == 200 and bal.json()["org_id"] == org and bal.json()["balance"] == "0.00"
    assert org in {o["id"] for o in api.get(f"{API}/me", headers=member.headers).json()["orgs"]}

    for path in ("", "/balance", "/members", "/transactions", "/usage", "/invitations"):
        r = api.get(f"{API}/orgs/{org}{path}", headers=outsider.headers)
        assert r.status_code == 404, (path, r.text)
        assert org in _detail(r)

    r = api.post(f"{API}/orgs/{org}/invitations", json={"email": "nina@example.com"}, headers=member.headers)
    assert r.status_code == 403 and "member cannot invite" in _detail(r)
    r = api.delete(f"{API}/orgs/{org}/members/{owner.user_id}", headers=member.headers)
    assert r.status_code == 403
    r = api.post(f"{API}/orgs/{owner.org_id}/invitations", json={"email": "max@example.com"}, headers=owner.headers)
    assert r.status_code == 409, "a personal organisation has one member"

    r = api.delete(f"{API}/orgs/{org}/members/{owner.user_id}", headers=owner.headers)
    assert r.status_code == 409 and "owner" in _detail(r)
    assert api.delete(f"{API}/orgs/{org}/members/{member.user_id}", headers=owner.headers).status_code == 204
    assert api.get(f"{API}/orgs/{org}/balance", headers=member.headers).status_code == 404
    assert api.get(f"{API}/orgs/{org}/members", headers=owner.headers).json()[0]["user_id"] == owner.user_id


def test_a_second_owner_lets_the_first_leave(api: Any) -> None:
    owner, other = signup(api, "pam@example.com"), signup(api, "quinn@example.com")
    org = _team(api, owner, "ops")
    join(api, owner, org, other, "owner")
    assert {m["role"] for m in api.get(f"{API}/orgs/{org}/members", headers=owner.headers).json()} == {"owner"}
    assert api.delete(f"{API}/orgs/{org}/members/{owner.user_id}", headers=other.headers).status_code == 204
    assert api.get(f"{API}/orgs/{org}", headers=owner.headers).status_code == 404
    r = api.delete(f"{API}/orgs/{org}/members/{other.user_id}", headers=other.headers)
    assert r.status_code == 409


def test_trial_credit_is_granted_once_per_user(api: Any) -> None:
    t = signup(api, "rita@example.com", "rita-password")
    assert api.post(f"{API}/signup", json={"email": t.email, "password": "rita-password"}).status_code == 409
    for _ in range(2):
        assert api.post(f"{API}/login", json={"email": t.email, "password": "rita-password"}).status_code == 200
    team = _team(api, t, "rita-team")
    txs = api.get(f"{API}/orgs/{t.org_id}/transactions", headers=t.headers).json()
    trial = [x for x in txs if x["kind"] == "trial_credit"]
    assert len(trial) == 1 and trial[0]["amount"] == "10.00000000"
    assert trial[0]["key"].endswith(t.user_id)
    assert api.get(f"{API}/orgs/{t.org_id}/balance", headers=t.headers).json()["balance"] == "10.00"
    assert api.get(f"{API}/orgs/{team}/transactions", headers=t.headers).json() == []
    assert api.get(f"{API}/orgs/{team}/balance", headers=t.headers).json()["balance"] == "0.00"

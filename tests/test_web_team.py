"""The team page in-process on SQLite and PostgreSQL: a team made, a member invited and accepting, roles changed
and members removed as the API allows; a member without the role sees the API's refusal; another org's people
never shown or touched; bad input at the field; CSRF."""

from __future__ import annotations

from typing import Any

import pytest

from tests.control_plane import bearer, signup
from tests.web_helpers import Console, sqlite_db_url  # noqa: F401  (sqlite_db_url: the db_url fixture)

EN = {"Accept-Language": "en"}


def _console(api: Any, email: str) -> Console:
    c = Console(type(api)(api.app))
    c.signup(email)
    return c


def _me(c: Console) -> dict[str, Any]:
    return c.c.get("/api/v1/me", headers=bearer(c.c.cookies.get("suanli_session"))).json()


def _team(api: Any) -> tuple[Console, Console, str]:
    """An owner's team with a member who accepted through the pages."""
    owner = _console(api, "owner@example.com")
    assert owner.post("/team/orgs", {"name": "lab"}, csrf_from="/team").status_code == 303
    r = owner.post("/team/invitations", {"email": "member@example.com", "role": "member"}, csrf_from="/team",
                   headers=EN)  # fmt: skip
    assert r.status_code == 303 and 'id="new-invitation"' in owner.get("/team").text
    member = _console(api, "member@example.com")
    mine = member.get("/team", headers=EN).text
    assert 'id="my-invitations"' in mine and "lab" in mine
    inv = member.c.get("/api/v1/invitations", headers=bearer(member.c.cookies.get("suanli_session"))).json()[0]
    assert member.post(f"/team/mine/{inv['id']}/accept", csrf_from="/team").status_code == 303
    team = next(o["id"] for o in _me(owner)["orgs"] if o["name"] == "lab")
    return owner, member, team


def test_invite_accept_change_role_and_remove(api: Any) -> None:
    owner, member, _ = _team(api)
    html = owner.get("/team", headers=EN).text
    assert "member@example.com" in html and 'id="invite-form"' in html
    assert 'id="my-role">member<' in member.get("/team").text  # the console now acts for the team joined
    mid = _me(member)["user"]["id"]
    assert owner.post(f"/team/members/{mid}/role", {"role": "viewer"}, csrf_from="/team").status_code == 303
    assert '<option value="viewer" selected>viewer</option>' in owner.get("/team").text
    assert owner.post(f"/team/members/{mid}/remove", csrf_from="/team").status_code == 303
    assert "member@example.com" not in owner.get("/team").text


def test_a_member_without_the_role_sees_the_apis_refusal(api: Any) -> None:
    owner, member, _ = _team(api)
    oid = _me(owner)["user"]["id"]
    r = member.post(f"/team/members/{oid}/role", {"role": "viewer"}, csrf_from="/team", headers=EN)
    assert r.status_code == 403 and 'id="team-error"' in r.text
    r = member.post("/team/invitations", {"email": "friend@example.com", "role": "admin"}, csrf_from="/team")
    assert r.status_code == 403 and 'class="field-error"' in r.text and 'id="new-invitation"' not in r.text
    assert 'id="my-role">owner<' in owner.get("/team").text


@pytest.mark.parametrize(
    ("form", "field"),
    [({"email": "not-an-email", "role": "member"}, "invite-email-error"),
     ({"email": "a@example.com", "role": "god"}, "field-error"),
     ({"email": "a@example.com", "role": "member", "monthly_spend_limit": "-5"}, "invite-limit-error"),
     ({"email": "a@example.com", "role": "member", "monthly_spend_limit": "lots"}, "invite-limit-error")],
)  # fmt: skip
def test_bad_invitations_are_shown_at_the_field(api: Any, form: dict[str, str], field: str) -> None:
    owner = _console(api, "bad-owner@example.com")
    owner.post("/team/orgs", {"name": "lab2"}, csrf_from="/team")
    r = owner.post("/team/invitations", form, csrf_from="/team")
    assert 400 <= r.status_code < 500 and field in r.text and 'id="new-invitation"' not in r.text
    r = owner.post("/team/orgs", {"name": ""}, csrf_from="/team")
    assert r.status_code == 422 and 'id="org-name-error"' in r.text


def test_another_orgs_people_are_never_shown_or_touched(api: Any) -> None:
    owner, member, team = _team(api)
    stranger = _console(api, "stranger@example.com")
    stranger.c.cookies.set("suanli_org", team)  # naming a team it is not in: the console acts for its own org
    html = stranger.get("/team").text
    assert "member@example.com" not in html and "owner@example.com" not in html
    mid = _me(member)["user"]["id"]
    r = stranger.post(f"/team/members/{mid}/remove", csrf_from="/team")
    assert 400 <= r.status_code < 500
    victim = signup(api, "invitee@example.com")
    inv = owner.c.post(f"/api/v1/orgs/{team}/invitations", json={"email": victim.email},
                       headers=bearer(owner.c.cookies.get("suanli_session"))).json()  # fmt: skip
    assert stranger.post(f"/team/mine/{inv['id']}/accept", csrf_from="/team").status_code == 404
    assert stranger.post(f"/team/mine/{inv['id']}/cheat", csrf_from="/team").status_code == 404
    assert "member@example.com" in owner.get("/team").text


def test_team_forms_without_csrf_are_refused(api: Any) -> None:
    owner, member, _ = _team(api)
    mid = _me(member)["user"]["id"]
    for path, data in ((f"/team/members/{mid}/role", {"role": "viewer"}), (f"/team/members/{mid}/remove", {}),
                       ("/team/invitations", {"email": "x@example.com"}), ("/team/orgs", {"name": "evil"})):  # fmt: skip
        assert owner.c.post(path, data=data, follow_redirects=False).status_code == 403, path
    html = owner.get("/team").text
    assert "member@example.com" in html and "x@example.com" not in html

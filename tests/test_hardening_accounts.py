"""Issue: org names and ids shared one namespace (`org_by_ref` matched `id = ref OR name = ref`), so a tenant could
name a team after another org's id or after an email not yet registered and receive the operator's top-up meant for
it; org names took invisible and direction-changing characters. Attacks first; in-process on both databases."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.control_plane import admin_token, bearer, signup

API = "/api/v1"


def _topup(api: TestClient, adm: dict[str, str], ref: str, amount: str = "50") -> Any:
    return api.post(f"{API}/admin/orgs/{ref}/transactions", json={"kind": "topup", "amount": amount}, headers=adm)


def _balance(api: TestClient, who: Any) -> str:
    r = api.get(f"{API}/orgs/{who.org_id}/balance", headers=who.headers)
    assert r.status_code == 200, r.text
    return str(r.json()["exact"])


def test_a_team_named_after_another_orgs_id_is_refused_and_top_ups_by_id_reach_the_id(api: TestClient) -> None:
    adm = bearer(admin_token(api))
    victim, mallory = signup(api, "victim@example.com"), signup(api, "mallory@example.com")
    r = api.post(f"{API}/orgs", json={"name": victim.org_id}, headers=mallory.headers)
    assert r.status_code == 422 and r.json()["detail"].startswith("name"), r.text
    before = _balance(api, victim)
    assert _topup(api, adm, victim.org_id).status_code == 201
    assert _balance(api, victim) != before


@pytest.mark.parametrize("name", ["newcomer@example.com", "Newcomer@Example.com ", "a@b"])
def test_a_team_named_like_an_email_is_refused_so_the_real_user_can_sign_up(api: TestClient, name: str) -> None:
    adm = bearer(admin_token(api))
    mallory = signup(api, "mallory@example.com")
    r = api.post(f"{API}/orgs", json={"name": name}, headers=mallory.headers)
    assert r.status_code == 422 and r.json()["detail"].startswith("name"), r.text
    newcomer = signup(api, "newcomer@example.com")  # no UNIQUE clash with a squatter's org
    before = _balance(api, newcomer)
    assert _topup(api, adm, "newcomer@example.com").status_code == 201  # by the email: their personal org
    assert _balance(api, newcomer) != before


@pytest.mark.parametrize(
    "name", ["team\u202eevil", "te\u200bam", "line\nbreak", "tab\tname", "nul\u0000", "org_0123456789abcdef"]
)
def test_org_names_with_invisible_or_control_characters_or_id_shaped_are_refused(api: TestClient, name: str) -> None:
    who = signup(api, "tenant@example.com")
    r = api.post(f"{API}/orgs", json={"name": name}, headers=who.headers)
    assert r.status_code == 422 and r.json()["detail"].startswith("name"), r.text


def test_an_ordinary_team_name_works_and_is_found_by_name_and_by_id(api: TestClient) -> None:
    adm = bearer(admin_token(api))
    who = signup(api, "tenant@example.com")
    r = api.post(f"{API}/orgs", json={"name": "Vision Lab 视觉组"}, headers=who.headers)
    assert r.status_code == 201, r.text
    team = r.json()["id"]
    assert _topup(api, adm, "Vision Lab 视觉组").status_code == 201
    assert _topup(api, adm, team).status_code == 201
    assert _topup(api, adm, "org_ffffffffffffffff").status_code == 404  # an id that is nobody's

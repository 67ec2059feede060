"""Endpoints in the console, in-process on SQLite and PostgreSQL: state, replicas and usage (tokens, what other
orgs' keys paid, by the ledger's rule), keys shown once and revoked, scale with the API's message at the field;
another org's endpoint refused and never shown; CSRF."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from suanli.control.ids import utcnow
from tests.control_plane import signup
from tests.serving_helpers import platform_with_model
from tests.test_workloads_api import Platform
from tests.web_helpers import Console, sqlite_db_url  # noqa: F401  (sqlite_db_url: the db_url fixture)

EN = {"Accept-Language": "en"}
EP = "/api/v1/endpoints"
SPEC = {"name": "chat", "kind": "service", "model": "tiny", "resources": {"gpu": "H20", "gpus": 1}, "replicas": 0,
        "price_per_1m_tokens": "2.50"}  # fmt: skip


@pytest.fixture
def platform(api: Any, tmp_path: Path) -> Platform:
    return platform_with_model(api, tmp_path)


def _owner(p: Platform) -> tuple[Console, dict[str, Any]]:
    r = p.api.post(EP, json={"spec": SPEC}, headers=p.tenant.headers)
    assert r.status_code == 201, r.text
    c = Console(type(p.api)(p.api.app))
    c.login(p.tenant.email, "tenant-password")
    return c, r.json()


def test_list_and_page_show_state_usage_and_what_other_orgs_paid(platform: Platform) -> None:
    from suanli.control.serving import gateway as store
    from suanli.control.serving import token_billing

    c, ep = _owner(platform)
    buyer = signup(platform.api, "buyer@example.com")
    key = platform.api.post(
        f"{EP}/{ep['id']}/keys", json={"password": "tenant-password", "name": "buyer-key"}, headers=buyer.headers
    ).json()
    minute = (utcnow() - timedelta(minutes=5)).replace(second=0, microsecond=0)  # settled: charged now
    store.report(platform.db, "w", {}, [(ep["id"], key["id"], minute, 3, 300_000, 100_000)], utcnow())
    assert token_billing.charge(platform.db, utcnow()) == 1  # the buyer's org pays: what the page shows as paid
    listing = c.get("/endpoints", headers=EN).text
    assert 'href="/endpoints/' in listing and ">chat<" in listing and "400000" in listing
    assert "¥1.00" in listing  # 400,000 tokens at ¥2.50 per 1M, a key of another org
    page = c.get(f"/endpoints/{ep['id']}", headers=EN).text
    assert 'id="replicas">0 / 0<' in page and "buyer-key" in page and 'id="tokens">400000<' in page


def test_a_key_is_shown_once_and_revoked_and_scale_checks_the_field(platform: Platform) -> None:
    c, ep = _owner(platform)
    r = c.post(f"/endpoints/{ep['id']}/keys", {"name": "app", "password": "tenant-password"}, csrf_from="/endpoints",
               headers=EN)  # fmt: skip
    assert r.status_code == 303 and r.headers["location"] == f"/endpoints/{ep['id']}"
    r = c.get(f"/endpoints/{ep['id']}", headers=EN)
    assert 'id="new-key"' in r.text
    secret = r.text.split('id="key-secret">')[1].split("<")[0]
    assert secret and secret not in c.get(f"/endpoints/{ep['id']}").text
    kid = platform.api.get(f"{EP}/{ep['id']}/keys", headers=platform.tenant.headers).json()[0]["id"]
    assert c.post(f"/endpoints/{ep['id']}/keys/{kid}/revoke", csrf_from="/endpoints").status_code == 303
    assert "revoked" in c.get(f"/endpoints/{ep['id']}", headers=EN).text
    for bad in ("-1", "many", "999", ""):
        r = c.post(f"/endpoints/{ep['id']}/scale", {"replicas": bad}, csrf_from="/endpoints")
        assert r.status_code == 422 and 'id="replicas-error"' in r.text, bad
    assert c.post(f"/endpoints/{ep['id']}/scale", {"replicas": "1"}, csrf_from="/endpoints").status_code == 303
    assert platform.api.get(f"{EP}/{ep['id']}", headers=platform.tenant.headers).json()["desired"] == 1


def test_another_orgs_endpoint_is_refused_and_never_shown(platform: Platform) -> None:
    _, ep = _owner(platform)
    c = Console(type(platform.api)(platform.api.app))
    c.signup("ep-thief@example.com")
    assert "chat" not in c.get("/endpoints").text
    assert c.get(f"/endpoints/{ep['id']}").status_code == 404
    assert c.post(f"/endpoints/{ep['id']}/scale", {"replicas": "5"}, csrf_from="/endpoints").status_code == 404
    owner_key = platform.api.post(
        f"{EP}/{ep['id']}/keys", json={"password": "tenant-password", "name": "own"}, headers=platform.tenant.headers
    )
    r = c.post(f"/endpoints/{ep['id']}/keys/{owner_key.json()['id']}/revoke", csrf_from="/endpoints")
    assert r.status_code == 404
    got = platform.api.get(f"{EP}/{ep['id']}", headers=platform.tenant.headers).json()
    assert got["desired"] == 0
    assert [
        k["revoked_at"] for k in platform.api.get(f"{EP}/{ep['id']}/keys", headers=platform.tenant.headers).json()
    ] == [None]


def test_endpoint_forms_without_csrf_are_refused(platform: Platform) -> None:
    c, ep = _owner(platform)
    for path, data in ((f"/endpoints/{ep['id']}/scale", {"replicas": "2"}), (f"/endpoints/{ep['id']}/keys", {})):
        assert c.c.post(path, data=data, follow_redirects=False).status_code == 403
    assert platform.api.get(f"{EP}/{ep['id']}/keys", headers=platform.tenant.headers).json() == []

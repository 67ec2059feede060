"""Issue: a fresh ¥10 sign-up could allocate 100 TiB of volumes billed to nobody who could pay (100 volumes of the
1 TiB a volume may have, and as many more in every team org it made with nothing in it), and deploy endpoints
up to a constant that concurrent requests overran. Attacks first, through the API in-process on both databases:
an org's volumes are bounded in count and in total allocated bytes (create, resize and clone), an org without
money allocates nothing, and an org's endpoints are bounded by an operator setting, also when deployed at once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.control_plane import admin_token, bearer, signup
from tests.serving_helpers import platform_with_model
from tests.test_workloads_api import Platform

API = "/api/v1"
TiB = 1 << 40


@pytest.fixture
def api(db_url: str, tmp_path: Path, cheap_password_hashing: None) -> Iterator[TestClient]:
    """The shipped defaults, but for a smaller count of endpoints (the default is tested apart)."""
    from suanli.api.app import create_app
    from tests.control_plane import settings

    with TestClient(create_app(settings(tmp_path / "home", db_url, endpoints_per_org=3))) as client:
        yield client


def test_a_fresh_signup_cannot_allocate_more_than_its_orgs_bound(api: TestClient) -> None:
    t = signup(api, "mallory@example.com")
    made, refused = 0, None
    for i in range(100):
        r = api.post(f"{API}/volumes", json={"name": f"v{i}", "size": "1Ti"}, headers=t.headers)
        if r.status_code != 201:
            refused = r
            break
        made += 1
    settings = api.app.state.server.settings  # type: ignore[attr-defined]
    assert made * TiB <= settings.volume_bytes_per_org == 10 * TiB, made
    assert refused is not None and refused.status_code == 409
    assert "size:" in refused.json()["detail"] and "volume_bytes_per_org" in refused.json()["detail"]
    # A clone, a resize or a smaller volume past it is refused the same way; shrinking gives room back.
    assert api.post(f"{API}/volumes/v0/versions", json={"message": "x"}, headers=t.headers).status_code == 201
    r = api.post(f"{API}/volumes/v0/clone", json={"version": 1, "name": "copy"}, headers=t.headers)
    assert r.status_code == 409 and "volume_bytes_per_org" in r.json()["detail"], r.text
    assert api.patch(f"{API}/volumes/v1", json={"size": "1Gi"}, headers=t.headers).status_code == 200
    left = settings.volume_bytes_per_org - (made - 1) * TiB - (1 << 30)
    r = api.post(f"{API}/volumes", json={"name": "again", "size": left + 1}, headers=t.headers)
    assert r.status_code == 409 and "volume_bytes_per_org" in r.json()["detail"], r.text
    assert api.post(f"{API}/volumes", json={"name": "again", "size": left}, headers=t.headers).status_code == 201
    assert api.patch(f"{API}/volumes/v1", json={"size": "1Gi"}, headers=t.headers).status_code == 200  # no growth
    r = api.patch(f"{API}/volumes/v1", json={"size": "2Gi"}, headers=t.headers)
    assert r.status_code == 409 and "volume_bytes_per_org" in r.json()["detail"], r.text


def test_an_org_without_money_allocates_nothing(api: TestClient) -> None:
    """Each team org would otherwise bring its own bound: a tenant makes as many as it likes, all empty."""
    t = signup(api, "mallory@example.com")
    team = api.post(f"{API}/orgs", json={"name": "shell-co"}, headers=t.headers).json()
    r = api.post(f"{API}/volumes", json={"name": "data", "size": "1Ti", "org": team["id"]}, headers=t.headers)
    assert r.status_code == 402 and "balance" in r.json()["detail"], r.text
    r = api.post(f"{API}/admin/orgs/{team['id']}/transactions", json={"kind": "topup", "amount": "5"},
                 headers=bearer(admin_token(api)))  # fmt: skip
    assert r.status_code == 201, r.text
    r = api.post(f"{API}/volumes", json={"name": "data", "size": "1Gi", "org": team["id"]}, headers=t.headers)
    assert r.status_code == 201, r.text


def test_the_shipped_endpoint_bound_is_a_setting() -> None:
    from suanli.control.settings import load

    assert load({}, environ={}).endpoints_per_org == 20
    assert load({}, environ={"SUANLI_ENDPOINTS_PER_ORG": "5"}).endpoints_per_org == 5


@pytest.fixture
def platform(api: TestClient, tmp_path: Path) -> Platform:
    return platform_with_model(api, tmp_path)


def test_zero_replica_endpoints_are_bounded_also_when_deployed_at_once(platform: Platform) -> None:
    p = platform
    codes: list[int] = []
    details: list[str] = []

    def deploy(i: int) -> None:
        spec = {"name": f"idle-{i}", "kind": "service", "model": "tiny", "replicas": 0,
                "resources": {"gpu": "H20", "gpus": 1}}  # fmt: skip
        r = p.api.post(f"{API}/endpoints", json={"spec": spec}, headers=p.tenant.headers)
        codes.append(r.status_code)
        if r.status_code != 201:
            details.append(r.json()["detail"])

    threads = [threading.Thread(target=deploy, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [201] * 3 + [409] * 3, (codes, details)
    assert all("endpoints_per_org" in d for d in details), details
    assert len(p.api.get(f"{API}/endpoints", headers=p.tenant.headers).json()) == 3


def test_one_user_owns_at_most_teams_per_user_team_orgs(
    db_url: str, tmp_path: Path, cheap_password_hashing: None
) -> None:
    """Issue: a user could make team organisations without end (each a row, a ledger account and a name taken
    from everyone else). Now `teams_per_user` bounds the ones a user owns; a 409 names the setting, and giving an
    org up (or another user) leaves the bound where it is."""
    from suanli.api.app import create_app
    from tests.control_plane import settings

    with TestClient(create_app(settings(tmp_path / "home", db_url, teams_per_user=3))) as api:
        t, other = signup(api, "hoarder@example.com"), signup(api, "other@example.com")
        for i in range(3):
            assert api.post(f"{API}/orgs", json={"name": f"team-{i}"}, headers=t.headers).status_code == 201
        r = api.post(f"{API}/orgs", json={"name": "team-3"}, headers=t.headers)
        assert r.status_code == 409 and "teams_per_user" in r.json()["detail"], r.text
        assert api.post(f"{API}/orgs", json={"name": "theirs"}, headers=other.headers).status_code == 201
        assert api.app.state.server.settings.teams_per_user == 3  # type: ignore[attr-defined]
    from suanli.control.settings import Settings

    assert Settings.model_fields["teams_per_user"].default == 20

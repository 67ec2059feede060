"""A member's monthly spend limit holds for volumes, which are charged to whoever made them by the hour: creating,
growing and cloning one takes what an hour of the new bytes costs from what the limit leaves; and a new or resized
volume answers its real hourly price. Found by a hostile review (both databases): a member limited to 0 made a
1 TiB volume and spent the org's money on it every hour, and a new volume answered `price_per_hour: "0"`."""

from __future__ import annotations

from decimal import Decimal

from fastapi.testclient import TestClient

from tests.control_plane import Tenant, admin_token, bearer, join, signup

API = "/api/v1"


def _team(api: TestClient) -> tuple[str, Tenant, Tenant]:
    operator = bearer(admin_token(api))
    owner, alice = signup(api, "owner@example.com"), signup(api, "alice@example.com")
    org = api.post(f"{API}/orgs", json={"name": "lab"}, headers=owner.headers).json()["id"]
    join(api, owner, org, alice, "member")
    r = api.post(f"{API}/admin/orgs/{org}/transactions", json={"amount": "1000"}, headers=operator)
    assert r.status_code == 201, r.text
    return org, owner, alice


def _limit(api: TestClient, org: str, owner: Tenant, who: Tenant, amount: str | None) -> None:
    r = api.patch(f"{API}/orgs/{org}/members/{who.user_id}", json={"monthly_spend_limit": amount},
                  headers=owner.headers)  # fmt: skip
    assert r.status_code == 200, r.text


def test_a_limited_member_creates_grows_and_clones_volumes_only_within_the_limit(api: TestClient) -> None:
    org, owner, alice = _team(api)
    r = api.post(f"{API}/volumes", json={"name": "small", "size": "1Gi", "org": org}, headers=alice.headers)
    assert r.status_code == 201, r.text  # no limit yet
    assert api.post(f"{API}/volumes/small/versions", params={"org": org}, json={"message": "v1"},
                    headers=owner.headers).status_code == 201  # fmt: skip
    _limit(api, org, owner, alice, "0")
    r = api.post(f"{API}/volumes", json={"name": "hoard", "size": "1Ti", "org": org}, headers=alice.headers)
    assert r.status_code == 403 and "monthly_spend_limit" in r.json()["detail"], r.text
    r = api.patch(f"{API}/volumes/small", params={"org": org}, json={"size": "1Ti"}, headers=alice.headers)
    assert r.status_code == 403 and "monthly_spend_limit" in r.json()["detail"], r.text
    r = api.patch(f"{API}/volumes/small", params={"org": org}, json={"size": "512Mi"}, headers=alice.headers)
    assert r.status_code == 200, r.text  # shrinking spends nothing
    _limit(api, org, owner, alice, "1000")  # room for an hour of a terabyte: allowed again
    r = api.post(f"{API}/volumes", json={"name": "hoard", "size": "1Ti", "org": org}, headers=alice.headers)
    assert r.status_code == 201, r.text
    _limit(api, org, owner, alice, "0")  # the owner, with no limit, is not held by alice's
    r = api.post(f"{API}/volumes/small/clone", params={"org": org}, json={"version": 1, "name": "copy"},
                 headers=owner.headers)  # fmt: skip
    assert r.status_code in (200, 201), r.text


def test_a_new_or_resized_volume_answers_its_real_hourly_price(api: TestClient) -> None:
    who = signup(api, "sizer@example.com")
    r = api.post(f"{API}/volumes", json={"name": "data", "size": "512Gi"}, headers=who.headers)
    assert r.status_code == 201, r.text
    listed = api.get(f"{API}/volumes/data", headers=who.headers).json()["price_per_hour"]
    assert Decimal(listed) > 0 and r.json()["price_per_hour"] == listed, (r.json(), listed)
    r = api.patch(f"{API}/volumes/data", json={"size": "1Ti"}, headers=who.headers)
    assert r.status_code == 200, r.text
    assert Decimal(r.json()["price_per_hour"]) == 2 * Decimal(listed)

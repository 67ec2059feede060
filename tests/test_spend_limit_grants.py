"""Who may give whom a spend limit: an admin's limit is an owner's to set, and a manager with a limit gives nobody
more than it (nor no limit), by invitation or change. Found by a hostile review (both databases): an admin limited
to 10 invited a second account of theirs as an unlimited admin, which lifted the first one's limit."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.control_plane import Tenant, admin_token, bearer, join, signup

API = "/api/v1"


def _set(api: TestClient, org: str, by: Tenant, who: Tenant, **body: object) -> int:
    return api.patch(f"{API}/orgs/{org}/members/{who.user_id}", json=body, headers=by.headers).status_code


def test_a_limited_admin_cannot_lift_their_limit_through_another_account(api: TestClient) -> None:
    owner, boss, alt, dev = (signup(api, f"{n}@example.com") for n in ("owner", "boss", "alt", "dev"))
    org = api.post(f"{API}/orgs", json={"name": "lab"}, headers=owner.headers).json()["id"]
    assert api.post(f"{API}/admin/orgs/{org}/transactions", json={"amount": "100"},
                    headers=bearer(admin_token(api))).status_code == 201  # fmt: skip
    join(api, owner, org, boss, "admin")
    join(api, owner, org, dev, "member")
    assert _set(api, org, owner, boss, monthly_spend_limit="10") == 200
    assert _set(api, org, boss, boss, monthly_spend_limit=None) == 403  # not their own
    for limit in (None, "11"):  # no more than their own, by invitation
        r = api.post(f"{API}/orgs/{org}/invitations", json={"email": alt.email, "role": "admin",
                                                            "monthly_spend_limit": limit}, headers=boss.headers)  # fmt: skip
        assert r.status_code == 403 and "monthly_spend_limit" in r.text, (limit, r.text)
        assert _set(api, org, boss, dev, monthly_spend_limit=limit) == 403  # nor by a change
    r = api.post(f"{API}/orgs/{org}/invitations", json={"email": alt.email, "role": "admin",
                                                        "monthly_spend_limit": "10"}, headers=boss.headers)  # fmt: skip
    assert r.status_code == 201, r.text  # within their own: allowed
    assert api.post(f"{API}/invitations/{r.json()['id']}/accept", headers=alt.headers).status_code == 200
    assert _set(api, org, alt, boss, monthly_spend_limit=None) == 403  # an admin's limit is an owner's to set
    assert _set(api, org, boss, dev, monthly_spend_limit="5") == 200  # a member's, within theirs, they may
    assert _set(api, org, boss, dev, role="admin") == 200  # made an admin with a limit within theirs
    members = {m["email"]: m["monthly_spend_limit"] for m in
               api.get(f"{API}/orgs/{org}/members", headers=owner.headers).json()}  # fmt: skip
    assert members["boss@example.com"] is not None
    assert _set(api, org, owner, boss, monthly_spend_limit=None) == 200  # the owner may lift it

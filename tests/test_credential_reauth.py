"""An SSH key or an endpoint key never expires: a token that does makes one only with the account's password.

The attack (a hostile review): a stolen day-long console session, with no password, added an SSH key that logged in
to every instance of every org the victim belongs to and survived the victim's password change, or made an endpoint
key on the attacker's own priced endpoint that went on charging the victim's org after every token was revoked.
Both databases.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.control_plane import bearer, signup
from tests.test_hardening_serving_money import (  # noqa: F401  (platform: the fixture)
    EP,
    SPEC,
    Replica,
    deploy_ready,
    platform,
    reports,
)

API = "/api/v1"
PW = "tenant-password"  # `signup`'s
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl attacker"


def _day_token(api: Any, headers: dict[str, str]) -> dict[str, str]:
    r = api.post(f"{API}/tokens", json={"name": "web console", "expires_in_days": 1}, headers=headers)
    assert r.status_code == 201, r.text
    return bearer(r.json()["token"])


def test_a_day_token_adds_no_ssh_key_without_the_password(api: Any) -> None:
    victim = signup(api, "victim@example.com")
    stolen = _day_token(api, victim.headers)
    r = api.post(f"{API}/keys", json={"public_key": KEY, "name": "evil"}, headers=stolen)
    assert r.status_code == 403 and r.json()["detail"].startswith("password:"), r.text
    r = api.post(f"{API}/keys", json={"public_key": KEY, "name": "evil", "password": "guess"}, headers=stolen)
    assert r.status_code == 422 and r.json()["detail"] == "password: wrong password", r.text
    assert api.get(f"{API}/keys", headers=victim.headers).json() == []
    r = api.post(f"{API}/keys", json={"public_key": KEY, "name": "mine", "password": PW}, headers=stolen)
    assert r.status_code == 201, r.text  # the owner, who knows it


def test_a_token_that_never_expires_adds_a_key_as_before(api: Any) -> None:
    me = signup(api, "ci@example.com")
    forever = api.post(f"{API}/tokens", json={"name": "ci", "password": PW}, headers=me.headers).json()["token"]
    r = api.post(f"{API}/keys", json={"public_key": KEY}, headers=bearer(forever))
    assert r.status_code == 201, r.text


def test_a_day_token_makes_no_endpoint_key_without_the_password(platform: Any) -> None:  # noqa: F811
    api = platform.api  # platform.tenant sells on its own priced endpoint
    ep = deploy_ready(platform, Replica(reports(10, 1_000)).port, {**SPEC, "price_per_1m_tokens": "1"})
    victim = signup(api, "victim3@example.com")
    stolen = _day_token(api, victim.headers)
    r = api.post(f"{EP}/{ep['id']}/keys", json={"name": "k"}, headers=stolen)
    assert r.status_code == 403 and r.json()["detail"].startswith("password:"), r.text
    r = api.post(f"{EP}/{ep['id']}/keys", json={"name": "k", "password": PW}, headers=stolen)
    assert r.status_code == 201, r.text


@pytest.mark.parametrize("password", ["", "x" * 1025, 7, ["a"]])
def test_a_malformed_password_is_a_4xx_naming_it(api: Any, password: object) -> None:
    me = signup(api, "odd@example.com")
    r = api.post(f"{API}/keys", json={"public_key": KEY, "password": password}, headers=me.headers)
    assert r.status_code == 422 and "password" in r.text, r.text


def test_endpoint_keys_refuse_a_malformed_password_and_a_foreign_tenants_password_opens_nothing(
    platform: Any,  # noqa: F811
) -> None:
    """A malformed `password` is a 422 naming it; a foreign ¥10 sign-up with its own right password still finds no
    free endpoint of another org (404), and an expiring token without one learns nothing about the endpoint (403
    before any lookup, whichever endpoint it names)."""
    api = platform.api
    ep = deploy_ready(platform, Replica(reports(10, 1_000)).port, SPEC)  # no price: the owner's org only
    stranger = signup(api, "stranger@example.com")
    for bad in ("", "x" * 1025, 7, ["a"]):
        r = api.post(f"{EP}/{ep['id']}/keys", json={"password": bad}, headers=stranger.headers)
        assert r.status_code == 422 and "password" in r.text, r.text
    r = api.post(f"{EP}/{ep['id']}/keys", json={"password": PW}, headers=stranger.headers)
    assert r.status_code == 404, r.text
    for ref in (ep["id"], "ep_doesnotexist"):
        r = api.post(f"{EP}/{ref}/keys", json={}, headers=stranger.headers)
        assert r.status_code == 403 and r.json()["detail"].startswith("password:"), r.text

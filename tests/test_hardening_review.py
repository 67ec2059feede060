"""A hostile tenant's review of what issue 18 added (roles, signup and login throttling, statements, uploads,
plans, admission). Each test is an attack that worked before its fix; in-process on both databases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from suanli.api.app import create_app
from suanli.control import throttle
from tests.control_plane import settings, signup

API = "/api/v1"
PASSWORD = "victim-password"


def from_address(api: TestClient, address: str) -> TestClient:
    return TestClient(api.app, client=(address, 50000))


def _login(client: TestClient, email: str, password: str) -> Any:
    return client.post(f"{API}/login", json={"email": email, "password": password})


# ---- throttling by address: one IPv6 host holds a /64 ------------------------------------------------------------
def test_one_ipv6_host_rotating_through_its_64_is_one_address_to_the_login_limits(api: TestClient) -> None:
    """A host given a /64 has 2^64 addresses: counted one by one, the per-address limit (50 failures) and the
    under-attack rule (one guess per address per 15 minutes) never applied to it."""
    codes = [
        _login(from_address(api, f"2001:db8:7:9::{i:x}"), f"user{i}@example.com", "guess-guess").status_code
        for i in range(throttle.ADDRESS.capacity + 1)
    ]
    assert codes == [401] * throttle.ADDRESS.capacity + [429], codes
    assert _login(from_address(api, "2001:db8:7:a::1"), "user0@example.com", "guess-guess").status_code == 401


def test_guessing_one_password_from_addresses_of_one_64_stops_at_the_pair_limit(api: TestClient) -> None:
    signup(api, "victim@example.com", PASSWORD)
    codes = [
        _login(from_address(api, f"2001:db8:7:9::{i:x}"), "victim@example.com", "guess-guess").status_code
        for i in range(throttle.PAIR.capacity + 1)
    ]
    assert codes == [401] * throttle.PAIR.capacity + [429], codes


def test_an_ipv4_address_written_as_ipv6_is_the_same_address(api: TestClient) -> None:
    for _ in range(throttle.PAIR.capacity):
        assert _login(from_address(api, "192.0.2.44"), "victim@example.com", "guess-guess").status_code == 401
    assert _login(from_address(api, "::ffff:192.0.2.44"), "victim@example.com", "guess-guess").status_code == 429


def test_signups_from_one_ipv6_64_share_one_limit(db_url: str, tmp_path: Path, cheap_password_hashing: None) -> None:
    """Every signup is a trial credit: a /64 signing up from a fresh address each time farmed unlimited money."""
    app = create_app(settings(tmp_path / "home", db_url, signup_per_address_per_hour=3))
    with TestClient(app) as api:
        for i in range(3):
            r = from_address(api, f"2001:db8:5:5::{i + 1:x}").post(
                f"{API}/signup", json={"email": f"farm{i}@example.com", "password": PASSWORD}
            )
            assert r.status_code == 201, r.text
        r = from_address(api, "2001:db8:5:5:ffff::9").post(
            f"{API}/signup", json={"email": "farm9@example.com", "password": PASSWORD}
        )
        assert r.status_code == 429, r.text
        r = from_address(api, "2001:db8:5:6::1").post(
            f"{API}/signup", json={"email": "farm9@example.com", "password": PASSWORD}
        )
        assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    ("address", "counted"),
    [("203.0.113.9", "203.0.113.9"), ("::ffff:203.0.113.9", "203.0.113.9"), ("2001:DB8::1", "2001:db8::/64"),
     ("2001:db8:0:0:8000::1", "2001:db8::/64"), ("fe80::1%eth0", "fe80::/64"), ("testclient", "testclient"),
     ("unknown", "unknown")],
)  # fmt: skip
def test_what_an_address_counts_as(address: str, counted: str) -> None:
    assert throttle.counted_address(address) == counted

"""Hostile input to the account routes (from a hostile review): 4xx naming the field, never a 500."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from tests.control_plane import signup

API = "/api/v1"
LONE = "\ud800"  # a lone surrogate: valid JSON (`"\ud800"`), not encodable as UTF-8
NUL = "\x00"  # valid JSON (`"\u0000"`); PostgreSQL refuses it in text


def post(
    api: TestClient, path: str, doc: object, headers: dict[str, str] | None = None, method: str = "POST"
) -> object:
    body = json.dumps(doc)  # ensure_ascii: the surrogate travels as the escape \ud800
    return api.request(
        method, f"{API}{path}", content=body, headers={"content-type": "application/json", **(headers or {})}
    )


@pytest.mark.parametrize(
    ("what", "path", "doc"),
    [
        ("signup email", "/signup", {"email": f"a{LONE}@example.com", "password": "tenant-password"}),
        ("signup password", "/signup", {"email": "pw@example.com", "password": f"tenant-password{LONE}"}),
        ("login email", "/login", {"email": f"a{LONE}@example.com", "password": "tenant-password"}),
        ("login password", "/login", {"email": "owner@example.com", "password": f"x{LONE}xxxxxxx"}),
        ("forgot email", "/password/forgot", {"email": f"a{LONE}@example.com"}),
        ("reset token", "/password/reset", {"token": f"{'a' * 20}{LONE}", "new_password": "new-password-1"}),
        ("verify token", "/verify", {"token": f"{'a' * 20}{LONE}"}),
        ("signup email NUL", "/signup", {"email": f"a{NUL}@example.com", "password": "tenant-password"}),
        ("signup password NUL", "/signup", {"email": "pw0@example.com", "password": f"tenant-password{NUL}"}),
        ("login email NUL", "/login", {"email": f"a{NUL}@example.com", "password": "tenant-password"}),
        ("forgot email NUL", "/password/forgot", {"email": f"a{NUL}@example.com"}),
        (
            "signup invite NUL",
            "/signup",
            {"email": "inv0@example.com", "password": "tenant-password", "invite": f"si_{NUL}"},
        ),
    ],
)
def test_unauthenticated_account_routes_refuse_a_lone_surrogate_without_a_500(
    api: TestClient, what: str, path: str, doc: dict[str, str]
) -> None:
    signup(api, "owner@example.com")
    r = post(api, path, doc)
    assert r.status_code < 500, (what, r.status_code, r.text)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("what", "method", "path", "doc"),
    [
        ("token name", "POST", "/tokens", {"name": f"ci{LONE}"}),
        ("org name", "POST", "/orgs", {"name": f"team{LONE}"}),
        ("invitation email", "POST", "/orgs/{org}/invitations", {"email": f"b{LONE}@example.com"}),
        ("token name NUL", "POST", "/tokens", {"name": f"ci{NUL}"}),
        ("invitation email NUL", "POST", "/orgs/{org}/invitations", {"email": f"b{NUL}@example.com"}),
        (
            "password change",
            "PUT",
            "/me/password",
            {"current_password": "tenant-password", "new_password": f"new-password{LONE}"},
        ),
    ],
)
def test_authenticated_account_routes_refuse_a_lone_surrogate_without_a_500(
    api: TestClient, what: str, method: str, path: str, doc: dict[str, str]
) -> None:
    t = signup(api, "owner@example.com")
    org = api.post(f"{API}/orgs", json={"name": "team"}, headers=t.headers).json()["id"]
    r = post(api, path.format(org=org), doc, t.headers, method)
    assert r.status_code < 500, (what, r.status_code, r.text)  # type: ignore[attr-defined]

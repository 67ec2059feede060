"""The operator from the environment (`admin_email`, `admin_password`): a user who registered that address before
becomes an operator only when the configured password is theirs. Found by a hostile review: whoever signed up first
with an address the operator configured later was made an operator on every start, on their own password."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from suanli.api.app import create_app
from tests.control_plane import bearer, settings, signup

API = "/api/v1"


def _operator(api: TestClient, email: str, password: str) -> bool:
    r = api.post(f"{API}/login", json={"email": email, "password": password})
    assert r.status_code == 200, r.text
    return api.get(f"{API}/admin/users", headers=bearer(r.json()["token"])).status_code == 200


def test_a_squatter_of_the_configured_address_is_not_made_an_operator_and_its_owner_is(
    db_url: str, tmp_path: Path, cheap_password_hashing: None
) -> None:
    with TestClient(create_app(settings(tmp_path / "home", db_url))) as api:
        signup(api, "ops2@example.com", "squatter-password")
        signup(api, "ops3@example.com", "operator-secret-3")  # the operator's own account, made before
    for email, configured in (("ops2@example.com", "operator-secret-2"), ("ops3@example.com", "operator-secret-3")):
        cfg = settings(tmp_path / "home", db_url, admin_email=email, admin_password=configured)
        with TestClient(create_app(cfg)) as api:
            if email == "ops2@example.com":
                assert not _operator(api, email, "squatter-password")
            else:
                assert _operator(api, email, configured)

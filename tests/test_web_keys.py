"""Keys & tokens in-process on SQLite and PostgreSQL: a token shown once, revoke; SSH keys added with the API's
messages at the field, removed; another user's token or key never touched; CSRF."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.control_plane import bearer, signup
from tests.ssh_helpers import keygen
from tests.web_helpers import Console, sqlite_db_url  # noqa: F401  (sqlite_db_url: the db_url fixture)

EN = {"Accept-Language": "en"}


@pytest.fixture(scope="module")
def pub(tmp_path_factory: pytest.TempPathFactory) -> str:
    try:
        return Path(f"{keygen(tmp_path_factory.mktemp('k') / 'ed')}.pub").read_text()
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"ssh-keygen is needed: {e}")


def _console(api: Any, email: str) -> Console:
    c = Console(api)
    c.signup(email)
    return c


def test_a_new_token_is_shown_once_and_works_and_revoking_ends_it(api: Any) -> None:
    c = _console(api, "tok@example.com")
    form = {"name": "ci runner", "expires_in_days": "30", "password": "tenant-password"}
    r = c.post("/keys/tokens", form, csrf_from="/keys", headers=EN)
    assert r.status_code == 303 and r.headers["location"] == "/keys"  # a reload cannot post it again
    r = c.get("/keys", headers=EN)
    assert 'id="new-token"' in r.text
    secret = r.text.split('id="token-secret">')[1].split("<")[0]
    assert api.get("/api/v1/me", headers=bearer(secret)).status_code == 200
    page = c.get("/keys", headers=EN).text
    assert "ci runner" in page and secret not in page and "this browser" in page  # once, and never again
    tid = next(t["id"] for t in api.get("/api/v1/tokens", headers=bearer(secret)).json() if t["name"] == "ci runner")
    assert c.post(f"/keys/tokens/{tid}/revoke", csrf_from="/keys").status_code == 303
    assert api.get("/api/v1/me", headers=bearer(secret)).status_code == 401
    assert "revoked" in c.get("/keys", headers=EN).text


@pytest.mark.parametrize(
    ("form", "field"),
    [({"name": "", "expires_in_days": "3"}, "name"), ({"name": "x", "expires_in_days": "0"}, "expires_in_days"),
     ({"name": "x", "expires_in_days": "soon"}, "expires_in_days"), ({"name": "x" * 200}, "name"),
     ({"name": "x", "expires_in_days": "9" * 40}, "expires_in_days")],
)  # fmt: skip
def test_bad_token_input_is_shown_at_the_field(api: Any, form: dict[str, str], field: str) -> None:
    c = _console(api, "badtok@example.com")
    r = c.post("/keys/tokens", form, csrf_from="/keys")
    assert r.status_code == 422 and 'class="field-error"' in r.text and 'id="new-token"' not in r.text
    assert 'id="token-form"' in r.text


@pytest.mark.parametrize("password", ["", "not-it"])
def test_a_key_outliving_the_session_needs_the_password_shown_at_its_field(api: Any, password: str) -> None:
    """The console's session lasts a day: a stolen cookie must not make a key that outlives it."""
    c = _console(api, "pw@example.com")
    form = {"name": "ci runner", "expires_in_days": "30", "password": password}
    r = c.post("/keys/tokens", form, csrf_from="/keys", headers=EN)
    assert r.status_code in (403, 422) and 'id="token-password-error"' in r.text, r.text
    assert 'id="new-token"' not in r.text and "not-it" not in r.text  # the password is not put back in the page
    token = api.cookies.get("suanli_session")
    assert "ci runner" not in [t["name"] for t in api.get("/api/v1/tokens", headers=bearer(token)).json()]


def test_ssh_keys_are_added_with_messages_at_the_field_and_removed(api: Any, pub: str) -> None:
    c = _console(api, "ssh@example.com")
    for bad in ("ssh-ed25519 AAAA", "not a key at all", pub + pub):
        r = c.post("/keys/ssh", {"public_key": bad, "password": "tenant-password"}, csrf_from="/keys")
        assert 400 <= r.status_code < 500 and 'id="public-key-error"' in r.text, bad
    form = {"public_key": pub, "name": "my-work-box", "password": "tenant-password"}
    assert c.post("/keys/ssh", form, csrf_from="/keys").status_code == 303
    page = c.get("/keys").text
    assert "my-work-box" in page and "SHA256:" in page
    again = c.post("/keys/ssh", {"public_key": pub, "password": "tenant-password"}, csrf_from="/keys")
    assert again.status_code == 409 and 'id="public-key-error"' in again.text
    kid = api.get("/api/v1/keys", headers=bearer(api.cookies.get("suanli_session"))).json()[0]["id"]
    assert c.post(f"/keys/ssh/{kid}/remove", csrf_from="/keys").status_code == 303
    assert "my-work-box" not in c.get("/keys").text


def test_another_users_token_and_key_cannot_be_touched(api: Any, pub: str) -> None:
    victim = signup(api, "victim-keys@example.com")
    made = api.post("/api/v1/tokens", json={"name": "victim's", "expires_in_days": 7}, headers=victim.headers).json()
    key = api.post(
        "/api/v1/keys", json={"password": "tenant-password", "public_key": pub}, headers=victim.headers
    ).json()
    c = _console(api, "attacker-keys@example.com")
    page = c.get("/keys").text
    assert "victim&#39;s" not in page and key["fingerprint"] not in page
    for path in (
        f"/keys/tokens/{made['id']}/revoke",
        f"/keys/ssh/{key['id']}/remove",
        "/keys/tokens/..%2F..%2Fme/revoke",
    ):
        r = c.post(path, csrf_from="/keys")
        assert r.status_code in (403, 404), (path, r.status_code)
    assert api.get("/api/v1/me", headers=bearer(made["token"])).status_code == 200
    assert len(api.get("/api/v1/keys", headers=victim.headers).json()) == 1


def test_keys_forms_without_csrf_are_refused(api: Any, pub: str) -> None:
    c = _console(api, "csrf-keys@example.com")
    for path, data in (("/keys/tokens", {"name": "x"}), ("/keys/ssh", {"public_key": pub})):
        assert c.c.post(path, data=data, follow_redirects=False).status_code == 403
    token = api.cookies.get("suanli_session")
    live = [t["name"] for t in api.get("/api/v1/tokens", headers=bearer(token)).json() if not t["revoked_at"]]
    assert live == ["web console"]
    assert api.get("/api/v1/keys", headers=bearer(token)).json() == []

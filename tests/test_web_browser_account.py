"""The account pages in a real browser (Debian's Chromium under Playwright) against a real server on SQLite: sign
up, redeem a top-up code the operator made through the API and see the balance grow and the statement line, create
an API token and see it once, download the statement as CSV; screenshots of wallet, keys, team, volumes and
endpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.control_plane import ADMIN_EMAIL, ADMIN_PASSWORD
from tests.web_helpers import console_server, screenshot

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with console_server(tmp_path_factory, "web-account") as srv:
        yield srv


def _code(server: Any, amount: str) -> str:
    """A top-up code made by the operator through the API, as the operator's page would."""
    with httpx.Client(base_url=server.url + "/api/v1", timeout=30) as http:
        token = http.post("/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}).json()["token"]
        r = http.post("/admin/topup-codes", json={"amount": amount, "count": 1, "note": "browser"},
                      headers={"Authorization": f"Bearer {token}"})  # fmt: skip
        assert r.status_code == 201, r.text
        return r.json()["codes"][0]["code"]


def test_redeem_a_code_token_once_and_csv(server: Any, browser: Any, tmp_path: Path) -> None:
    ctx = browser.new_context(locale="en-US", accept_downloads=True)
    page = ctx.new_page()
    refused: list[str] = []  # what the pages' Content-Security-Policy stopped (no inline script may run)
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    page.goto(server.url + "/signup")
    page.fill("#email", "account@example.com")
    page.fill("#password", "account-password")
    page.click("button[type=submit]")
    page.wait_for_url(server.url + "/")

    page.goto(server.url + "/wallet")
    assert page.inner_text("#balance") == "¥10.00"
    page.fill("#code", _code(server, "88.50"))
    page.click("#redeem button[type=submit]")
    page.wait_for_selector("#redeemed")
    assert page.inner_text("#balance") == "¥98.50"
    last = page.locator("#statement tr").last.inner_text()
    assert "topup" in last and "¥88.50" in last and "¥98.50" in last
    screenshot(page, "wallet")

    with page.expect_download() as dl:
        page.click("#csv")
    saved = tmp_path / "statement.csv"
    dl.value.save_as(saved)
    lines = saved.read_text().splitlines()
    assert lines[0].startswith("id,created_at,kind,amount,balance") and "topup,88.50000000,98.50000000" in lines[-1]

    page.goto(server.url + "/keys")
    page.fill("#token-name", "laptop cli")
    page.fill("#token-password", "account-password")
    page.click("#token-form button[type=submit]")
    secret = page.inner_text("#token-secret")
    assert len(secret) > 20
    page.reload()  # the form's answer was a redirect: a reload neither posts it again nor shows the secret
    assert page.url == server.url + "/keys" and secret not in page.content()
    with httpx.Client(base_url=server.url + "/api/v1", timeout=30) as http:
        assert http.get("/me", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
        tokens = http.get("/tokens", headers={"Authorization": f"Bearer {secret}"}).json()
        assert [t["name"] for t in tokens].count("laptop cli") == 1
    screenshot(page, "keys")
    page.goto(server.url + "/keys")
    assert "laptop cli" in page.inner_text("#tokens") and secret not in page.content()  # shown once
    revoke = page.locator("#tokens tr", has_text="laptop cli").locator("button.danger")
    page.once("dialog", lambda d: d.dismiss())  # asked first (console.js: data-confirm), and "no" submits nothing
    revoke.click()
    with httpx.Client(base_url=server.url + "/api/v1", timeout=30) as http:
        assert http.get("/me", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
        page.once("dialog", lambda d: d.accept())
        with page.expect_navigation():
            revoke.click()
        assert http.get("/me", headers={"Authorization": f"Bearer {secret}"}).status_code == 401

    page.goto(server.url + "/volumes")
    page.fill("#vol-name", "datasets")
    page.fill("#vol-size", "20Gi")
    page.click("#volume-form button[type=submit]")
    page.fill("#snap-message", "first cut")
    page.click("#snapshot-form button[type=submit]")
    assert "first cut" in page.inner_text("#versions")
    page.goto(server.url + "/volumes")
    assert "20.0 GiB" in page.inner_text("#volumes")
    screenshot(page, "volumes")

    page.goto(server.url + "/team")
    page.fill("#org-name", "research")
    page.click("#org-form button[type=submit]")
    page.fill("#invite-email", "colleague@example.com")
    page.select_option("#invite-role", "viewer")
    page.click("#invite-form button[type=submit]")
    page.wait_for_selector("#new-invitation")
    assert "colleague@example.com" in page.inner_text("#invitations")
    page.reload()
    assert page.locator("#new-invitation").count() == 0 and page.locator("#invitations tr").count() == 2
    screenshot(page, "team")

    page.goto(server.url + "/endpoints")
    assert page.locator("#endpoints").count() == 1
    screenshot(page, "endpoints")
    assert refused == []
    ctx.close()

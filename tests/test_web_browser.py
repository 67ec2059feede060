"""The console in a real browser (Debian's Chromium under Playwright) against a real server process on SQLite.

These run once, not per database: the pages are the same on both, and the database cases are in-process tests."""

from __future__ import annotations

from typing import Any

import pytest

from tests.web_helpers import console_server, screenshot

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with console_server(tmp_path_factory, "web") as srv:
        yield srv


def test_sign_up_and_see_the_trial_credit(server: Any, browser: Any) -> None:
    ctx = browser.new_context(locale="en-US")
    page = ctx.new_page()
    page.goto(server.url + "/")
    assert page.url.endswith("/login?next=%2F")
    page.click("text=Sign up")
    page.fill("#email", "browser@example.com")
    page.fill("#password", "browser-password")
    page.click("button[type=submit]")
    page.wait_for_url(server.url + "/")
    assert page.inner_text("#balance") == "¥10.00"
    screenshot(page, "dashboard")
    cookies = {c["name"]: c for c in ctx.cookies()}
    assert cookies["suanli_session"]["httpOnly"] and cookies["suanli_session"]["sameSite"] == "Lax"
    assert page.evaluate("document.cookie").find("suanli_session") == -1  # script cannot read it
    page.click("header.top button[name=lang]")  # the switch: Chinese, kept in a cookie
    page.wait_for_selector("text=余额")
    assert page.inner_text("#balance") == "¥10.00" and page.get_attribute("html", "lang") == "zh"
    screenshot(page, "dashboard-zh")
    ctx.close()


def test_api_docs_render_with_no_internet(server: Any, browser: Any) -> None:
    page = browser.new_page()
    failed: list[str] = []
    asked: list[str] = []
    page.on("requestfailed", lambda r: failed.append(r.url))
    page.on("request", lambda r: asked.append(r.url))
    page.goto(server.url + "/docs")
    page.wait_for_selector(".swagger-ui .opblock", timeout=30_000)
    assert failed == []
    assert asked and all(u.startswith(server.url + "/") for u in asked), asked
    page.close()

"""Helpers for the console's tests: a form-speaking browser over the in-process app, and a real Chromium.

`Console` drives the pages as a browser would without one (cookies, the CSRF field read off the page), for the
many cases of who-may-do-what; `chromium()` starts Debian's Chromium under Playwright for the end-to-end ones.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.sqlite_only import sqlite_db_url  # noqa: F401  (the console's page tests: SQLite only)

CSRF_RE = re.compile(r'name="csrf" value="([^"]+)"')
META_RE = re.compile(r'<meta name="csrf-token" content="([^"]+)">')
CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS_ENV = "SUANLI_SCREENSHOTS"  # set to a folder (docs/screenshots) to keep the pages' pictures
DOCS_SCREENSHOTS = Path(__file__).resolve().parents[1] / "docs" / "screenshots"


def csrf_of(html: str) -> str:
    m = CSRF_RE.search(html) or META_RE.search(html)
    assert m, "no CSRF token on the page"
    return m.group(1)


class Console:
    """A cookie-keeping client of the console's pages (Starlette's TestClient or an httpx client on a live server)."""

    def __init__(self, client: Any) -> None:
        self.c = client

    def get(self, path: str, **kw: Any) -> Any:
        return self.c.get(path, follow_redirects=False, **kw)

    def post(self, path: str, data: dict[str, str] | None = None, *, csrf_from: str = "/", **kw: Any) -> Any:
        """POST a form with the CSRF token read off the page at `csrf_from` (as a browser's form carries it)."""
        page = self.c.get(csrf_from, follow_redirects=True)
        return self.c.post(path, data={"csrf": csrf_of(page.text), **(data or {})}, follow_redirects=False, **kw)

    def signup(self, email: str, password: str = "tenant-password") -> None:
        r = self.post("/signup", {"email": email, "password": password}, csrf_from="/signup")
        assert r.status_code == 303, r.text

    def login(self, email: str, password: str) -> None:
        r = self.post("/login", {"email": email, "password": password, "next": "/"}, csrf_from="/login")
        assert r.status_code == 303, r.text


@contextmanager
def console_server(
    tmp_path_factory: Any, name: str, *, env: dict[str, str] | None = None, preset: str = "rtx4090-box"
) -> Iterator[Any]:
    """`suanli server` as a real process on SQLite with a virtual preset, for a module of browser tests."""
    from tests.control_plane import live_server

    home = tmp_path_factory.mktemp(name)
    with live_server(home, f"sqlite+pysqlite:///{home}/suanli.db", env=env, args=("--virtual", preset)) as srv:
        yield srv


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (Debian's, not a downloaded one) under Playwright; flags keep it off the network."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )  # fmt: skip
        try:
            yield browser
        finally:
            browser.close()


def screenshot(page: Any, name: str) -> None:
    """Keep a picture of `page` for docs/ when SUANLI_SCREENSHOTS names a folder (docs/screenshots)."""
    folder = os.environ.get(SCREENSHOTS_ENV)
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=False)

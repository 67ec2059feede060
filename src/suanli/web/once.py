"""A secret a form just made (an API token, an invitation's code, an endpoint key, top-up codes), shown on the one
page after the form's redirect (Post/Redirect/Get) and never again.

Answering the POST with the secret itself made a reload (or the back button) post the form again and make a second
secret. Instead the POST answers 303 to the page's address and the secret waits here, in this process's memory,
under a random id that goes to the browser in a short-lived `suanli_once` cookie (HttpOnly, SameSite=Lax). The id
alone is not enough: the entry is bound to the hash of the session token that made it, so another session that
presents the id gets nothing. The next GET of that page takes the entry (it is gone after that) and drops its id
from the cookie, so a reload shows the page without it. Nothing of the secret is in the URL or in a cookie.

The cookie holds up to `PER_SESSION` ids, oldest first: two tabs that make a token and an invitation, or two
tokens, before either page is shown each get theirs (a page takes the oldest id waiting for it).

Bounds: an entry lives `TTL_S` seconds; a session holds at most `PER_SESSION` (its oldest goes first) and the
process at most `TOTAL` (the oldest of all goes first), so no user can grow the server's memory.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from suanli.web import session
from suanli.web.session import Page

ONCE_COOKIE = "suanli_once"
TTL_S = 300
PER_SESSION = 4
TOTAL = 1000
ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # an id we make (token_urlsafe); anything else in the cookie is junk
SEP = "."


@dataclass
class _Entry:
    owner: str
    where: str
    payload: Any
    expires: float


class OnceStore:
    """Entries by random id, oldest first; every operation drops the expired ones first."""

    def __init__(self, ttl_s: float = TTL_S, per_session: int = PER_SESSION, total: int = TOTAL,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.ttl_s, self.per_session, self.total, self.clock = ttl_s, per_session, total, clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def _expire(self, now: float) -> None:
        while self._entries and next(iter(self._entries.values())).expires <= now:
            self._entries.popitem(last=False)

    def put(self, owner: str, where: str, payload: Any) -> str:
        """Hold `payload` for `owner`'s next GET of `where`; the id for the cookie."""
        now = self.clock()
        with self._lock:
            self._expire(now)
            mine = [k for k, e in self._entries.items() if e.owner == owner]
            for k in mine[: max(0, len(mine) - self.per_session + 1)]:
                del self._entries[k]
            while len(self._entries) >= self.total:
                self._entries.popitem(last=False)
            key = secrets.token_urlsafe(24)
            self._entries[key] = _Entry(owner, where, payload, now + self.ttl_s)
            return key

    def take(self, key: str, owner: str, where: str) -> tuple[str, Any]:
        """`("shown", payload)` once; `("elsewhere", None)` when the entry waits for another page (it stays);
        `("lost", None)` when this owner has no such entry (taken, expired, another session's, a restart)."""
        with self._lock:
            self._expire(self.clock())
            e = self._entries.get(key)
            if e is None or not hmac.compare_digest(e.owner, owner):
                return "lost", None
            if e.where != where:
                return "elsewhere", None
            del self._entries[key]
            return "shown", e.payload


def store_of(request: Request) -> OnceStore:
    state = request.app.state
    if not hasattr(state, "web_once"):
        state.web_once = OnceStore()
    return state.web_once  # type: ignore[no-any-return]


def _owner(page: Page) -> str:
    return hashlib.sha256((page.token or "").encode()).hexdigest()


def _ids(page: Page) -> list[str]:
    """The ids in the browser's cookie, oldest first; junk left out."""
    raw = session.read_cookie(page.request, ONCE_COOKIE) or ""
    return [k for k in raw.split(SEP) if ID_RE.fullmatch(k)][-PER_SESSION:]


def _keep(page: Page, ids: list[str]) -> None:
    if ids:
        page.set_cookies[ONCE_COOKIE] = (SEP.join(ids), int(TTL_S))
    else:
        page.clear_cookies.append(ONCE_COOKIE)


def redirect(page: Page, where: str, payload: Any) -> Response:
    """The POST's answer: 303 to `where` (htmx: an HX-Redirect there), the secret held for that GET only."""
    key = store_of(page.request).put(_owner(page), where, payload)
    if page.request.headers.get("HX-Request"):
        resp: Response = Response(status_code=204, headers={"HX-Redirect": where})
    else:
        resp = RedirectResponse(where, status_code=303)
    _keep(page, [*_ids(page)[-(PER_SESSION - 1) :], key])
    return page.finish(resp)


def take(page: Page, where: str) -> Any:
    """On the GET of `where`: the oldest secret waiting for this session there, once; None otherwise. When an id
    of the browser's names nothing this session holds (a restart, another server process) and none is shown, the
    page says a secret was made but cannot be shown (`page.once_lost`)."""
    if session.read_cookie(page.request, ONCE_COOKIE) is None:
        return None
    store, owner = store_of(page.request), _owner(page)
    kept: list[str] = []
    shown, payload, lost = False, None, False
    for key in _ids(page):
        if shown:
            kept.append(key)
            continue
        outcome, got = store.take(key, owner, where)
        if outcome == "shown":
            shown, payload = True, got
        elif outcome == "elsewhere":
            kept.append(key)
        else:
            lost = True
    _keep(page, kept)
    page.once_lost = lost and not shown
    return payload

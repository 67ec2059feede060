"""A secret a form just made (an API token, an invitation's code, an endpoint key, top-up codes), shown on the one
page after the form's redirect (Post/Redirect/Get) and never again.

Answering the POST with the secret itself made a reload (or the back button) post the form again and make a second
secret. Instead the POST answers 303 to the page's address and the secret waits, sealed, in the database
(`control/accounts/console_secrets.py`: any server process can show it) under a random key that goes to the browser
in a short-lived `suanli_once` cookie (HttpOnly, SameSite=Lax). The key alone is not enough: the secret is bound to
the hash of the session token that made it, so another session that presents the key gets nothing. The next GET of
that page takes it (it is gone after that) and drops its key from the cookie, so a reload shows the page without it.
Nothing of the secret is in the URL or in a cookie, nor readable in the database.

When the database cannot hold the secret (a transient error on each of `HOLD_WAITS_S`' tries, none started after
`HOLD_DEADLINE_S`), the POST answers with the page and the secret in it: a reload would post the form again, a
smaller harm than a token made that nobody can see. (That page reads its other data through the API; if the
database cannot answer reads either, the answer is a 503 and the secret is lost.)

The cookie holds up to `PER_SESSION` keys, oldest first: two tabs that make a token and an invitation, or two
tokens, before either page is shown each get theirs (a page takes the oldest key waiting for it).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse, Response

from suanli.control.accounts import console_secrets
from suanli.control.accounts.console_secrets import PER_SESSION, TTL_S
from suanli.control.ids import utcnow
from suanli.db.engine import Database, transient
from suanli.web import session
from suanli.web.session import Page

ONCE_COOKIE = "suanli_once"
ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a key we make (URL-safe base64); anything else in the cookie is junk
SEP = "."
HOLD_WAITS_S = (0.0, 0.2, 1.0)  # before each try of a hold: a brief outage (a failover, a restart) is waited out
HOLD_DEADLINE_S = 3.0  # no new try after this long (on SQLite one try may itself wait out the busy timeout)
log = logging.getLogger("suanli.web")


def _db(page: Page) -> Database:
    return page.request.app.state.server.db  # type: ignore[no-any-return]


def _owner(page: Page) -> str:
    return console_secrets.owner_of(page.token or "")


def _ids(page: Page) -> list[str]:
    """The ids in the browser's cookie, oldest first; junk left out."""
    raw = session.read_cookie(page.request, ONCE_COOKIE) or ""
    return [k for k in raw.split(SEP) if ID_RE.fullmatch(k)][-PER_SESSION:]


def _keep(page: Page, ids: list[str]) -> None:
    if ids:
        page.set_cookies[ONCE_COOKIE] = (SEP.join(ids), int(TTL_S))
    else:
        page.clear_cookies.append(ONCE_COOKIE)


def _hold(db: Database, owner: str, where: str, payload: Any) -> str:
    with db.write() as s, s.begin():
        return console_secrets.hold(s, owner, where, payload, utcnow())


def _take(db: Database, keys: list[str], owner: str, where: str) -> tuple[list[str], Any, bool]:
    """The keys still waiting after this GET, the secret shown (or None), and whether a key named nothing. Reads
    first; writes (takes) only the oldest secret that waits for this session on this page."""
    now = utcnow()
    with db.read() as s:
        found = [console_secrets.look(s, key, owner, where, now) for key in keys]
    mine = next((i for i, o in enumerate(found) if o == "shown"), None)
    payload = None
    if mine is not None:
        with db.write() as s, s.begin():
            outcome, payload = console_secrets.take(s, keys[mine], owner, where, now)
        found[mine] = outcome
    shown = mine is not None and found[mine] == "shown"
    kept = [
        k for i, (k, o) in enumerate(zip(keys, found, strict=True)) if o == "elsewhere" or (o == "shown" and i != mine)
    ]
    return kept, payload, not shown and "lost" in found


async def redirect(page: Page, where: str, payload: Any, show: Callable[[], Awaitable[Response]]) -> Response:
    """The POST's answer: 303 to `where` (htmx: an HX-Redirect there), the secret held for that GET only. When the
    database cannot hold it, `show()`: the page with the secret in it, now."""
    key, start = None, time.monotonic()
    for wait in HOLD_WAITS_S:
        if time.monotonic() - start + wait > HOLD_DEADLINE_S:
            break
        await asyncio.sleep(wait)
        try:
            key = await run_in_threadpool(_hold, _db(page), _owner(page), where, payload)
            break
        except Exception as e:
            if not transient(e):
                raise
            log.warning("console: a secret for %s could not be held: %s", where, e)
    if key is None:
        return await show()
    if page.request.headers.get("HX-Request"):
        resp: Response = Response(status_code=204, headers={"HX-Redirect": where})
    else:
        resp = RedirectResponse(where, status_code=303)
    _keep(page, [*_ids(page)[-(PER_SESSION - 1) :], key])
    return page.finish(resp)


async def take(page: Page, where: str) -> Any:
    """On the GET of `where`: the oldest secret waiting for this session there, once; None otherwise. When a key of
    the browser's names nothing this session holds (expired, taken) and none is shown, the page says a secret was
    made but cannot be shown (`page.once_lost`)."""
    if session.read_cookie(page.request, ONCE_COOKIE) is None:
        return None
    kept, payload, lost = await run_in_threadpool(_take, _db(page), _ids(page), _owner(page), where)
    _keep(page, kept)
    page.once_lost = lost
    return payload

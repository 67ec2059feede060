"""The gateway's `/v1/…` routes as a raw ASGI app that the server calls ahead of FastAPI's stack (`create_app`).

Every chunk of a stream would otherwise pass the error, body-limit and exception middlewares, FastAPI's route
matching over every API route and a StreamingResponse's task group: measured, these cost the server more CPU per
relayed chunk than the bytes themselves (docs/serving.md, "Measured"). So this app does for `/v1` what that stack
does, in one place: the body bounded (413), every error in OpenAI's shape (a transient database error: 503 with
`Retry-After`; anything else: a 500 that names no internals), one exception path."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

from sqlalchemy.exc import OperationalError
from starlette.types import Receive, Scope, Send

from suanli.api.gateway import BODY_BYTES, ROUTES, GatewayState, forward, models
from suanli.api.gateway_input import GatewayError
from suanli.api.gateway_relay import until_disconnect
from suanli.db.engine import DatabaseUnavailable, transient

log = logging.getLogger("suanli.gateway")
PREFIX = "/v1/"


class Gateway:
    """`GET /v1/models`, `POST /v1/{chat/completions,completions,embeddings}`; any other `/v1/…`: 404 (or 405 for a
    known route with another method), in OpenAI's shape."""

    def __init__(self, state_of: Any) -> None:
        self.state_of = state_of  # () -> GatewayState: made on first use (the app's database is set up by then)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(msg: Any) -> None:
            nonlocal started
            started = True
            await send(msg)

        try:
            answer = await self._answer(scope, receive)
            await answer(scope, receive, tracked)
        except ClientGone:
            return
        except GatewayError as e:
            if started:
                raise
            await e.response()(scope, receive, send)
        except (OperationalError, DatabaseUnavailable) as e:
            if started or not transient(e):
                raise
            log.warning("gateway: database unavailable: %s", e)
            await GatewayError(503, "the database is unavailable right now; try again", None, 1).response()(
                scope, receive, send
            )
        except Exception:
            if started:
                raise
            log.exception("gateway: %s %s failed", scope["method"], scope["path"])
            await GatewayError(500, "internal error in the gateway").response()(scope, receive, send)

    async def _answer(self, scope: Scope, receive: Receive) -> Any:
        state: GatewayState = self.state_of()
        path, method = scope["path"][len(PREFIX) :], scope["method"]
        auth = _header(scope, b"authorization")
        if path == "models":
            if method not in ("GET", "HEAD"):
                raise GatewayError(405, f"{method} is not allowed on /v1/models")
            return await models(state, auth)
        if path not in ROUTES:
            raise GatewayError(404, f"no route /v1/{path[:100]}")
        if method != "POST":
            raise GatewayError(405, f"{method} is not allowed on /v1/{path}; POST")
        raw = await _body(scope, receive)
        return await _unless_gone(forward(state, auth, raw, path), receive)


class ClientGone(Exception):
    """The client left while its request waited for a replica or for a whole answer: nobody to answer."""


async def _unless_gone(work: Coroutine[Any, Any, Any], receive: Receive) -> Any:
    """`work`'s result, or ClientGone once the client leaves first: a request whose client left stops waiting for a
    cold start (and stops reading a whole answer it would never get) rather than hold the gateway up to 900 s. A
    stream's relay then watches the client itself."""
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(until_disconnect(receive))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        gone.cancel()
        raise
    left = not task.done()
    for t in (gone, task) if left else (gone,):
        t.cancel()
        with contextlib.suppress(BaseException):
            await t
    if left:
        raise ClientGone()
    return task.result()


def _header(scope: Scope, name: bytes) -> str:
    for k, v in scope.get("headers") or ():
        if k == name:
            return v.decode("latin-1")
    return ""


async def _body(scope: Scope, receive: Receive) -> bytes:
    """The request's body, at most `BODY_BYTES` (declared or streamed: 413 either way)."""
    declared = _header(scope, b"content-length")
    if declared and (not declared.isdigit() or int(declared) > BODY_BYTES):
        raise GatewayError(413, f"request body larger than {BODY_BYTES} bytes")
    parts, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise GatewayError(400, "the client left before sending the whole body")
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > BODY_BYTES:
            raise GatewayError(413, f"request body larger than {BODY_BYTES} bytes")
        parts.append(chunk)
        if not msg.get("more_body", False):
            return b"".join(parts)

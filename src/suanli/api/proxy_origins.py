"""One origin per instance (`proxy_url: https://{id}.i.example.com`): an ASGI middleware that serves an instance's
pages on its own host only."""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from suanli.control.workloads import proxy


class InstanceOrigins:
    """With a `proxy_url` (`https://{id}.i.example.com`), every instance's pages are served on its own origin and
    nowhere else: a request on an instance's host may only be for that instance's `/i/<id>/…`, and `/i/` on any
    other host is not found. A tenant's page then shares cookies, storage and service workers with nobody's."""

    def __init__(self, app: ASGIApp, proxy_url: str) -> None:
        self.app = app
        netloc = urlsplit(proxy_url).netloc.lower()
        self.suffix = netloc.removeprefix("{id}")  # ".i.example.com[:port]"

    def _host(self, scope: Scope) -> str:
        for k, v in scope.get("headers") or []:
            if k == b"host":
                return v.decode("latin-1").lower()
        return ""

    def on_instance_host(self, scope: Scope) -> bool:
        """The request is on an instance's origin (which serves nothing but that instance's `/i/<id>/…`)."""
        host = self._host(scope)
        return bool(self.suffix) and host.endswith(self.suffix)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host, path = self._host(scope), scope.get("path", "")
        label = host[: -len(self.suffix)] if self.suffix and host.endswith(self.suffix) else None
        wid = proxy.workload_of_host_label(label) if label else None
        if label is not None:  # a request on an instance's own origin
            if wid is None or not (path == f"/i/{wid}" or path.startswith(f"/i/{wid}/")):
                await _not_found(scope, receive, send, "not found on this instance's origin")
                return
        elif path.startswith("/i/"):
            await _not_found(scope, receive, send, "instances are served at their own origin (see the link's host)")
            return
        await self.app(scope, receive, send)


async def _not_found(scope: Scope, receive: Receive, send: Send, message: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    await JSONResponse({"detail": message}, status_code=404)(scope, receive, send)

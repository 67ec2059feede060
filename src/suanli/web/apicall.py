"""The console's only way to data: the public REST API, called in-process over ASGI with the session's token.

The call carries the browser's address as the ASGI client, so the API's per-address throttles (login, sign-up)
count the browser, not the console.
"""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import Request

API = "/api/v1"


class ApiError(Exception):
    """A 4xx/5xx answer of the API, kept whole so a page can show `detail` and the per-field `errors`."""

    def __init__(self, status: int, detail: str, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.errors = status, detail, errors or []

    def fields(self) -> dict[str, str]:
        """The validation errors by field: the last element of each error's location (`body.spec.gpus` → `gpus`
        and `spec.gpus`), so a form can show each next to its input."""
        out: dict[str, str] = {}
        for e in self.errors:
            loc = [x for x in e.get("loc", []) if x not in ("body", "query", "path")]
            if loc:
                out.setdefault(".".join(str(x) for x in loc), str(e.get("msg", "")))
                out.setdefault(str(loc[-1]), str(e.get("msg", "")))
        return out


def _client(request: Request, token: str | None) -> httpx.AsyncClient:
    host = request.client.host if request.client is not None else "127.0.0.1"
    port = request.client.port if request.client is not None else 0
    transport = httpx.ASGITransport(app=request.app, client=(host, port))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(transport=transport, base_url="http://console", headers=headers, timeout=60)


async def call(request: Request, token: str | None, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One API call; `path` is relative to /api/v1. Returns the response whatever its status."""
    async with _client(request, token) as c:
        return await c.request(method, API + path, **kwargs)


def raise_for(r: httpx.Response) -> httpx.Response:
    """`r` when it succeeded; an `ApiError` with the API's own message otherwise."""
    if r.status_code < 400:
        return r
    try:
        body = r.json()
    except ValueError:
        raise ApiError(r.status_code, r.text[:500] or r.reason_phrase) from None
    detail = body.get("detail") if isinstance(body, dict) else None
    errors = body.get("errors") if isinstance(body, dict) else None
    if not isinstance(detail, str):
        detail = str(detail) if detail is not None else r.reason_phrase
    return_errors = errors if isinstance(errors, list) else []
    raise ApiError(r.status_code, detail, return_errors)

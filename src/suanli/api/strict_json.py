"""Request bodies parsed strictly: a duplicate key or a byte order mark is an error, not a guess.

Python's `json` keeps the last of two equal keys and skips a UTF-8 BOM, where other parsers (a proxy, an audit
log, the tenant's own client) may keep the first or refuse: the same bytes would then mean two things. Every API
route uses `StrictJSONRoute`, whose request parses JSON once, with a hook that refuses repeated keys; FastAPI turns
the `JSONDecodeError` into a 422 naming what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

BOM = b"\xef\xbb\xbf"


def _no_duplicates(doc: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) != len(pairs):
            seen: set[str] = set()
            dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
            raise json.JSONDecodeError(f"duplicate key {dup[:64]!r}", doc, 0)
        return out

    return hook


def loads_strict(body: bytes) -> Any:
    """JSON from bytes; JSONDecodeError for a BOM, a repeated key in any object, or anything json refuses."""
    if body.startswith(BOM):
        raise json.JSONDecodeError("a byte order mark is not allowed", "", 0)
    text = body.decode("utf-8")  # a UnicodeDecodeError is FastAPI's 400 "error parsing the body", as before
    return json.loads(text, object_pairs_hook=_no_duplicates(text))


class StrictRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads_strict(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictRequest(request.scope, request.receive))

        return strict

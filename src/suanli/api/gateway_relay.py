"""The gateway's answers on their way back: a non-streamed one read whole (bounded) and passed on, a stream relayed
chunk by chunk as the runtime sends it, and the usage each carries counted for the key.

Kept apart from `api.gateway` so each file stays small."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import httpx
from starlette.responses import Response, StreamingResponse

from suanli.api.gateway_input import GatewayError
from suanli.control.ids import utcnow
from suanli.control.serving import gateway as store
from suanli.control.serving.endpoints import KeyGrant

if TYPE_CHECKING:
    from suanli.api.gateway import GatewayState

log = logging.getLogger("suanli.gateway")
RESPONSE_BYTES = 64 << 20  # a non-streamed answer read whole (embeddings of many inputs)
SHADOW_BYTES = 1 << 20  # one SSE event, read for its usage


class BeforeFirstByte(Exception):
    """The replica failed before the client got a byte: the request may go to another."""


def done(state: GatewayState, t: store.Target, r: store.Route) -> None:
    """A request to `t` ended (answered, failed, or its client left)."""
    state.outstanding[t.workload_id] = max(0, state.outstanding.get(t.workload_id, 1) - 1)
    state.touch(r.id, inflight=-1)


async def whole(
    state: GatewayState, resp: httpx.Response, t: store.Target, r: store.Route, g: KeyGrant
) -> Response:  # fmt: skip
    """A non-streamed answer: read whole (bounded), its usage counted, passed on as it came."""
    chunks, size = [], 0
    try:
        async for chunk in resp.aiter_bytes():
            size += len(chunk)
            if size > RESPONSE_BYTES:
                raise GatewayError(502, f"{r.name}'s answer is larger than {RESPONSE_BYTES} bytes")
            chunks.append(chunk)
    except httpx.TransportError as e:
        raise BeforeFirstByte(f"{type(e).__name__} while reading the answer") from None
    finally:
        await resp.aclose()
    content = b"".join(chunks)
    if resp.status_code == 200:
        _count(state, r, g, _usage_of(content))
    return Response(content, status_code=resp.status_code,
                    media_type=resp.headers.get("content-type", "application/json"))  # fmt: skip


def _usage_of(content: bytes) -> dict[str, Any] | None:
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        u = json.loads(content).get("usage")
        return u if isinstance(u, dict) else None
    return None


def _count(state: GatewayState, r: store.Route, g: KeyGrant, usage: dict[str, Any] | None) -> None:
    u = usage or {}
    prompt, completion = u.get("prompt_tokens"), u.get("completion_tokens")
    prompt = prompt if isinstance(prompt, int) and not isinstance(prompt, bool) and 0 <= prompt < 1 << 40 else 0
    if not (isinstance(completion, int) and not isinstance(completion, bool) and 0 <= completion < 1 << 40):
        completion = 0
    state.add_usage(r.id, g.key_id, prompt, completion, utcnow())


def streamed(
    state: GatewayState, resp: httpx.Response, t: store.Target, r: store.Route, g: KeyGrant
) -> StreamingResponse:
    """SSE, chunk by chunk as the runtime sends it. The usage event the gateway asked for is read in passing (a
    client that did not ask for it gets it too: a chunk with no choices, as OpenAI sends it); a replica that breaks
    off ends the stream with an error event."""

    async def relay() -> AsyncIterator[bytes]:
        usage: dict[str, Any] | None = None
        shadow = b""  # the events seen, for their usage only: every chunk goes on as it came
        try:
            async for chunk in resp.aiter_raw():
                yield chunk
                shadow += chunk
                if b"\n\n" in shadow:
                    *events, shadow = shadow.replace(b"\r\n", b"\n").split(b"\n\n")
                    for ev in events:
                        usage = _event_usage(ev) or usage
                if len(shadow) > SHADOW_BYTES:
                    shadow = b""
        except httpx.TransportError as e:
            log.info("gateway: replica %s broke off mid-stream: %s", t.name, e)
            err = {"error": {"message": f"the replica serving {r.name} broke off mid-stream; retry the request",
                             "type": "api_error", "param": None, "code": "upstream_disconnected"}}  # fmt: skip
            yield b"data: " + json.dumps(err).encode() + b"\n\n"
        finally:
            _count(state, r, g, usage)

    closed = False

    async def close() -> None:
        nonlocal closed
        if not closed:
            closed = True
            await resp.aclose()
            done(state, t, r)

    return _Stream(close, relay(), status_code=resp.status_code, media_type="text/event-stream",
                   headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip


class _Stream(StreamingResponse):
    """Closes the upstream response however the stream ends: done, the client gone (cancelled), or an error."""

    def __init__(self, close: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._close = close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with contextlib.suppress(BaseException):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
            await self._close()


def _event_usage(ev: bytes) -> dict[str, Any] | None:
    if b'"usage"' not in ev:
        return None
    for line in ev.split(b"\n"):
        if line.startswith(b"data:"):
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                u = json.loads(line[5:].strip()).get("usage")
                if isinstance(u, dict):
                    return u
    return None

"""The gateway's answers on their way back: a non-streamed one read whole (bounded) and passed on, a stream relayed
chunk by chunk as the runtime sends it, and the usage each carries counted for the key.

Kept apart from `api.gateway` so each file stays small."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from suanli.api.gateway_input import GatewayError, UsageCap
from suanli.api.gateway_upstream import Answer, BrokeOff
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
    state: GatewayState, resp: Answer, t: store.Target, r: store.Route, g: KeyGrant, cap: UsageCap
) -> Response:  # fmt: skip
    """A non-streamed answer: read whole (bounded), its usage counted, passed on as it came."""
    chunks, size = [], 0
    try:
        async for chunk in resp:
            size += len(chunk)
            if size > RESPONSE_BYTES:
                raise GatewayError(502, f"{r.name}'s answer is larger than {RESPONSE_BYTES} bytes")
            chunks.append(chunk)
    except BrokeOff as e:
        raise BeforeFirstByte(f"{e} while reading the answer") from None
    finally:
        await resp.aclose()
    content = b"".join(chunks)
    del chunks
    if resp.status_code == 200:  # a large answer is parsed off the event loop every request shares
        usage, answered = _usage_of(content) if size < 1 << 16 else await run_in_threadpool(_usage_of, content)
        _count(state, r, g, usage, cap, answered)
    return Response(content, status_code=resp.status_code,
                    media_type=resp.content_type or "application/json")  # fmt: skip


PARSE_BYTES = 1 << 20  # an answer parsed whole for its usage and text; a larger one is read from its tail
TAIL_BYTES = 64 << 10


def _usage_of(content: bytes) -> tuple[dict[str, Any] | None, int]:
    """The answer's usage, and the most completion tokens its text can hold (`answered_tokens`). An answer larger
    than `PARSE_BYTES` is not parsed whole (a replica's 32 MiB of `[{}, {}, …]` became 600 MiB of objects): its
    usage is read from its last 64 KiB, where OpenAI's servers put it, and its text taken as its size."""
    if len(content) > PARSE_BYTES:
        tail = content[-TAIL_BYTES:]
        at = tail.rfind(b'"usage"')
        colon = tail.find(b":", at + 7) if at >= 0 else -1
        with contextlib.suppress(ValueError, RecursionError):
            u, _ = json.JSONDecoder().raw_decode(tail[colon + 1 :].decode("utf-8", "replace").lstrip())
            return (u if isinstance(u, dict) else None) if colon >= 0 else None, len(content)
        return None, len(content)
    with contextlib.suppress(ValueError, TypeError, AttributeError, RecursionError):
        doc = json.loads(content)
        u = doc.get("usage")
        return (u if isinstance(u, dict) else None), answered_tokens(doc.get("choices"), delta=False)
    return None, 0


TOKENS_PER_CHOICE = 4  # tokens a choice may use that decode to nothing (its end of sequence, a role marker)


def answered_tokens(choices: Any, delta: bool) -> int:
    """The most completion tokens `choices` (an answer's, or one stream event's) can stand for: a token decodes to
    at least one byte of what it answered (the text, a reasoning text, a tool call's name and arguments), beside a
    few per choice that decode to nothing. The replica runs its owner's code and reports its own usage; a count
    above what it answered is what a priced endpoint's owner would bill its buyers for nothing."""
    if not isinstance(choices, list):
        return 0
    n = 0
    for c in choices:
        if not isinstance(c, dict):
            continue
        msg = c.get("delta" if delta else "message")
        parts = [c.get("text")]
        if isinstance(msg, dict):
            parts += [msg.get("content"), msg.get("reasoning_content"), msg.get("reasoning"), msg.get("refusal")]
            calls = msg.get("tool_calls")
            for call in calls if isinstance(calls, list) else ():
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict):
                    parts += [fn.get("name"), fn.get("arguments")]
        n += sum(len(p.encode("utf-8", "replace")) for p in parts if isinstance(p, str))
        n += 0 if delta else TOKENS_PER_CHOICE
    return n


def _count(
    state: GatewayState, r: store.Route, g: KeyGrant, usage: dict[str, Any] | None, cap: UsageCap, answered: int
) -> None:
    """The replica's usage, each count a whole number up to what the request could have used (`UsageCap`), and its
    completion tokens up to what the answer holds (`answered_tokens`)."""
    u = usage or {}
    state.add_usage(r.id, g.key_id, _tokens(u.get("prompt_tokens"), cap.prompt),
                    _tokens(u.get("completion_tokens"), min(cap.completion, answered)), utcnow())  # fmt: skip


def _tokens(v: Any, most: int) -> int:
    return min(v, most) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def streamed(
    state: GatewayState, resp: Answer, t: store.Target, r: store.Route, g: KeyGrant, cap: UsageCap
) -> Relay:  # fmt: skip
    """SSE, chunk by chunk as the runtime sends it (what arrived together goes on together). The usage event the
    gateway asked for is read in passing (a client that did not ask for it gets it too: a chunk with no choices,
    as OpenAI sends it); a replica that breaks off ends the stream with an error event."""
    return Relay(state, resp, t, r, g, cap)


class Relay:
    """A stream as a raw ASGI response: each chunk from the runtime is one `send`, with no middleware, task group
    or async generator between them (these cost more CPU per chunk than the bytes). The upstream response is
    closed however it ends: done, an error, or the client gone (seen by a watcher of `receive`, which stops the
    relay: the runtime then stops generating)."""

    def __init__(
        self, state: GatewayState, resp: Answer, t: store.Target, r: store.Route, g: KeyGrant, cap: UsageCap
    ) -> None:  # fmt: skip
        self.state, self.resp, self.t, self.r, self.g, self.cap = state, resp, t, r, g, cap
        self.usage: dict[str, Any] | None = None
        self.deltas = 0  # events carrying a choice's delta or text: the tokens sent, where the usage never came
        self.answered = 0  # the most completion tokens the events' text can hold (`answered_tokens`)
        self.choices: set[int] = set()  # the choices seen: each may end with tokens that decode to nothing

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        relay = asyncio.ensure_future(self._relay(send))
        watch = asyncio.ensure_future(until_disconnect(receive))
        left = False
        try:
            await asyncio.wait((relay, watch), return_when=asyncio.FIRST_COMPLETED)
            left = watch.done() and not relay.done()
        finally:
            for task in (watch, relay):
                if not task.done():
                    task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            try:
                await self.resp.aclose()
            finally:
                # No usage event: a client that left pays for what it was sent; a replica that broke off (the
                # client got an error saying retry) or sends none charges nothing.
                answered = self.answered + TOKENS_PER_CHOICE * max(1, len(self.choices))
                _count(self.state, self.r, self.g, self.usage or (self._estimate() if left else None), self.cap,
                       answered)  # fmt: skip
                done(self.state, self.t, self.r)
        if relay.done() and not relay.cancelled() and relay.exception() is not None:
            raise relay.exception()  # type: ignore[misc]

    def _estimate(self) -> dict[str, Any]:
        """The client left before the usage event: a token per event of a choice's delta or text sent, and the
        prompt at four bytes of the request a token."""
        return {"prompt_tokens": self.cap.prompt_estimate, "completion_tokens": self.deltas}

    async def _relay(self, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.resp.status_code, "headers": SSE_HEADERS})
        shadow = bytearray()  # the events seen, for their usage only: every chunk goes on as it came
        try:
            async for chunk in self.resp:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                start = max(len(shadow) - 3, 0)  # only the new bytes are searched: a long event costs linear time
                shadow += chunk
                if shadow.find(b"\n\n", start) >= 0 or shadow.find(b"\r\n\r\n", start) >= 0:
                    *events, rest = bytes(shadow).replace(b"\r\n", b"\n").split(b"\n\n")
                    for ev in events:
                        self._read(ev)
                    shadow = bytearray(rest)
                if len(shadow) > SHADOW_BYTES:
                    shadow.clear()
        except BrokeOff as e:
            log.info("gateway: replica %s broke off mid-stream: %s", self.t.name, e)
            err = {"error": {"message": f"the replica serving {self.r.name} broke off mid-stream; retry the request",
                             "type": "api_error", "param": None, "code": "upstream_disconnected"}}  # fmt: skip
            await send({"type": "http.response.body", "body": b"data: " + json.dumps(err).encode() + b"\n\n",
                        "more_body": True})  # fmt: skip
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _read(self, ev: bytes) -> None:
        """One event of the stream: its usage, or the text its choices carry."""
        doc = _event_doc(ev)
        if doc is None:
            return
        u = doc.get("usage")
        if isinstance(u, dict):
            self.usage = u
        choices = doc.get("choices")
        if isinstance(choices, list) and choices:
            self.deltas += not isinstance(u, dict)
            self.answered += answered_tokens(choices, delta=True)
            if len(self.choices) < 64:
                self.choices.update(
                    c["index"] for c in choices if isinstance(c, dict) and isinstance(c.get("index"), int)
                )


SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no")]  # fmt: skip


async def until_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _event_doc(ev: bytes) -> dict[str, Any] | None:
    """The JSON object an SSE event's `data:` lines carry (None for `[DONE]`, a comment, or what is not JSON)."""
    data = b"\n".join(line[5:].strip() for line in ev.split(b"\n") if line.startswith(b"data:"))
    if not data.startswith(b"{"):
        return None
    with contextlib.suppress(ValueError, TypeError, RecursionError):
        doc = json.loads(data)
        return doc if isinstance(doc, dict) else None
    return None

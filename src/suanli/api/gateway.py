"""The OpenAI-compatible gateway: `/v1/models`, `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, routed
by the request's `model` (an endpoint's name) to the endpoint's ready replicas.

- Keys: `Authorization: Bearer sk-sl-…`, one endpoint each; unknown or revoked: 401; a `model` the key does not open
  (another org's, or none): 404, the same words either way.
- Balancing: least outstanding requests over ready replicas (this process's count). A replica that fails before
  answering (refused, reset, hung up before its headers) is left out for `SUSPECT_S` and the request goes to another
  (at most `ATTEMPTS` in all); once bytes went to the client a failure ends a stream with an error event.
- Streams (SSE) pass through chunk by chunk as they arrive (`aiter_raw`), never collected; a client that goes away
  closes the upstream request (its runtime then stops generating).
- No ready replica: the request waits (counted as waiting, which the autoscaler sees: a cold start from zero) for up
  to the endpoint's `cold_start_s`, then 503 with `Retry-After`.
- Token usage is read from the runtime's `usage` (streams: the gateway asks for `stream_options.include_usage`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
from fastapi.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from suanli.control import gateway as store
from suanli.control.endpoints import KeyGrant
from suanli.control.errors import NotFound, ServiceError
from suanli.control.ids import utcnow
from suanli.db.engine import Database
from suanli.serving.runtimes import runtime

log = logging.getLogger("suanli.gateway")
BODY_BYTES = 4 << 20  # a request (long prompts); the middleware refuses more with 413
RESPONSE_BYTES = 64 << 20  # a non-streamed answer read whole (embeddings of many inputs)
KEY_TTL_S = 5.0  # a revoked key is refused within this
ROUTE_TTL_S = 5.0
READY_TTL_S = 1.0
SUSPECT_S = 5.0
ATTEMPTS = 3
REPORT_S = 1.0
POLL_S = 0.25
RETRY_AFTER_S = 5
CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 600.0
SHADOW_BYTES = 1 << 20  # one SSE event, read for its usage
MAX_ITEMS = 10_000  # messages, prompts, inputs
MAX_TOKENS = 1 << 20
MAX_N = 16
ROUTES = ("chat/completions", "completions", "embeddings")


class GatewayError(ServiceError):
    """An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.retry_after = status, param, retry_after

    def response(self) -> JSONResponse:
        kind = {401: "authentication_error", 404: "not_found_error", 503: "service_unavailable"}.get(
            self.status, "invalid_request_error" if self.status < 500 else "api_error"
        )
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}
        if self.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": None}}
        return JSONResponse(body, status_code=self.status, headers=headers)


def _bad(param: str, why: str) -> GatewayError:
    return GatewayError(400, f"{param}: {why}", param)


def check_body(route: str, raw: bytes) -> dict[str, Any]:
    """The request's JSON, with the fields the gateway reads checked and bounded (others pass through to the
    runtime, which has its own checks); a 400 naming the field."""
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise _bad("body", "JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise _bad("body", f"not valid JSON ({str(e)[:120]})") from None
    if not isinstance(doc, dict):
        raise _bad("body", "must be a JSON object")
    model = doc.get("model")
    if not isinstance(model, str) or not 0 < len(model) <= 256:
        raise _bad("model", "is required: the endpoint's name (a string of at most 256 characters)")
    if "stream" in doc and not isinstance(doc["stream"], bool):
        raise _bad("stream", "must be true or false")
    if "stream_options" in doc and doc["stream_options"] is not None and not isinstance(doc["stream_options"], dict):
        raise _bad("stream_options", "must be an object")
    for name in ("max_tokens", "max_completion_tokens"):
        v = doc.get(name)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_TOKENS):
            raise _bad(name, f"must be a whole number from 1 to {MAX_TOKENS}")
    n = doc.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N):
        raise _bad("n", f"must be a whole number from 1 to {MAX_N}")
    need = {"chat/completions": "messages", "completions": "prompt", "embeddings": "input"}[route]
    v = doc.get(need)
    if route == "chat/completions":
        if not isinstance(v, list) or not 0 < len(v) <= MAX_ITEMS or not all(isinstance(m, dict) for m in v):
            raise _bad("messages", f"must be a list of 1 to {MAX_ITEMS} message objects")
    elif not (isinstance(v, str) or (isinstance(v, list) and 0 < len(v) <= MAX_ITEMS)):
        raise _bad(need, f"is required: a string or a list of 1 to {MAX_ITEMS} items")
    return doc


@dataclass
class _Load:
    inflight: int = 0
    waiting: int = 0
    last_request_at: datetime | None = None
    dirty: bool = True


@dataclass
class GatewayState:
    """Per process: caches of keys, routes and ready replicas, outstanding requests per replica, the load and usage
    reported to the database every `REPORT_S`."""

    db: Database
    worker: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    keys: dict[str, tuple[float, KeyGrant | None]] = field(default_factory=dict)
    routes: dict[str, tuple[float, store.Route]] = field(default_factory=dict)
    targets: dict[str, tuple[float, list[store.Target]]] = field(default_factory=dict)
    outstanding: dict[str, int] = field(default_factory=dict)
    picked: dict[str, int] = field(default_factory=dict)  # replica -> when it was last picked (a counter)
    picks: int = 0
    suspect: dict[str, float] = field(default_factory=dict)
    loads: dict[str, _Load] = field(default_factory=dict)
    usage: dict[tuple[str, str, datetime], list[int]] = field(default_factory=dict)
    client: httpx.AsyncClient | None = None
    reporter: asyncio.Task[None] | None = None
    wake: asyncio.Event | None = None

    # ---- who and where ----------------------------------------------------------------------------------------
    async def grant(self, request: Request) -> KeyGrant:
        auth = request.headers.get("authorization", "")
        scheme, _, secret = auth.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise GatewayError(401, "missing API key: send Authorization: Bearer sk-sl-… (suanli keys create)")
        secret = secret.strip()
        mono = time.monotonic()
        hit = self.keys.get(secret)
        if hit is None or mono - hit[0] > KEY_TTL_S:
            try:
                g: KeyGrant | None = await run_in_threadpool(store.key, self.db, secret)
            except ServiceError:
                g = None
            if len(self.keys) > 10_000:
                self.keys.clear()
            hit = self.keys[secret] = (mono, g)
        if hit[1] is None:
            raise GatewayError(401, "invalid API key")
        return hit[1]

    async def route(self, endpoint_id: str) -> store.Route:
        mono = time.monotonic()
        hit = self.routes.get(endpoint_id)
        if hit is None or mono - hit[0] > ROUTE_TTL_S:
            try:
                r = await run_in_threadpool(store.route, self.db, endpoint_id)
            except NotFound:
                raise GatewayError(404, "model: the endpoint this key was for no longer exists", "model") from None
            hit = self.routes[endpoint_id] = (mono, r)
        return hit[1]

    async def ready(self, endpoint_id: str, fresh: bool = False) -> list[store.Target]:
        mono = time.monotonic()
        hit = self.targets.get(endpoint_id)
        if fresh or hit is None or mono - hit[0] > READY_TTL_S:
            hit = self.targets[endpoint_id] = (mono, await run_in_threadpool(store.ready, self.db, endpoint_id))
        return [t for t in hit[1] if self.suspect.get(t.key, 0.0) <= mono]

    def pick(self, targets: list[store.Target], tried: set[str]) -> store.Target | None:
        """Least outstanding requests; ties to the one picked least recently."""
        left = [t for t in targets if t.workload_id not in tried]
        if not left:
            return None
        best = min(left, key=lambda t: (self.outstanding.get(t.workload_id, 0), self.picked.get(t.workload_id, 0)))
        self.picks += 1
        self.picked[best.workload_id] = self.picks
        if len(self.picked) > 10_000:
            self.picked.clear()
        return best

    # ---- load and usage reports ---------------------------------------------------------------------------
    def load(self, endpoint_id: str) -> _Load:
        ld = self.loads.get(endpoint_id)
        if ld is None:
            ld = self.loads[endpoint_id] = _Load()
        return ld

    def touch(self, endpoint_id: str, inflight: int = 0, waiting: int = 0, now: datetime | None = None) -> None:
        ld = self.load(endpoint_id)
        ld.inflight += inflight
        ld.waiting += waiting
        if now is not None:
            ld.last_request_at = now
        ld.dirty = True
        self._start_reporter()
        if waiting > 0 and self.wake is not None:
            self.wake.set()  # a request waits for a replica: the autoscaler should know now, not in a second

    def add_usage(self, endpoint_id: str, key_id: str, prompt: int, completion: int, now: datetime) -> None:
        minute = now.replace(second=0, microsecond=0)
        u = self.usage.setdefault((endpoint_id, key_id, minute), [0, 0, 0])
        u[0], u[1], u[2] = u[0] + 1, u[1] + max(0, prompt), u[2] + max(0, completion)

    def _start_reporter(self) -> None:
        if self.reporter is None or self.reporter.done():
            self.wake = asyncio.Event()
            self.reporter = asyncio.get_running_loop().create_task(self._report_loop())

    async def _report_loop(self) -> None:
        assert self.wake is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), REPORT_S)
            self.wake.clear()
            await self.flush()

    async def flush(self) -> None:
        loads = {eid: store.Load(ld.inflight, ld.waiting, ld.last_request_at)
                 for eid, ld in self.loads.items() if ld.dirty}  # fmt: skip
        usage = [(e, k, m, *v) for (e, k, m), v in self.usage.items()]
        if not loads and not usage:
            return
        for ld in self.loads.values():
            ld.dirty = False
        self.usage = {}
        try:
            await run_in_threadpool(store.report, self.db, self.worker, loads, usage, utcnow())  # type: ignore[arg-type]
        except Exception:
            log.exception("gateway: reporting load and usage failed; kept for the next report")
            for e, k, m, n, p, c in usage:
                u = self.usage.setdefault((e, k, m), [0, 0, 0])
                u[0], u[1], u[2] = u[0] + n, u[1] + p, u[2] + c
            for eid in loads:
                self.load(eid).dirty = True

    async def aclose(self) -> None:
        if self.reporter is not None:
            self.reporter.cancel()
            with contextlib.suppress(BaseException):
                await self.reporter
        with contextlib.suppress(Exception):
            await self.flush()
        if self.client is not None:
            await self.client.aclose()

    def http(self) -> httpx.AsyncClient:
        if self.client is None:
            timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
            self.client = httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=4096,
                                            max_keepalive_connections=256))  # fmt: skip
        return self.client


# ---- requests ---------------------------------------------------------------------------------------------------
async def models(state: GatewayState, request: Request) -> Response:
    g = await state.grant(request)
    r = await state.route(g.endpoint_id)
    return JSONResponse({"object": "list", "data": [{"id": r.name, "object": "model", "created": 0,
                                                      "owned_by": r.org_id}]})  # fmt: skip


async def forward(state: GatewayState, request: Request, route: str) -> Response:
    g = await state.grant(request)
    raw = await request.body()
    doc = check_body(route, raw)
    r = await state.route(g.endpoint_id)
    if doc["model"] != r.name:
        raise GatewayError(404, f"model: no model called {doc['model'][:100]!r} for this key", "model")
    if not runtime(r.runtime).serves(route):
        raise GatewayError(404, f"model: {r.name} runs on {r.runtime}, which has no /v1/{route}", "model")
    stream = bool(doc.get("stream"))
    doc["model"] = r.upstream_model
    if stream:
        doc["stream_options"] = {**(doc.get("stream_options") or {}), "include_usage": True}
    body = json.dumps(doc).encode()
    now = utcnow()
    state.touch(r.id, now=now)
    targets = await _wait_ready(state, r)
    tried: set[str] = set()
    last_error = ""
    for _ in range(ATTEMPTS):
        t = state.pick(targets, tried)
        if t is None:
            targets = await state.ready(r.id, fresh=True)
            t = state.pick(targets, tried)
        if t is None:
            break
        tried.add(t.workload_id)
        state.outstanding[t.workload_id] = state.outstanding.get(t.workload_id, 0) + 1
        state.touch(r.id, inflight=1)
        handed_off = False
        try:
            resp = await _send(state, t, route, body)
            if stream and resp.headers.get("content-type", "").startswith("text/event-stream"):
                handed_off = True
                return _streamed(state, resp, t, r, g)
            handed_off = True
            return await _whole(state, resp, t, r, g)
        except _BeforeFirstByte as e:
            state.suspect[t.key] = time.monotonic() + SUSPECT_S
            if len(state.suspect) > 10_000:
                state.suspect.clear()
            last_error = str(e)
            log.info("gateway: replica %s failed before answering (%s); trying another", t.name, e)
        finally:
            if not handed_off:
                _done(state, t, r)
    raise GatewayError(503, f"no replica of {r.name} answered ({last_error or 'none ready'}); retry", None,
                       RETRY_AFTER_S)  # fmt: skip


def _done(state: GatewayState, t: store.Target, r: store.Route) -> None:
    state.outstanding[t.workload_id] = max(0, state.outstanding.get(t.workload_id, 1) - 1)
    state.touch(r.id, inflight=-1)


async def _wait_ready(state: GatewayState, r: store.Route) -> list[store.Target]:
    targets = await state.ready(r.id)
    if targets:
        return targets
    state.touch(r.id, waiting=1)
    try:
        deadline = time.monotonic() + r.cold_start_s
        while time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            targets = await state.ready(r.id, fresh=True)
            if targets:
                return targets
    finally:
        state.touch(r.id, waiting=-1)
    raise GatewayError(503, f"no replica of {r.name} is ready (waited {r.cold_start_s} s for a cold start); retry",
                       None, RETRY_AFTER_S)  # fmt: skip


class _BeforeFirstByte(Exception):
    pass


async def _send(state: GatewayState, t: store.Target, route: str, body: bytes) -> httpx.Response:
    client = state.http()
    host = f"[{t.address}]" if ":" in t.address else t.address
    req = client.build_request("POST", f"http://{host}:{t.port}/v1/{route}", content=body,
                               headers={"content-type": "application/json", "accept": "*/*"})  # fmt: skip
    try:
        return await client.send(req, stream=True)
    except httpx.TimeoutException as e:
        raise _BeforeFirstByte(f"{type(e).__name__}") from None
    except httpx.TransportError as e:
        raise _BeforeFirstByte(f"{type(e).__name__}: {e}") from None


async def _whole(
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
        raise _BeforeFirstByte(f"{type(e).__name__} while reading the answer") from None
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


def _streamed(
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
            _done(state, t, r)

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

"""The OpenAI-compatible gateway: `/v1/models`, `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, routed
by the request's `model` (an endpoint's name) to the endpoint's ready replicas.

- Keys: `Authorization: Bearer sk-sl-…`, one endpoint each; unknown or revoked: 401; a `model` the key does not open
  (another org's, or none): 404, the same words either way.
- Balancing: least outstanding requests over ready replicas (this process's count). A replica that fails before
  answering (refused, reset, hung up before its headers) is left out for `SUSPECT_S` and the request goes to another
  (at most `ATTEMPTS` in all); once bytes went to the client a failure ends a stream with an error event.
- Streams (SSE) pass through chunk by chunk as they arrive (`gateway_upstream`), never collected; a client that goes away
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
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from fastapi.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from suanli.api.gateway_input import GatewayError, check_body, usage_cap
from suanli.api.gateway_relay import BeforeFirstByte, Relay, done, streamed, whole
from suanli.api.gateway_upstream import Answer, NoAnswer, Pool
from suanli.control.errors import NotFound, ServiceError
from suanli.control.ids import utcnow
from suanli.control.serving import gateway as store
from suanli.control.serving.endpoints import KeyGrant
from suanli.db.engine import Database
from suanli.serving.runtimes import runtime

log = logging.getLogger("suanli.gateway")
BODY_BYTES = 4 << 20  # a request (long prompts); more is refused with 413
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
ROUTES = ("chat/completions", "completions", "embeddings")


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
    keys: dict[str, tuple[float, KeyGrant | None, Decimal]] = field(default_factory=dict)
    routes: dict[str, tuple[float, store.Route]] = field(default_factory=dict)
    targets: dict[str, tuple[float, list[store.Target]]] = field(default_factory=dict)
    reading: dict[str, asyncio.Future[tuple[float, list[store.Target]]]] = field(default_factory=dict)
    outstanding: dict[str, int] = field(default_factory=dict)
    picked: dict[str, int] = field(default_factory=dict)  # replica -> when it was last picked (a counter)
    picks: int = 0
    suspect: dict[str, float] = field(default_factory=dict)
    loads: dict[str, _Load] = field(default_factory=dict)
    usage: dict[tuple[str, str, datetime], list[int]] = field(default_factory=dict)
    pool: Pool | None = None
    reporter: asyncio.Task[None] | None = None
    wake: asyncio.Event | None = None

    # ---- who and where ----------------------------------------------------------------------------------------
    async def grant(self, auth: str) -> tuple[KeyGrant, Decimal]:
        """The key's grant and what its paying org has left for it (`store.key`, as of at most `KEY_TTL_S` ago),
        from the request's `Authorization` header."""
        scheme, _, secret = auth.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise GatewayError(401, "missing API key: send Authorization: Bearer sk-sl-… (suanli keys create)")
        secret = secret.strip()
        mono = time.monotonic()
        hit = self.keys.get(secret)
        if hit is None or mono - hit[0] > KEY_TTL_S:
            try:
                g, balance = await run_in_threadpool(store.key, self.db, secret, utcnow())
            except ServiceError:
                g, balance = None, Decimal(0)
            if len(self.keys) > 10_000:
                self.keys.clear()
            hit = self.keys[secret] = (mono, g, balance)
        if hit[1] is None:
            raise GatewayError(401, "invalid API key")
        return hit[1], hit[2]

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
        """The endpoint's ready replicas, read at most `READY_TTL_S` ago (`fresh`: `POLL_S / 2` ago). Requests
        that want a read while one is under way share it: forty waiting for a cold start made one read each every
        `POLL_S`, on the thread pool every API route shares."""
        mono = time.monotonic()
        hit = self.targets.get(endpoint_id)
        if hit is None or mono - hit[0] > (POLL_S / 2 if fresh else READY_TTL_S):
            reading = self.reading.get(endpoint_id)
            if reading is None:
                reading = self.reading[endpoint_id] = asyncio.ensure_future(self._read_ready(endpoint_id))
            hit = await asyncio.shield(reading)
        return [t for t in hit[1] if self.suspect.get(t.key, 0.0) <= mono]

    async def _read_ready(self, endpoint_id: str) -> tuple[float, list[store.Target]]:
        try:
            got = await run_in_threadpool(store.ready, self.db, endpoint_id)
            hit = self.targets[endpoint_id] = (time.monotonic(), got)
            return hit
        finally:
            self.reading.pop(endpoint_id, None)

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
        if self.pool is not None:
            self.pool.close()

    def http(self) -> Pool:
        if self.pool is None:
            self.pool = Pool(CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
        return self.pool


# ---- requests ---------------------------------------------------------------------------------------------------
async def models(state: GatewayState, auth: str) -> Response:
    g, _ = await state.grant(auth)
    r = await state.route(g.endpoint_id)
    return JSONResponse({"object": "list", "data": [{"id": r.name, "object": "model", "created": 0,
                                                      "owned_by": r.org_id}]})  # fmt: skip


async def forward(state: GatewayState, auth: str, raw: bytes, route: str) -> Response | Relay:
    """`raw` (the request's body, already bounded) to a ready replica; the answer, or a stream to relay."""
    g, balance = await state.grant(auth)
    # A large body is parsed off the event loop every request shares; only the bytes sent on outlive this function's
    # first lines (the parsed form is up to 25 times larger, and a cold start may hold the request for 900 s).
    doc = check_body(route, raw) if len(raw) < 1 << 16 else await run_in_threadpool(check_body, route, raw)
    cap = usage_cap(route, len(raw), doc)
    r = await state.route(g.endpoint_id)
    if r.priced and g.org_id != r.org_id and balance <= 0:
        raise GatewayError(
            402,
            f"the org paying for this key has {balance:.2f} left for it (its balance, or its "
            "maker's monthly spend limit there); top up first, or ask for a higher limit",
        )
    if doc["model"] != r.name:
        raise GatewayError(404, f"model: no model called {doc['model'][:100]!r} for this key", "model")
    if not runtime(r.runtime).serves(route):
        raise GatewayError(404, f"model: {r.name} runs on {r.runtime}, which has no /v1/{route}", "model")
    stream = bool(doc.get("stream"))
    doc["model"] = r.upstream_model
    if stream:
        doc["stream_options"] = {**(doc.get("stream_options") or {}), "include_usage": True}
    body = json.dumps(doc).encode() if len(raw) < 1 << 16 else await run_in_threadpool(_dumps, doc)
    del doc
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
        handed_off = False  # a stream's relay ends the request itself; anything else ends here, however it ends
        try:
            resp = await _send(state, t, route, body)
            if stream and resp.content_type.startswith("text/event-stream"):
                handed_off = True
                return streamed(state, resp, t, r, g, cap)
            return await whole(state, resp, t, r, g, cap)
        except BeforeFirstByte as e:
            state.suspect[t.key] = time.monotonic() + SUSPECT_S
            if len(state.suspect) > 10_000:
                state.suspect.clear()
            last_error = str(e)
            log.info("gateway: replica %s failed before answering (%s); trying another", t.name, e)
        finally:
            if not handed_off:
                done(state, t, r)
    raise GatewayError(503, f"no replica of {r.name} answered ({last_error or 'none ready'}); retry", None,
                       RETRY_AFTER_S)  # fmt: skip


def _dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


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


async def _send(state: GatewayState, t: store.Target, route: str, body: bytes) -> Answer:
    try:
        return await state.http().post(t.address, t.port, f"/v1/{route}", body, t.secret)
    except NoAnswer as e:
        raise BeforeFirstByte(str(e)) from None

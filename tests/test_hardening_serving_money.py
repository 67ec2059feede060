"""Money through the serving gateway, attacks first, on both databases, with a replica the test controls (the
replica runs its endpoint owner's code, so what it reports is the owner's word): a replica that reports more
tokens than a request could use is counted only up to what the request asked for, and a payer never gives more
than it has, so no owner mints money by selling to itself; a usage row that cannot be charged does not stop the
others; and a key binds its maker: one removed from the paying org has a key that stops working, and one with a
monthly spend limit spends no more through keys than through work."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from suanli.api.gateway_input import PROMPT_OVERHEAD
from suanli.control.caches import FleetCache, PriceCache
from suanli.control.ids import utcnow
from suanli.control.money import ledger
from suanli.control.serving import endpoints as endpoints_service
from suanli.control.serving import gateway as store
from suanli.control.serving import token_billing
from suanli.control.serving.serving import ServingPass
from suanli.db.models import Workload
from suanli.db.serving import EndpointReplica, EndpointUsage
from tests.control_plane import Tenant, join, signup
from tests.serving_helpers import platform_with_model
from tests.test_workloads_api import Platform

EP = "/api/v1/endpoints"
SPEC = {"name": "chat", "kind": "service", "model": "tiny", "resources": {"gpu": "H20", "gpus": 1}, "replicas": 1}
BIG = 2**40 - 1


class Replica:
    """A replica that answers every request with `answer(body)`: a JSON document, as an OpenAI server would."""

    def __init__(self, answer: Callable[[bytes], Any]) -> None:
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        buf = b""
        with c:
            while True:
                while b"\r\n\r\n" not in buf:
                    got = c.recv(65536)
                    if not got:
                        return
                    buf += got
                head, _, rest = buf.partition(b"\r\n\r\n")
                n = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                while len(rest) < n:
                    rest += c.recv(65536)
                body, buf = rest[:n], rest[n:]
                answer = self.answer(body)
                if callable(answer):  # it writes the answer itself (a stream), then the connection closes
                    with contextlib.suppress(OSError):
                        answer(c)
                    return
                out = json.dumps(answer).encode()
                c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                          % (len(out), out))  # fmt: skip


def reports(prompt: int, completion: int, content: str | None = None) -> Callable[[bytes], dict[str, Any]]:
    """An answer whose usage says `prompt` and `completion` tokens; its text holds that many (a byte a token, up to
    2 MB) unless `content` says otherwise."""
    text = "x" * min(completion, 2_000_000) if content is None else content
    return lambda body: {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
                         "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}  # fmt: skip


@pytest.fixture
def platform(api: TestClient, tmp_path: Path) -> Platform:
    return platform_with_model(api, tmp_path)


def deploy_ready(p: Platform, port: int, spec: dict[str, Any], who: Tenant | None = None) -> Any:
    """An endpoint whose one replica is ready at the test's replica."""
    r = p.api.post(EP, json={"spec": spec}, headers=(who or p.tenant).headers)
    assert r.status_code == 201, r.text
    ep = r.json()
    ServingPass(endpoints_service.Admitting(5, FleetCache(), PriceCache())).run(p.db, utcnow())
    with p.db.write() as s, s.begin():
        for rep in s.scalars(select(EndpointReplica).where(EndpointReplica.endpoint_id == ep["id"])).all():
            s.execute(update(Workload).where(Workload.id == rep.workload_id).values(state="running", attempt=1))
            rep.port, rep.address, rep.ready_attempt = port, "127.0.0.1", 1
    return ep


def balance(p: Platform, org: str) -> Decimal:
    with p.db.read() as s:
        return ledger.org_balance(s, org)


def settle(p: Platform, endpoint_id: str) -> None:
    """What the gateway counted, reported and charged (as a pass would once its minute has settled)."""
    asyncio_flush(p)
    token_billing.charge(p.db, utcnow() + timedelta(seconds=token_billing.SETTLE_S + 61))


def asyncio_flush(p: Platform) -> None:
    import asyncio

    asyncio.run(p.api.app.state.gateway.flush())  # type: ignore[attr-defined]


def usage(p: Platform, endpoint_id: str) -> list[EndpointUsage]:
    with p.db.read() as s:
        return list(s.scalars(select(EndpointUsage).where(EndpointUsage.endpoint_id == endpoint_id)))


def ask(p: Platform, key: str, **doc: Any) -> Any:
    body = {"model": "chat", "messages": [{"role": "user", "content": "x"}], **doc}
    return p.api.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json=body)


def test_an_owner_selling_to_itself_mints_no_money(platform: Platform) -> None:
    """The owner's replica reports 2^40 tokens for a request of `max_tokens: 1`, bought with a second org of its
    own (a fresh signup: ¥10 of trial credit)."""
    replica = Replica(reports(BIG, BIG))
    ep = deploy_ready(platform, replica.port, {**SPEC, "price_per_1m_tokens": "1000"})
    puppet = signup(platform.api, "puppet@example.com")
    key = platform.api.post(
        f"{EP}/{ep['id']}/keys", json={"password": "tenant-password", "name": "b"}, headers=puppet.headers
    ).json()["key"]
    owner0, puppet0 = balance(platform, platform.tenant.org_id), balance(platform, puppet.org_id)
    r = ask(platform, key, max_tokens=1)
    assert r.status_code == 200, r.text
    settle(platform, ep["id"])
    (row,) = usage(platform, ep["id"])
    assert row.completion_tokens == 1  # what was asked for, not what was reported
    assert 0 < row.prompt_tokens <= len(r.request.content) + PROMPT_OVERHEAD
    assert balance(platform, puppet.org_id) >= 0
    assert balance(platform, platform.tenant.org_id) - owner0 == puppet0 - balance(platform, puppet.org_id)
    with platform.db.read() as s:
        assert all(a == b for a, b in ledger.recompute(s).values())
    r = ask(platform, key, max_tokens=1, n=3)  # n choices of max_tokens each, at most
    settle(platform, ep["id"])
    assert sum(u.completion_tokens for u in usage(platform, ep["id"])) == 1 + 3


def test_a_payer_gives_what_it_has_and_its_key_is_then_refused(platform: Platform) -> None:
    replica = Replica(reports(10, 1_000_000))
    ep = deploy_ready(platform, replica.port, {**SPEC, "price_per_1m_tokens": "1000"})  # ¥1,000 a request
    buyer = signup(platform.api, "buyer@example.com")
    key = platform.api.post(
        f"{EP}/{ep['id']}/keys", json={"password": "tenant-password"}, headers=buyer.headers
    ).json()["key"]
    owner0 = balance(platform, platform.tenant.org_id)
    assert ask(platform, key).status_code == 200
    settle(platform, ep["id"])
    assert balance(platform, buyer.org_id) == 0 and balance(platform, platform.tenant.org_id) == owner0 + 10
    platform.api.app.state.gateway.keys.clear()  # type: ignore[attr-defined]  # past the key cache's 5 s
    r = ask(platform, key)
    assert r.status_code == 402, r.text


def test_a_row_that_cannot_be_charged_does_not_stop_the_others(
    platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    replica = Replica(reports(1, 1))
    ep = deploy_ready(platform, replica.port, {**SPEC, "price_per_1m_tokens": "2"})
    other = deploy_ready(platform, replica.port, {**SPEC, "name": "other", "price_per_1m_tokens": "2"})
    buyer = signup(platform.api, "rows@example.com")
    platform.topup(buyer.org_id, "100")
    keys = [
        platform.api.post(f"{EP}/{e['id']}/keys", json={"password": "tenant-password"}, headers=buyer.headers).json()[
            "id"
        ]
        for e in (ep, other)
    ]
    old = (utcnow() - timedelta(minutes=10)).replace(second=0, microsecond=0)
    store.report(platform.db, "w", {}, [(ep["id"], keys[0], old - timedelta(minutes=i), 1, 10**6, 0) for i in range(600)],
                 utcnow())  # fmt: skip
    store.report(platform.db, "w", {}, [(other["id"], keys[1], old, 1, 10**6, 0)], utcnow())
    real = token_billing.part_charge

    def poisoned(charged: int, total: int, price: Decimal) -> Decimal:
        if price == 2 and total == 10**6 and poisoned.left > 0:  # the first endpoint's rows fail
            poisoned.left -= 1
            raise OverflowError("the amount does not fit the money column")
        return real(charged, total, price)

    poisoned.left = 600  # type: ignore[attr-defined]
    monkeypatch.setattr(token_billing, "part_charge", poisoned)
    owner0 = balance(platform, platform.tenant.org_id)
    for _ in range(3):
        token_billing.charge(platform.db, utcnow())
    assert balance(platform, platform.tenant.org_id) == owner0 + 2  # the other endpoint's row is paid


def test_a_key_binds_its_maker_in_the_paying_org(platform: Platform) -> None:
    """A team member with a ¥1 monthly limit makes the team pay for their own endpoint's tokens: the charges count
    against the limit (the key is refused past it), and once they leave the team their key stops working."""
    owner = platform.tenant
    team = platform.api.post("/api/v1/orgs", json={"name": "team"}, headers=owner.headers).json()["id"]
    platform.topup(team, "1000")
    member = signup(platform.api, "limited@example.com")
    join(platform.api, owner, team, member)
    r = platform.api.patch(f"/api/v1/orgs/{team}/members/{member.user_id}", json={"monthly_spend_limit": "1"},
                           headers=owner.headers)  # fmt: skip
    assert r.status_code == 200, r.text
    platform.topup(member.org_id, "100")
    replica = Replica(reports(10, 100_000))
    ep = deploy_ready(platform, replica.port, {**SPEC, "name": "mine", "price_per_1m_tokens": "1000"}, who=member)
    key = platform.api.post(
        f"{EP}/{ep['id']}/keys", json={"password": "tenant-password", "org": team}, headers=member.headers
    ).json()["key"]
    body = {"model": "mine", "messages": [{"role": "user", "content": "x"}]}
    auth = {"Authorization": f"Bearer {key}"}
    assert platform.api.post("/v1/chat/completions", json=body, headers=auth).status_code == 200
    settle(platform, ep["id"])
    with platform.db.read() as s:
        from suanli.control.accounts import spend_limits

        spent = spend_limits.month_to_date(s, team, utcnow(), member.user_id)
    assert spent.get(member.user_id, Decimal(0)) == 1  # ¥100 of tokens, charged up to the member's limit of ¥1
    platform.api.app.state.gateway.keys.clear()  # type: ignore[attr-defined]
    r = platform.api.post("/v1/chat/completions", json=body, headers=auth)
    assert r.status_code == 402 and "spend limit" in r.json()["error"]["message"], r.text
    assert platform.api.delete(f"/api/v1/orgs/{team}/members/{member.user_id}", headers=owner.headers).status_code in (200, 204)  # fmt: skip
    platform.api.app.state.gateway.keys.clear()  # type: ignore[attr-defined]
    r = platform.api.post("/v1/chat/completions", json=body, headers=auth)
    assert r.status_code == 401, r.text


def sse(events: int, usage: dict[str, int]) -> Callable[[socket.socket], None]:
    """A stream of `events` one-token deltas, then the usage event, as vLLM sends them (20 ms apart)."""

    def write(c: socket.socket) -> None:
        c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(events):
            ev = b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": f"t{i} "}}]}).encode() + b"\n\n"
            c.sendall(b"%x\r\n%s\r\n" % (len(ev), ev))
            time.sleep(0.02)
        ev = b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n"
        c.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(ev), ev))

    return write


async def _leave_after(
    p: Platform, key: str, doc: dict[str, Any], events: int, path: str = "/v1/chat/completions"
) -> bytes:
    """The request through the gateway's ASGI app, the client leaving once `events` events arrived."""
    app, body, sent, gone, first = p.api.app, json.dumps(doc).encode(), [], asyncio.Event(), [True]

    async def receive() -> dict[str, Any]:
        if first[0]:
            first[0] = False
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.body":
            sent.append(msg.get("body", b""))
            if b"".join(sent).count(b"data:") >= events:
                gone.set()

    scope = {"type": "http", "method": "POST", "path": path, "query_string": b"",
             "headers": [(b"authorization", f"Bearer {key}".encode())], "http_version": "1.1"}  # fmt: skip
    await app.gateway(scope, receive, send)  # type: ignore[attr-defined]
    state = app.state.gateway  # type: ignore[attr-defined]
    await state.flush()
    if state.reporter:
        state.reporter.cancel()
    if state.pool:
        state.pool.close()
        state.pool = None
    return b"".join(sent)


def test_a_client_that_leaves_a_stream_before_its_usage_still_pays_for_what_it_got(platform: Platform) -> None:
    """The usage comes in the stream's last event: a client that left before it paid nothing for what it read."""
    replica = Replica(lambda body: sse(50, {"prompt_tokens": 20, "completion_tokens": 50}))
    ep = deploy_ready(platform, replica.port, {**SPEC, "price_per_1m_tokens": "1000"})
    buyer = signup(platform.api, "leaver@example.com")
    key = platform.api.post(
        f"{EP}/{ep['id']}/keys", json={"password": "tenant-password"}, headers=buyer.headers
    ).json()["key"]
    doc = {"model": "chat", "stream": True, "max_tokens": 50, "messages": [{"role": "user", "content": "hi " * 40}]}
    got = asyncio.run(_leave_after(platform, key, doc, 30))
    token_billing.charge(platform.db, utcnow() + timedelta(seconds=token_billing.SETTLE_S + 61))
    (row,) = usage(platform, ep["id"])
    assert row.completion_tokens >= got.count(b'"delta"') >= 29 and row.prompt_tokens > 0
    assert balance(platform, buyer.org_id) < 10  # charged for it


def test_requests_whose_clients_left_stop_waiting_and_waiters_share_their_reads(
    platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forty requests for an endpoint scaled to zero: each read the ready list itself every 0.25 s for up to the
    cold start (900 s at most), on the thread pool every API route shares, even after its client had left."""
    spec = {**SPEC, "replicas": None, "autoscale": {"min_replicas": 0, "max_replicas": 1, "cold_start_s": 3}}
    assert platform.api.post(EP, json={"spec": spec}, headers=platform.tenant.headers).status_code == 201
    key = platform.api.post(
        f"{EP}/chat/keys", json={"password": "tenant-password"}, headers=platform.tenant.headers
    ).json()["key"]
    reads = [0]
    real = store.ready

    def counted(db: Any, endpoint_id: str) -> Any:
        reads[0] += 1
        return real(db, endpoint_id)

    monkeypatch.setattr(store, "ready", counted)
    body = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}).encode()
    app = platform.api.app

    async def one(leaves: bool) -> list[Any]:
        first, sent = [True], []

        async def receive() -> dict[str, Any]:
            if first[0]:
                first[0] = False
                return {"type": "http.request", "body": body, "more_body": False}
            if not leaves:
                await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(msg: dict[str, Any]) -> None:
            sent.append(msg)

        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "query_string": b"",
                 "headers": [(b"authorization", f"Bearer {key}".encode())], "http_version": "1.1"}  # fmt: skip
        await app.gateway(scope, receive, send)  # type: ignore[attr-defined]
        return sent

    async def main(leaves: bool) -> tuple[float, list[list[Any]]]:
        t0 = time.monotonic()
        out = await asyncio.gather(*(one(leaves) for _ in range(40)))
        state = app.state.gateway  # type: ignore[attr-defined]
        if state.reporter:
            state.reporter.cancel()
        return time.monotonic() - t0, out

    took, sent = asyncio.run(main(leaves=True))
    assert took < 2.0 and all(s == [] for s in sent), took  # gone at once, nothing sent to nobody
    reads[0] = 0
    took, sent = asyncio.run(main(leaves=False))  # they stay: 503 after the 3 s cold start
    assert all(s[0]["status"] == 503 for s in sent)
    assert reads[0] <= 3 / 0.125 + 4, reads[0]  # one read per half poll for all forty, not forty per poll


def test_a_request_waiting_for_a_cold_start_holds_its_bytes_not_their_parsed_form(platform: Platform) -> None:
    """A 4 MiB body of `[],` parses into about 90 MiB of Python objects, and the parsed document was held for the
    whole cold-start wait (up to 900 s): ten such requests took a gigabyte. Only the bytes sent on are held now."""
    import tracemalloc

    spec = {**SPEC, "replicas": None, "autoscale": {"min_replicas": 0, "max_replicas": 1, "cold_start_s": 2}}
    assert platform.api.post(EP, json={"spec": spec}, headers=platform.tenant.headers).status_code == 201
    key = platform.api.post(
        f"{EP}/chat/keys", json={"password": "tenant-password"}, headers=platform.tenant.headers
    ).json()["key"]
    head = b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "x": ['
    body = head + b"[]," * ((4 << 20) // 3 - 100) + b"[]]}"
    app = platform.api.app
    held: list[int] = []

    async def main() -> None:
        first = [True]

        async def receive() -> dict[str, Any]:
            if first[0]:
                first[0] = False
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(msg: dict[str, Any]) -> None:
            pass

        async def measure() -> None:
            state = app.state.gateway  # type: ignore[attr-defined]
            while not any(ld.waiting for ld in state.loads.values()):  # parsed, and waiting for a replica
                await asyncio.sleep(0.05)
            held.append(tracemalloc.get_traced_memory()[0])

        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "query_string": b"",
                 "headers": [(b"authorization", f"Bearer {key}".encode())], "http_version": "1.1"}  # fmt: skip
        await asyncio.gather(app.gateway(scope, receive, send), measure())  # type: ignore[attr-defined]
        state = app.state.gateway  # type: ignore[attr-defined]
        if state.reporter:
            state.reporter.cancel()

    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        asyncio.run(main())
    finally:
        tracemalloc.stop()
    assert held[0] - base < 8 * len(body), (held[0] - base) / len(body)  # the bytes, a copy or two, not 25 times


def sse_text(events: int, usage: dict[str, int]) -> Callable[[socket.socket], None]:
    """`/v1/completions` streams its tokens as `text`, not as a chat `delta`."""

    def write(c: socket.socket) -> None:
        c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(events):
            doc = {"object": "text_completion", "choices": [{"index": 0, "text": f"t{i} ", "finish_reason": None}]}
            ev = b"data: " + json.dumps(doc).encode() + b"\n\n"
            c.sendall(b"%x\r\n%s\r\n" % (len(ev), ev))
        time.sleep(0.5)
        ev = b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n"
        c.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(ev), ev))

    return write


def test_a_completions_stream_left_early_is_counted_by_its_text_events(platform: Platform) -> None:
    replica = Replica(lambda body: sse_text(100, {"prompt_tokens": 5, "completion_tokens": 100}))
    ep = deploy_ready(platform, replica.port, {**SPEC, "price_per_1m_tokens": "1000"})
    buyer = signup(platform.api, "texter@example.com")
    key = platform.api.post(
        f"{EP}/{ep['id']}/keys", json={"password": "tenant-password"}, headers=buyer.headers
    ).json()["key"]
    doc = {"model": "chat", "stream": True, "max_tokens": 100, "prompt": "hi"}
    got = asyncio.run(_leave_after(platform, key, doc, 100, path="/v1/completions"))
    assert got.count(b'"text"') == 100
    asyncio_flush(platform)
    (row,) = usage(platform, ep["id"])
    assert row.completion_tokens >= 100


def test_a_stream_the_replica_broke_off_costs_the_buyer_nothing(platform: Platform) -> None:
    """The buyer got only an error event saying "retry": the estimate is for a client that left, not this."""

    def broken(c: socket.socket) -> None:
        c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")

    replica = Replica(lambda body: broken)
    ep = deploy_ready(platform, replica.port, {**SPEC, "price_per_1m_tokens": "1000"})
    r = ask(platform, platform.api.post(f"{EP}/{ep['id']}/keys", json={"password": "tenant-password"}, headers=platform.tenant.headers).json()["key"],
            stream=True, messages=[{"role": "user", "content": "x" * 40_000}])  # fmt: skip
    assert b"upstream_disconnected" in r.content
    asyncio_flush(platform)
    assert all(u.prompt_tokens == 0 and u.completion_tokens == 0 for u in usage(platform, ep["id"]))


def test_a_whole_answer_leaves_the_replicas_load_as_it_found_it(platform: Platform) -> None:
    """Every non-streamed request was counted in flight and never taken off: the autoscaler saw load that never
    went (scaling up to the maximum, never to zero), and the least-loaded pick was skewed."""
    replica = Replica(reports(1, 1))
    ep = deploy_ready(platform, replica.port, SPEC)
    key = platform.api.post(
        f"{EP}/{ep['id']}/keys", json={"password": "tenant-password"}, headers=platform.tenant.headers
    ).json()["key"]
    for _ in range(3):
        assert ask(platform, key).status_code == 200
    state = platform.api.app.state.gateway  # type: ignore[attr-defined]
    assert state.load(ep["id"]).inflight == 0 and set(state.outstanding.values()) <= {0}


def test_a_prompt_of_token_ids_is_one_prompt() -> None:
    from suanli.api.gateway_input import check_body, usage_cap

    one = json.dumps({"model": "m", "prompt": list(range(5000)), "max_tokens": 1}).encode()
    assert usage_cap("completions", len(one), check_body("completions", one)).completion == 1
    many = json.dumps({"model": "m", "prompt": ["a", "b", "c"], "max_tokens": 2, "n": 2}).encode()
    assert usage_cap("completions", len(many), check_body("completions", many)).completion == 12
    img = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    doc = {"model": "m", "messages": [{"role": "user", "content": [img, img, {"type": "text", "text": "what?"}]}]}
    raw = json.dumps(doc).encode()
    assert usage_cap("chat/completions", len(raw), check_body("chat/completions", raw)).prompt >= 2 * 16_384

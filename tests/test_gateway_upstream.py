"""The gateway's HTTP/1.1 client to replicas (`api.gateway_upstream`) against small asyncio servers that misbehave
on purpose, and the raw `/v1` path in front of the middleware stack (its own 404/405/413 in OpenAI's shape, and
an instance's own origin still refusing it)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from suanli.api.gateway_upstream import BUFFER_BYTES, BrokeOff, NoAnswer, Pool
from tests.control_plane import free_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _serve(handler: Handler) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _request(r: asyncio.StreamReader) -> bytes:
    head = await r.readuntil(b"\r\n\r\n")
    n = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return head + await r.readexactly(n)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 20))  # type: ignore[arg-type]


def test_chunked_stream_keep_alive_reuse_and_one_write_per_request() -> None:
    connections, requests = [], []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        connections.append(w)
        while True:
            try:
                requests.append(await _request(r))
            except asyncio.IncompleteReadError:
                return
            w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for i in range(3):
                w.write(_chunk(b"data: %d\n\n" % i))
                await w.drain()
                await asyncio.sleep(0.01)
            w.write(b"0\r\n\r\n")

    async def main() -> None:
        server, port = await _serve(handler)
        pool = Pool(1.0, 5.0)
        for _ in range(3):
            a = await pool.post("127.0.0.1", port, "/v1/completions", b'{"x": 1}')
            assert (a.status_code, a.content_type) == (200, "text/event-stream")
            assert b"".join([c async for c in a]) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"  # chunking decoded
            await a.aclose()
        assert len(connections) == 1  # kept alive and reused
        assert all(q.startswith(b"POST /v1/completions HTTP/1.1\r\n") and q.endswith(b'{"x": 1}') for q in requests)
        pool.close()
        server.close()

    run(main())


def test_refused_and_silent_replicas_are_no_answer() -> None:
    async def silent(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(10)

    async def hangs_up(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _request(r)
        w.close()

    async def main() -> None:
        with pytest.raises(NoAnswer):
            await Pool(1.0, 1.0).post("127.0.0.1", free_port(), "/v1/completions", b"{}")  # nobody listens
        server, port = await _serve(silent)
        with pytest.raises(NoAnswer, match="no answer within"):
            await Pool(1.0, 0.3).post("127.0.0.1", port, "/v1/completions", b"{}")
        server.close()
        server, port = await _serve(hangs_up)
        with pytest.raises(NoAnswer, match="connection lost"):
            await Pool(1.0, 5.0).post("127.0.0.1", port, "/v1/completions", b"{}")
        server.close()

    run(main())


def test_death_mid_stream_and_garbage_are_broke_off() -> None:
    async def dies(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _request(r)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        w.write(_chunk(b"data: 0\n\n"))
        await w.drain()
        await asyncio.sleep(0.05)
        w.transport.abort()

    async def garbage(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _request(r)
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz-not-hex\r\n")
        await w.drain()
        await asyncio.sleep(1)

    async def main() -> None:
        for handler in (dies, garbage):
            server, port = await _serve(handler)
            pool = Pool(1.0, 5.0)
            a = await pool.post("127.0.0.1", port, "/v1/completions", b"{}")
            with pytest.raises(BrokeOff):
                async for _ in a:
                    pass
            await a.aclose()
            assert not pool.idle.get(("127.0.0.1", port))  # a broken connection is never kept
            server.close()

    run(main())


def test_a_second_answer_to_one_request_is_not_kept_nor_passed_on() -> None:
    async def twice(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _request(r)
        one = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n"
        w.write(one + b"{}" + one + b"[]")  # the second is for nobody: a later request must not get it
        await w.drain()
        await asyncio.sleep(1)

    async def main() -> None:
        server, port = await _serve(twice)
        pool = Pool(1.0, 5.0)
        a = await pool.post("127.0.0.1", port, "/v1/completions", b"{}")
        assert b"".join([c async for c in a]) == b"{}"
        await a.aclose()
        assert not pool.idle.get(("127.0.0.1", port))
        server.close()

    run(main())


def test_a_kept_connection_the_replica_closed_is_retried_on_a_new_one() -> None:
    served = []

    async def once(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _request(r)  # answers one request, says keep-alive, then closes as the next one comes
        served.append(1)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
        await w.drain()
        await r.read(1)
        w.transport.abort()

    async def main() -> None:
        server, port = await _serve(once)
        pool = Pool(1.0, 5.0)
        for _ in range(2):
            a = await pool.post("127.0.0.1", port, "/v1/completions", b"{}")
            assert b"".join([c async for c in a]) == b"{}"
            await a.aclose()
        assert len(served) == 2
        server.close()

    run(main())


def test_a_slow_client_pauses_reading_from_the_replica() -> None:
    sent = 0

    async def floods(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal sent
        await _request(r)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        block = b"x" * 65536
        while True:
            w.write(_chunk(block))
            sent += len(block)
            await w.drain()

    async def main() -> None:
        server, port = await _serve(floods)
        a = await Pool(1.0, 5.0).post("127.0.0.1", port, "/v1/completions", b"{}")
        await asyncio.sleep(0.5)  # the gateway relays nothing meanwhile
        assert a.conn.buffered <= BUFFER_BYTES + (1 << 20)  # paused near the bound, not the whole flood
        assert a.conn.paused
        assert len(await a.__anext__()) > 0
        await a.aclose()
        server.close()

    run(main())


@pytest.fixture
def proxied_api(db_url: str, tmp_path: Path, cheap_password_hashing: None) -> TestClient:
    from suanli.api.app import create_app
    from tests.control_plane import settings

    s = settings(tmp_path / "home", db_url).model_copy(update={"proxy_url": "https://{id}.i.example.com"})
    with TestClient(create_app(s)) as client:
        yield client  # type: ignore[misc]


def test_raw_v1_path_answers_in_openai_shape_and_never_on_an_instance_origin(proxied_api: TestClient) -> None:
    c = proxied_api
    r = c.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = c.get("/v1/completions")
    assert r.status_code == 405 and "POST" in r.json()["error"]["message"]
    r = c.post("/v1/completions", content=b"x" * ((4 << 20) + 1), headers={"authorization": "Bearer sk-sl-x"})
    assert r.status_code == 413 and "error" in r.json()

    def chunked():  # no content-length: counted as it comes
        for _ in range(5):
            yield b"x" * (1 << 20)

    r = c.post("/v1/completions", content=chunked(), headers={"authorization": "Bearer sk-sl-x"})
    assert r.status_code == 413
    r = c.post("/v1/completions", json={"model": "m", "prompt": "x"}, headers={"authorization": "Bearer sk-sl-x"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    # an instance's own origin serves only that instance: not the gateway
    r = c.get("/v1/models", headers={"host": "wl-abc.i.example.com", "authorization": "Bearer sk-sl-x"})
    assert r.status_code == 404 and "error" not in r.json()

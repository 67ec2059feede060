"""What a replica can do to the gateway that relays its answers (found by a hostile review). A replica runs its
endpoint owner's code, and the gateway runs in the API server's process and event loop: an answer must cost the
gateway about its size, and a head (status line and headers) no more than `HEAD_BYTES`."""

from __future__ import annotations

import asyncio
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from suanli.api.gateway_upstream import HEAD_BYTES, NoAnswer, Pool


async def _request(r: asyncio.StreamReader) -> None:
    head = await r.readuntil(b"\r\n\r\n")
    n = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    await r.readexactly(n)


def _answer_with_header(pad: int) -> tuple[str, int]:
    """A replica whose answer carries a header `pad` bytes long (it writes until the gateway hangs up)."""
    written = [0]

    async def replica(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _request(r)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-pad: ")
        chunk = b"a" * (16 << 10)
        try:
            while written[0] < pad:
                w.write(chunk[: pad - written[0]])
                await w.drain()
                written[0] += min(len(chunk), pad - written[0])
            w.write(b"\r\ncontent-length: 2\r\n\r\n{}")
            await w.drain()
        except (ConnectionError, OSError):
            pass

    async def main() -> tuple[str, int]:
        server = await asyncio.start_server(replica, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = Pool(2.0, 30.0)
        try:
            a = await pool.post("127.0.0.1", port, "/v1/chat/completions", b"{}")
            body = b"".join([c async for c in a])
            await a.aclose()
            return f"answered {a.status_code}: {body!r}", 0
        except NoAnswer as e:
            return str(e), 1
        finally:
            pool.close()
            server.close()

    tracemalloc.start()
    try:
        outcome, refused = asyncio.run(main())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return outcome, refused * peak or -peak


def test_a_replica_cannot_send_an_unbounded_response_header() -> None:
    """A 64 MiB header was read to its end (the parser holds a header's value whole, and nothing bounded it):
    128 MiB more memory and seconds of event loop per answer. Now the head is fed to the parser 16 KiB at a time
    and the answer refused past 64 KiB, having held a few dozen KiB."""
    outcome, peak = _answer_with_header(64 << 20)
    assert peak > 0 and "head" in outcome and str(HEAD_BYTES) in outcome, outcome
    assert peak < 4 * HEAD_BYTES + (1 << 20), peak
    outcome, peak = _answer_with_header(HEAD_BYTES // 2)  # a large head within the bound is an answer
    assert peak < 0 and outcome == "answered 200: b'{}'", outcome


def test_a_replica_answer_does_not_cost_the_gateway_many_times_its_size(api: TestClient, tmp_path: Path) -> None:
    """A tenant calls its own endpoint (nothing per token) and its replica answers a tiny request with 32 MiB of
    `[{}, {}, …]`: the gateway parsed it whole to read `usage`, 8 million objects, about 19 times the answer. An
    answer over 1 MiB is now read from its tail for its usage; what the gateway allocates stays within a few copies
    of the answer (it buffers it, and hands it on)."""
    from tests.serving_helpers import platform_with_model
    from tests.test_hardening_serving_money import EP, SPEC, Replica, deploy_ready

    p = platform_with_model(api, tmp_path)
    doc = b'{"choices": [], "data": [' + b"{}, " * (8 << 20) + b'{}], "usage": {"prompt_tokens": 1}}'

    def write(c: Any) -> None:
        c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(doc))
        c.sendall(doc)

    replica = Replica(lambda body: write)
    ep = deploy_ready(p, replica.port, SPEC)
    key = p.api.post(f"{EP}/{ep['id']}/keys", json={"password": "tenant-password"}, headers=p.tenant.headers)
    auth = {"Authorization": f"Bearer {key.json()['key']}"}
    body = {"model": "chat", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}
    tracemalloc.start()
    try:
        r = p.api.post("/v1/chat/completions", headers=auth, json=body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.status_code == 200 and len(r.content) == len(doc)
    del r
    assert peak < 6 * len(doc), f"a {len(doc) >> 20} MiB answer made the gateway allocate {peak >> 20} MiB"


@pytest.mark.parametrize("where", ["head", "tail"])
def test_the_usage_of_a_large_answer_is_read_from_its_tail(where: str) -> None:
    from suanli.api.gateway_relay import PARSE_BYTES, _usage_of

    usage = b'"usage": {"prompt_tokens": 7, "total_tokens": 7}'
    filler = b'"data": [' + b"[0.5, 0.25], " * (PARSE_BYTES // 12) + b"[0]]"
    doc = b"{" + (usage + b", " + filler if where == "head" else filler + b", " + usage) + b"}"
    assert len(doc) > PARSE_BYTES
    got, answered = _usage_of(doc)
    assert answered == len(doc)
    assert got == ({"prompt_tokens": 7, "total_tokens": 7} if where == "tail" else None)

"""The gateway's HTTP/1.1 client to replicas: an asyncio protocol with the C parser uvicorn uses (`httptools`).

httpx (h11 in Python, anyio streams, a cancel scope per read, a pool that scans its connections) cost the server
more CPU per request and per relayed chunk than everything else in the gateway together (docs/serving.md,
"Measured"). This client does only what the gateway needs: one write per request (headers and body together), the
answer's status and content type, its body as the chunks the socket delivered (what arrived together comes out
together; chunked encoding decoded), keep-alive connections per replica, and bounded waits.

- Failures before the answer's headers raise `NoAnswer` (the request may go to another replica); after them,
  `BrokeOff` (the stream ends with an error event). A reused keep-alive connection that the replica had closed is
  retried once on a new one before that counts as the replica's failure.
- A slow client slows the replica: reading pauses while more than `BUFFER_BYTES` wait to be relayed.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

import httptools

IDLE_S = 4.0  # a kept connection older than this is closed, not reused (uvicorn closes idle ones after 5 s)
IDLE_MAX = 64  # kept connections per replica
BUFFER_BYTES = 1 << 20
HEAD_BYTES = 64 << 10  # an answer's status line and headers: a replica runs its owner's code, and may send any
HEAD_STEP = 16 << 10  # the head is fed to the parser this much at a time, so its size is known as it grows


class NoAnswer(Exception):
    """The replica refused, reset, hung up or timed out before its answer's headers."""


class BrokeOff(Exception):
    """The replica's answer ended before its end (reset, hung up, unparseable, or timed out)."""


class _Conn(asyncio.Protocol):
    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.content_type = ""
        self.keep_alive = False
        self.headed = False
        self.head_bytes = 0
        self.complete = False
        self.error: str | None = None
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.waiter: asyncio.Future[None] | None = None

    # ---- asyncio.Protocol ---------------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            if self.headed:
                self.parser.feed_data(data)
            else:  # the head in steps: the parser holds a header's value whole, however long the replica makes it
                for i in range(0, len(data), HEAD_STEP):
                    self.parser.feed_data(data[i : i + HEAD_STEP])
                    if self.headed or self.error is not None:
                        if self.headed and i + HEAD_STEP < len(data):
                            self.parser.feed_data(data[i + HEAD_STEP :])
                        break
                    self.head_bytes += min(HEAD_STEP, len(data) - i)
                    if self.head_bytes > HEAD_BYTES:
                        self._fail(f"an answer's head (status line and headers) longer than {HEAD_BYTES} bytes")
                        break
        except httptools.HttpParserUpgrade:
            self._fail("an upgrade, not an answer")
        except httptools.HttpParserError as e:
            self._fail(f"unparseable answer ({e})")
        if self.buffered > BUFFER_BYTES and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.complete:
            if self.headed and exc is None and not self.keep_alive and self.error is None:
                self.complete = True  # an answer that said `Connection: close` ends with the connection
            else:
                self._fail(f"connection lost ({exc or 'closed'})")
        self._wake()

    # ---- httptools callbacks ------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.headed:  # a second answer to one request: nothing after it on this connection is trusted
            self._fail("more than one answer to one request")

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.content_type = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        self.headed = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self.error is not None:
            return
        self.chunks.append(body)
        self.buffered += len(body)
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # ---- ours ---------------------------------------------------------------------------------------------
    def _fail(self, why: str) -> None:
        self.error = self.error or why
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Until something happens (bytes, the end, an error) or `timeout` passes (TimeoutError)."""
        loop = asyncio.get_running_loop()
        self.waiter = fut = loop.create_future()
        timer = loop.call_later(timeout, _expire, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self.waiter = None


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


class Answer:
    """A replica's answer: `status_code`, `content_type`, then `async for chunk in answer` and `aclose()`."""

    def __init__(self, pool: Pool, conn: _Conn, read_timeout: float) -> None:
        self.pool, self.conn, self.read_timeout = pool, conn, read_timeout
        self.status_code, self.content_type = conn.status, conn.content_type
        self.closed = False

    def __aiter__(self) -> Answer:
        return self

    async def __anext__(self) -> bytes:
        c = self.conn
        while True:
            if c.chunks:
                data = c.chunks.popleft() if len(c.chunks) == 1 else b"".join(c.chunks)
                c.chunks.clear()
                c.buffered = 0
                if c.paused and c.transport is not None:
                    c.paused = False
                    c.transport.resume_reading()
                return data
            if c.complete:
                raise StopAsyncIteration
            if c.error is not None:
                raise BrokeOff(c.error)
            try:
                await c.wait(self.read_timeout)
            except TimeoutError:
                c._fail(f"no bytes for {self.read_timeout:g} s")
                raise BrokeOff(c.error) from None

    async def aclose(self) -> None:
        """Done with it: a complete answer's connection is kept for the next request, any other is closed."""
        if self.closed:
            return
        self.closed = True
        self.pool.release(self.conn)


class Pool:
    """Keep-alive connections per replica address, for one event loop."""

    def __init__(self, connect_timeout: float, read_timeout: float) -> None:
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.idle: dict[tuple[str, int], list[_Conn]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None

    async def post(self, host: str, port: int, path: str, body: bytes, secret: str = "") -> Answer:
        """POST `body` (JSON), with the replica's `secret` as a bearer token when it has one; the answer once its
        headers came. `NoAnswer` if they did not."""
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        auth = f"authorization: Bearer {secret}\r\n" if secret else ""
        head = (f"POST {path} HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\naccept: */*\r\n"
                f"{auth}content-length: {len(body)}\r\n\r\n").encode("latin-1")  # fmt: skip
        conn = self._kept((host, port))
        if conn is not None:
            try:
                return await self._exchange(conn, head + body)
            except NoAnswer:
                if not conn.lost:
                    raise
                # the replica closed the kept connection as this went out: once more, on a new one
        return await self._exchange(await self._connect(host, port), head + body)

    def _kept(self, key: tuple[str, int]) -> _Conn | None:
        loop = asyncio.get_running_loop()
        if loop is not self.loop:  # connections belong to the loop that made them (tests run one loop per call)
            self.idle.clear()
            self.loop = loop
        conns = self.idle.get(key)
        now = time.monotonic()
        while conns:
            c = conns.pop()
            if not c.lost and now - c.idle_since < IDLE_S:
                return c
            if c.transport is not None:
                c.transport.close()
        return None

    async def _connect(self, host: str, port: int) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn((host, port)), host, port), self.connect_timeout
            )
        except TimeoutError:
            raise NoAnswer(f"no connection within {self.connect_timeout:g} s") from None
        except OSError as e:
            raise NoAnswer(f"{type(e).__name__}: {e}") from None
        return conn

    async def _exchange(self, conn: _Conn, request: bytes) -> Answer:
        assert conn.transport is not None
        conn.transport.write(request)
        try:
            while not conn.headed:
                if conn.error is not None:
                    raise NoAnswer(conn.error)
                await conn.wait(self.read_timeout)
        except TimeoutError:
            conn._fail("timed out")
            raise NoAnswer(f"no answer within {self.read_timeout:g} s") from None
        except BaseException:
            conn._fail("cancelled")
            raise
        return Answer(self, conn, self.read_timeout)

    def release(self, conn: _Conn) -> None:
        if conn.complete and conn.keep_alive and not conn.lost and conn.error is None:
            conns = self.idle.setdefault(conn.key, [])
            if len(conns) < IDLE_MAX:
                conn._reset()
                conn.idle_since = time.monotonic()
                conns.append(conn)
                return
        conn._fail("closed by the gateway")

    def close(self) -> None:
        for conns in self.idle.values():
            for c in conns:
                if c.transport is not None:
                    c.transport.close()
        self.idle.clear()

"""PipeBridge's input path under flow control, against a channel that behaves as asyncssh's does: while paused it
queues what arrives, and `resume_reading()` hands the queue (data, then a queued EOF) to the session at once, from
inside the call. asyncio's pipe transport calls the protocol's `resume_writing` from its write-ready handler just
before it checks whether it is closing, so a bridge that resumes the channel right there gets its last data and the
EOF written into that handler: the transport then closed the pipe with that data still in its buffer (seen as
`ssh box wc -c` counting 262,144 of 300,000 bytes) and left its writer registered on a closed descriptor.
"""

from __future__ import annotations

import asyncio
from typing import Any

from suanli.ssh.session import PipeBridge


class QueueingChannel:
    """The parts of asyncssh's SSHChannel a PipeBridge uses, with asyncssh's pause/resume semantics."""

    def __init__(self) -> None:
        self.bridge: PipeBridge | None = None
        self.paused = False
        self.queue: list[bytes | None] = []  # None is the EOF
        self.out = bytearray()
        self.err = bytearray()
        self.status: int | None = None
        self.done = asyncio.Event()

    def receive(self, item: bytes | None) -> None:
        self.queue.append(item)
        self._flush()

    def _flush(self) -> None:
        while self.queue and not self.paused:
            item = self.queue.pop(0)
            assert self.bridge is not None
            self.bridge.input(item) if item is not None else self.bridge.input_eof()

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        if self.paused:
            self.paused = False
            self._flush()

    def write(self, data: bytes) -> None:
        self.out += data

    def write_stderr(self, data: bytes) -> None:
        self.err += data

    def exit(self, code: int) -> None:
        self.status = code
        self.done.set()

    def exit_with_signal(self, name: str, *args: Any) -> None:
        self.status = -1
        self.done.set()


async def _count(total: int, chunk: int, reader: str) -> tuple[bytes, int | None]:
    chan = QueueingChannel()
    bridge = PipeBridge(chan)
    chan.bridge = bridge
    await bridge.start(["/bin/sh", "-c", reader], {"PATH": "/usr/bin:/bin"})
    for at in range(0, total, chunk):
        chan.receive(b"x" * min(chunk, total - at))
        await asyncio.sleep(0)  # packets arrive over time, as from the network
    chan.receive(None)
    await asyncio.wait_for(chan.done.wait(), 30)
    return bytes(chan.out), chan.status


def test_all_input_reaches_a_reader_slower_than_the_client() -> None:
    """A reader that starts late makes the pipe fill, the channel pause, and the rest (and the EOF) wait in the
    channel's queue until the pipe drains: every byte must still arrive before the EOF."""

    async def main() -> list[tuple[int, int, bytes, int | None]]:
        wrong = []
        for total in (300_000, 65_536 * 3 + 5_088, 1_000_000):
            for chunk in (32_768, 5_000):
                out, status = await _count(total, chunk, "sleep 0.05; wc -c")
                if (out, status) != (f"{total}\n".encode(), 0):
                    wrong.append((total, chunk, out, status))
        return wrong

    assert asyncio.run(main()) == []


def test_input_survives_many_pause_and_resume_cycles() -> None:
    """A reader that takes small bites pauses and resumes the channel many times in one stream."""

    async def main() -> list[tuple[bytes, int | None]]:
        runs = [await _count(300_000, 32_768, "dd bs=4096 status=none | wc -c") for _ in range(20)]
        return [run for run in runs if run != (b"300000\n", 0)]

    assert asyncio.run(main()) == []

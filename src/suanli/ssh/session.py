"""Bridges between an SSH channel and a process running inside an instance's sandbox.

`PipeBridge` wires a channel to a process's stdin/stdout/stderr pipes (commands, the SFTP server, port-forward
relays); `PtyBridge` to a pseudo-terminal (interactive shells, `ssh -t`). Both apply flow control both ways:
when the client reads slowly the process's output is paused (so a fast producer cannot fill the gateway's memory),
and when the process reads slowly the channel stops taking data (so does the client, through the SSH window). The
exit status goes back only after every byte of output has been handed to the channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import signal
import struct
import termios
from typing import Any

log = logging.getLogger("suanli.ssh")
READ_CHUNK = 256 << 10
INPUT_HIGH_WATER = 1 << 20  # bytes queued towards the process before the channel stops reading
PTY_DRAIN_S = 0.2  # after the shell exits, output still in the terminal is read this long (background jobs hold it)


def exit_to_channel(chan: Any, code: int | None) -> None:
    """A negative code is the signal that killed it (asyncio's convention), as SSH's exit-signal."""
    with contextlib.suppress(Exception):  # the client may be gone already
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name.removeprefix("SIG")
            except ValueError:
                name = "KILL"
            chan.exit_with_signal(name)
        else:
            chan.exit(255 if code is None else code)


class _PipeProtocol(asyncio.SubprocessProtocol):
    def __init__(self, bridge: PipeBridge) -> None:
        self.bridge = bridge

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        self.bridge.output(fd, data if isinstance(data, bytes) else data.encode())

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self.bridge.pipe_closed(fd)

    def process_exited(self) -> None:
        self.bridge.exited()

    def pause_writing(self) -> None:  # the process's stdin is full
        self.bridge.input_paused = True
        self.bridge.chan.pause_reading()

    def resume_writing(self) -> None:
        # Not from here: asyncio calls this from the stdin transport's write-ready handler, which closes the pipe
        # right after if a close was asked meanwhile, with whatever was written meanwhile still unsent. The channel
        # hands its queued data and EOF to the session inside resume_reading(), so it resumes on the next turn.
        self.bridge.input_paused = False
        asyncio.get_running_loop().call_soon(self.bridge.resume_input)


class PipeBridge:
    """One process with pipes, wired to one channel. `stderr=False` (port-forward relays) drops its stderr to the
    gateway's log instead of the data stream."""

    def __init__(self, chan: Any, *, stderr: bool = True) -> None:
        self.chan, self.stderr = chan, stderr
        self.transport: asyncio.SubprocessTransport | None = None
        self.open_pipes = {1, 2}
        self.code: int | None = None
        self.has_exited = False
        self.early: list[bytes] = []  # input that came before the process started
        self.early_eof = False
        self.finished = False
        self.input_paused = False  # the process's stdin is full, so the channel is not read

    async def start(self, argv: list[str], env: dict[str, str]) -> None:
        loop = asyncio.get_running_loop()
        self.transport, _ = await loop.subprocess_exec(
            lambda: _PipeProtocol(self), *argv, stdin=-1, stdout=-1, stderr=-1, env=env, start_new_session=True
        )
        for data in self.early:
            self.input(data)
        self.early.clear()
        if self.early_eof:
            self.input_eof()

    def input(self, data: bytes) -> None:
        if self.transport is None:
            self.early.append(data)
            return
        stdin = self.transport.get_pipe_transport(0)
        if stdin is not None and not stdin.is_closing():
            stdin.write(data)  # type: ignore[attr-defined]

    def resume_input(self) -> None:
        if not self.input_paused:  # (not paused again since the resume was scheduled)
            self.chan.resume_reading()

    def input_eof(self) -> None:
        if self.transport is None:
            self.early_eof = True
            return
        stdin = self.transport.get_pipe_transport(0)
        if stdin is not None and not stdin.is_closing():
            stdin.close()

    def output(self, fd: int, data: bytes) -> None:
        if fd == 1:
            self.chan.write(data)
        elif self.stderr:
            self.chan.write_stderr(data)
        else:
            log.debug("relay: %s", data[:500].decode(errors="replace").strip())

    def pause_output(self, paused: bool) -> None:
        """The channel's send buffer is full (or drained again): stop (or go on) reading the process's output."""
        if self.transport is None:
            return
        for fd in (1, 2):
            pipe = self.transport.get_pipe_transport(fd)
            if pipe is not None and not pipe.is_closing():
                pipe.pause_reading() if paused else pipe.resume_reading()  # type: ignore[attr-defined]

    def pipe_closed(self, fd: int) -> None:
        self.open_pipes.discard(fd)
        self._maybe_finish()

    def exited(self) -> None:
        self.has_exited = True
        assert self.transport is not None
        self.code = self.transport.get_returncode()
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if self.finished or not self.has_exited or self.open_pipes:
            return
        self.finished = True
        exit_to_channel(self.chan, self.code)
        assert self.transport is not None
        self.transport.close()  # the process is reaped and its output read: what is left is its stdin, if open

    def hangup(self) -> None:
        """The client went away: the process gets SIGHUP, as under sshd."""
        if self.transport is not None and not self.has_exited:
            with contextlib.suppress(ProcessLookupError):
                self.transport.send_signal(signal.SIGHUP)
            self.transport.close()

    def signal(self, name: str) -> None:
        sig = getattr(signal, f"SIG{name}", None)
        if self.transport is not None and not self.has_exited and isinstance(sig, signal.Signals):
            with contextlib.suppress(ProcessLookupError):
                self.transport.send_signal(sig)


def set_winsize(fd: int, cols: int, rows: int, xpixel: int = 0, ypixel: int = 0) -> None:
    """TIOCSWINSZ on the master: the kernel then sends SIGWINCH to the terminal's foreground process group."""
    with contextlib.suppress(OSError):
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, xpixel, ypixel))


class PtyBridge:
    """One process on a new pseudo-terminal, wired to one channel."""

    def __init__(self, chan: Any, term_size: tuple[int, int, int, int]) -> None:
        self.chan = chan
        self.master, slave = os.openpty()
        os.set_blocking(self.master, False)
        self.slave: int | None = slave
        cols, rows, xpx, ypx = term_size
        set_winsize(self.master, cols or 80, rows or 24, xpx, ypx)
        self.proc: asyncio.subprocess.Process | None = None
        self.pending = bytearray()  # input the terminal has not taken yet
        self.reading = False
        self.paused = False
        self.closed = False
        self.eof = asyncio.Event()

    async def start(self, argv: list[str], env: dict[str, str]) -> None:
        """Start `argv` with the terminal as its stdin/stdout/stderr and controlling terminal (setsid --ctty)."""
        assert self.slave is not None
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdin=self.slave, stdout=self.slave, stderr=self.slave, env=env
            )
        finally:
            os.close(self.slave)  # ours must be closed, or the master never sees the terminal hung up
            self.slave = None
        self._read(True)
        self.waiter = asyncio.get_running_loop().create_task(self._wait())  # held: the loop keeps weak references

    async def _wait(self) -> None:
        assert self.proc is not None
        code = await self.proc.wait()
        with contextlib.suppress(TimeoutError):  # output still in the terminal; a background job may hold it open
            await asyncio.wait_for(self.eof.wait(), PTY_DRAIN_S)
        self._drain_now()
        exit_to_channel(self.chan, code)
        self.close()

    def _read(self, on: bool) -> None:
        if self.closed or on == self.reading:
            return
        loop = asyncio.get_running_loop()
        if on:
            loop.add_reader(self.master, self._readable)
        else:
            loop.remove_reader(self.master)
        self.reading = on

    def _readable(self) -> None:
        try:
            data = os.read(self.master, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError as e:  # EIO: every process closed the terminal
            if e.errno != errno.EIO:
                log.debug("pty read: %s", e)
            data = b""
        if not data:
            self._read(False)
            self.eof.set()
            return
        self.chan.write(data)

    def _drain_now(self) -> None:
        """Whatever output is left in the terminal, without waiting."""
        while not self.closed and not self.eof.is_set():
            try:
                data = os.read(self.master, READ_CHUNK)
            except OSError:
                break
            if not data:
                break
            self.chan.write(data)

    def pause_output(self, paused: bool) -> None:
        self.paused = paused
        self._read(not paused and not self.eof.is_set())

    def input(self, data: bytes) -> None:
        if self.closed:
            return
        had = bool(self.pending)
        self.pending += data
        if not had:
            self._write()

    def _write(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            n = os.write(self.master, self.pending)
        except BlockingIOError:
            n = 0
        except OSError:
            self.pending.clear()
            n = 0
        del self.pending[:n]
        if self.pending:
            loop.add_writer(self.master, self._writable)
            if len(self.pending) > INPUT_HIGH_WATER:
                self.chan.pause_reading()
        else:
            loop.remove_writer(self.master)
            self.chan.resume_reading()

    def _writable(self) -> None:
        if not self.closed and self.pending:
            self._write()

    def input_eof(self) -> None:
        """The client closed its input (`ssh -tt host cmd < file`): the terminal's EOF character, as sshd does."""
        self.input(b"\x04")

    def resize(self, cols: int, rows: int, xpx: int, ypx: int) -> None:
        if not self.closed:
            set_winsize(self.master, cols, rows, xpx, ypx)

    def signal(self, name: str) -> None:
        sig = getattr(signal, f"SIG{name}", None)
        if self.proc is not None and self.proc.returncode is None and isinstance(sig, signal.Signals):
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def hangup(self) -> None:
        """The client went away: closing the master hangs the terminal up (SIGHUP to the session), as under sshd."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGHUP)
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        self._read(False)
        loop.remove_writer(self.master)
        self.closed = True
        os.close(self.master)

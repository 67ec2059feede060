"""A real SMTP server (aiosmtpd) on a free local port for tests: what it receives, parsed, and the link in it."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from tests.control_plane import free_port

LINK = re.compile(r"https?://\S+/verify\?token=([A-Za-z0-9_-]+)")


@dataclass
class Inbox:
    """What the server received: (envelope recipients, parsed message), and the logins it was offered."""

    url: str
    received: list[tuple[list[str], EmailMessage]] = field(default_factory=list)
    logins: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # aiosmtpd calls it by this name
        msg = message_from_bytes(envelope.original_content, policy=policy.default)
        with self.lock:
            self.received.append((list(envelope.rcpt_tos), msg))  # type: ignore[arg-type]
        return "250 OK"

    def wait(self, count: int, timeout: float = 15.0) -> list[tuple[list[str], EmailMessage]]:
        """The first `count` messages, once they have arrived (mail is sent on a thread after the answer)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.received) >= count:
                    return list(self.received)
            time.sleep(0.05)
        raise AssertionError(f"{count} messages not received after {timeout} s (got {len(self.received)})")

    def token(self, index: int = -1) -> str:
        """The verification token of the link in message `index` (as a user would click it)."""
        with self.lock:
            body = self.received[index][1].get_body(("plain",)).get_content()  # type: ignore[union-attr]
        m = LINK.search(body)
        assert m is not None, body
        return m.group(1)


@contextmanager
def smtp_server(*, user: str | None = None, password: str | None = None) -> Iterator[Inbox]:
    """An SMTP server receiving into an `Inbox`; with `user`, it asks for that login (AUTH over plain TCP, as a
    local relay may)."""
    port = free_port()
    inbox = Inbox(f"smtp://127.0.0.1:{port}")
    kwargs: dict[str, Any] = {}
    if user is not None:

        def check(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
            ok = isinstance(data, LoginPassword) and (data.login.decode(), data.password.decode()) == (user, password)
            if isinstance(data, LoginPassword):
                inbox.logins.append((data.login.decode(), data.password.decode()))
            return AuthResult(success=ok)

        kwargs = {"authenticator": check, "auth_required": True, "auth_require_tls": False}
    controller = Controller(inbox, hostname="127.0.0.1", port=port, **kwargs)
    controller.start()
    try:
        yield inbox
    finally:
        controller.stop()

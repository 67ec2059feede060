"""A real SMTP server (aiosmtpd) on a free local port for tests: what it receives, parsed, and the link in it."""

from __future__ import annotations

import ipaddress
import re
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fastapi.testclient import TestClient

from suanli.api.app import create_app
from tests.control_plane import free_port, settings

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


def tls_pair(tmp: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a fresh self-signed certificate for 127.0.0.1, and a client context trusting only it."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_file, key_file = tmp / "smtp-cert.pem", tmp / "smtp-key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert_file, key_file)
    client = ssl.create_default_context(cafile=str(cert_file))
    return server, client


@contextmanager
def smtp_server(
    *,
    user: str | None = None,
    password: str | None = None,
    starttls: ssl.SSLContext | None = None,
    implicit_tls: ssl.SSLContext | None = None,
) -> Iterator[Inbox]:
    """An SMTP server receiving into an `Inbox`; with `user`, it asks for that login; with `starttls`, it offers
    STARTTLS and refuses mail without it; with `implicit_tls`, it speaks TLS from the first byte (smtps)."""
    port = free_port()
    inbox = Inbox(f"{'smtps' if implicit_tls else 'smtp'}://127.0.0.1:{port}")
    kwargs: dict[str, Any] = {}
    if starttls is not None:
        kwargs.update(tls_context=starttls, require_starttls=True)
    if implicit_tls is not None:
        kwargs.update(ssl_context=implicit_tls)
    if user is not None:

        def check(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
            ok = isinstance(data, LoginPassword) and (data.login.decode(), data.password.decode()) == (user, password)
            if isinstance(data, LoginPassword):
                inbox.logins.append((data.login.decode(), data.password.decode()))
            return AuthResult(success=ok)

        kwargs.update(authenticator=check, auth_required=True, auth_require_tls=starttls is not None)
    controller = Controller(inbox, hostname="127.0.0.1", port=port, **kwargs)
    controller.start()
    try:
        yield inbox
    finally:
        controller.stop()


SITE = "https://gpu.example.com"  # the public_url of `mail_api`: where its links point
BROWSER = "https://testserver"  # users are on HTTPS (`public_url`), so the test client is too: the cookies are Secure


@pytest.fixture(name="inbox")
def inbox_fixture() -> Iterator[Inbox]:
    """A real SMTP server, receiving."""
    with smtp_server() as box:
        yield box


@pytest.fixture(name="mail_api")
def mail_api_fixture(db_url: str, tmp_path: Path, cheap_password_hashing: None, inbox: Inbox) -> Iterator[TestClient]:
    """The app of a server that mails `inbox` (so a signup's trial credit waits for the link)."""
    with TestClient(
        create_app(settings(tmp_path / "home", db_url, smtp_url=inbox.url, public_url=SITE)), base_url=BROWSER
    ) as client:
        yield client

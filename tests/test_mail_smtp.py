"""The SMTP mailer against a real server (aiosmtpd): a login from the URL, STARTTLS where offered, smtps, a server
that is down or never answers (an error within the timeout, never a hang), and settings that keep the password out
of sight."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from suanli.control.errors import Invalid
from suanli.control.settings import load
from suanli.mail import Mail, MailError
from suanli.mail.smtp import SmtpMailer
from tests.control_plane import free_port
from tests.mail_helpers import smtp_server, tls_pair

# the server of the plain-TCP login test asks for AUTH without TLS on purpose: the mailer must refuse it
pytestmark = pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS:UserWarning")
MAIL = Mail(to="user@example.com", subject="Verify", body="Open https://x.example/verify?token=abc\n")


def test_it_logs_in_with_the_urls_percent_decoded_credentials(tmp_path: Path) -> None:
    server, client = tls_pair(tmp_path)
    with smtp_server(starttls=server, user="relay@x", password="p@ss:/w") as box:
        url = box.url.replace("smtp://", "smtp://relay%40x:p%40ss%3A%2Fw@")
        SmtpMailer(url, "noreply@example.com", context=client).send(MAIL)
        [(rcpt, msg)] = box.wait(1)
    assert box.logins == [("relay@x", "p@ss:/w")]
    assert rcpt == ["user@example.com"] and msg["From"] == "noreply@example.com" and msg["Subject"] == "Verify"
    assert "token=abc" in msg.get_body(("plain",)).get_content()  # type: ignore[union-attr]


def test_a_wrong_password_is_a_mail_error(tmp_path: Path) -> None:
    server, client = tls_pair(tmp_path)
    with smtp_server(starttls=server, user="relay", password="right") as box:
        url = box.url.replace("smtp://", "smtp://relay:wrong@")
        with pytest.raises(MailError, match=r"127\.0\.0\.1"):
            SmtpMailer(url, context=client).send(MAIL)
    assert box.received == []


def test_smtp_upgrades_with_starttls_when_offered(tmp_path: Path) -> None:
    server, client = tls_pair(tmp_path)
    with smtp_server(starttls=server, user="u", password="pw") as box:  # refuses AUTH and mail without TLS
        SmtpMailer(box.url.replace("smtp://", "smtp://u:pw@"), context=client).send(MAIL)
        box.wait(1)
    assert box.logins == [("u", "pw")]


def test_starttls_checks_the_certificate(tmp_path: Path) -> None:
    server, _ = tls_pair(tmp_path)
    # a self-signed certificate the system does not trust
    with smtp_server(starttls=server) as box, pytest.raises(MailError, match=r"certificate"):
        SmtpMailer(box.url).send(MAIL)
    assert box.received == []


def test_smtps_speaks_tls_from_the_first_byte(tmp_path: Path) -> None:
    server, client = tls_pair(tmp_path)
    with smtp_server(implicit_tls=server) as box:
        assert box.url.startswith("smtps://")
        SmtpMailer(box.url, context=client).send(MAIL)
        [(rcpt, _)] = box.wait(1)
    assert rcpt == ["user@example.com"]


def test_a_server_that_is_down_or_silent_fails_within_the_timeout() -> None:
    with pytest.raises(MailError):
        SmtpMailer(f"smtp://127.0.0.1:{free_port()}").send(MAIL)
    with socket.socket() as silent:  # accepts the connection, never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        start = time.monotonic()
        with pytest.raises(MailError, match="timed out"):
            SmtpMailer(f"smtp://127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.5).send(MAIL)
        assert time.monotonic() - start < 5


def test_settings_take_the_url_from_the_environment_and_never_show_the_password(tmp_path: Path) -> None:
    cfg = load({"home": tmp_path}, environ={"SUANLI_SMTP_URL": "smtps://u:secret@mail.example.com",
                                            "SUANLI_MAIL_FROM": "gpu@example.com",
                                            "SUANLI_PUBLIC_URL": "https://gpu.example.com/"})  # fmt: skip
    assert cfg.smtp_url == "smtps://u:secret@mail.example.com" and cfg.mail_from == "gpu@example.com"
    assert cfg.site_url == "https://gpu.example.com"
    assert "secret" not in repr(cfg) and "secret" not in repr(SmtpMailer(cfg.smtp_url))
    assert SmtpMailer(cfg.smtp_url).port == 465 and SmtpMailer("smtp://h").port == 25
    assert load({"home": tmp_path}, environ={}).site_url == "http://127.0.0.1:8000"


@pytest.mark.parametrize(
    ("name", "value"),
    [("smtp_url", "http://mail.example.com"), ("smtp_url", "smtp://"), ("smtp_url", "smtp://h:port"),
     ("public_url", "ftp://x"), ("public_url", "gpu.example.com"), ("public_url", "https://x/?a=1")],
)  # fmt: skip
def test_bad_urls_are_refused_at_start_naming_the_setting(tmp_path: Path, name: str, value: str) -> None:
    with pytest.raises(Invalid, match=name):
        load({"home": tmp_path, name: value}, environ={})

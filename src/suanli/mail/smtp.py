"""`Mailer` over the standard library's smtplib: smtp:// upgrades with STARTTLS when the server offers it, smtps://
speaks TLS from the first byte; a login is only ever sent over TLS; every step has a timeout so a dead server cannot
hold a thread for long."""

from __future__ import annotations

import smtplib
import ssl
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from urllib.parse import unquote, urlsplit

from suanli.mail import Mail, MailError

TIMEOUT_S = 10.0


class SmtpMailer:
    """Sends through the server named by `url` (smtp://[USER:PASS@]HOST[:PORT] or smtps://…), a new connection for
    each message: verification mail is rare, and no connection is left to go stale."""

    def __init__(
        self,
        url: str,
        sender: str | None = None,
        *,
        timeout_s: float = TIMEOUT_S,
        context: ssl.SSLContext | None = None,
    ) -> None:
        u = urlsplit(url)
        if u.scheme not in ("smtp", "smtps") or not u.hostname:
            raise ValueError("must be smtp://[USER:PASS@]HOST[:PORT] or smtps://…")
        try:
            u.port  # noqa: B018  (a port that is not a number raises here, at start, not at the first signup)
        except ValueError:
            raise ValueError("port: not a number") from None
        self.tls = u.scheme == "smtps"
        self.host = u.hostname
        self.port = u.port or (465 if self.tls else 25)
        self.user = unquote(u.username) if u.username else None
        self.password = unquote(u.password) if u.password else None
        self.sender = sender or f"suanli@{self.host}"
        self.timeout_s = timeout_s
        self.context = context  # None: the system's CAs, host names checked

    def __repr__(self) -> str:  # never the password
        return f"SmtpMailer({'smtps' if self.tls else 'smtp'}://{self.host}:{self.port})"

    def _message(self, mail: Mail) -> EmailMessage:
        """The message, or `MailError` where `mail.to` is not exactly one plain address: an address that passed
        signup's check may still read as others in To: (`x,thief@evil.example`, `x<thief@evil.example>`), and the
        mail must reach the account's address and nobody else."""
        msg = EmailMessage()
        try:
            msg["To"] = mail.to
            addresses = [a.addr_spec for a in msg["To"].addresses]
        except (ValueError, TypeError, IndexError) as e:  # the header parser's refusals
            raise MailError(f"mail to {mail.to!r}: not one plain address ({e})") from e
        if addresses != [mail.to] or "@" not in mail.to or msg["To"] != mail.to:
            raise MailError(f"mail to {mail.to!r}: not one plain address (reads as {addresses})")
        if mail.to.rsplit("@", 1)[1].startswith("["):  # an IP literal: the relay would connect wherever it says
            raise MailError(f"mail to {mail.to!r}: an address at an IP literal is not mailed")
        msg["From"], msg["Subject"] = self.sender, mail.subject
        msg["Date"], msg["Message-ID"] = formatdate(localtime=False), make_msgid(domain=self.sender.split("@")[-1])
        msg.set_content(mail.body)
        return msg

    def send(self, mail: Mail) -> None:
        msg = self._message(mail)  # refused before connecting
        context = self.context or ssl.create_default_context()
        try:
            if self.tls:
                conn: smtplib.SMTP = smtplib.SMTP_SSL(self.host, self.port, timeout=self.timeout_s, context=context)
            else:
                conn = smtplib.SMTP(self.host, self.port, timeout=self.timeout_s)
            with conn:
                secure = self.tls
                if not self.tls:
                    conn.ehlo()
                    if conn.has_extn("starttls"):
                        conn.starttls(context=context)
                        conn.ehlo()
                        secure = True
                if self.user is not None:
                    if not secure:  # no offer, or someone on the path stripped it: the password stays here
                        raise MailError(f"mail via {self.host}:{self.port}: the server offers no STARTTLS, and the "
                                        "login is never sent in the clear (use a server with TLS, or smtps://)")  # fmt: skip
                    conn.login(self.user, self.password or "")
                conn.send_message(msg, to_addrs=[mail.to])  # the envelope names the address, never To:'s reading
        except (OSError, smtplib.SMTPException) as e:  # refused, unreachable, timed out, TLS, auth, rejected
            raise MailError(f"mail to {mail.to} via {self.host}:{self.port}: {e}") from e

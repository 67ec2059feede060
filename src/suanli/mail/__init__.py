"""Outgoing mail: the `Mailer` interface the services send through, and `smtp.SmtpMailer`, its one implementation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Mail:
    """One plain-text message to one recipient."""

    to: str
    subject: str
    body: str


class MailError(Exception):
    """The message could not be handed to the mail server (down, refused, timed out, bad credentials)."""


class Mailer(Protocol):
    def send(self, mail: Mail) -> None:
        """Hand `mail` to the mail server, or raise `MailError`. Blocks on the network: never call it holding a
        database transaction."""
        ...

"""`suanli admin create-user` and `suanli admin set-password`: the operator commands that open the database
directly (migrating it first), with no server or login: how the first admin is made, and how anyone locked out
(an operator who forgot their password, a user on a server that sends no mail) gets back in."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from suanli.cli import credentials as cred
from suanli.cli.common import console, fail
from suanli.cli.credentials import PasswordStdinOpt
from suanli.cli.server_db import ConfigOpt, DbOpt, open_database

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from suanli.control.settings import Settings

EmailOpt = Annotated[str, typer.Option("--email", help="The user's email address.")]


@contextmanager
def _transaction(db: str | None, config: Path | None) -> Iterator[tuple[Session, Settings]]:
    """One write transaction on the server's database; a refusal or a database error ends the command with its
    message."""
    from sqlalchemy.exc import SQLAlchemyError

    from suanli.control.errors import ServiceError

    try:
        with open_database(db, config) as (settings, database), database.write() as s, s.begin():
            yield s, settings
    except ServiceError as e:
        fail(e.message)
    except SQLAlchemyError as e:
        typer.echo(f"error: database: {' '.join(str(e.orig or e).split())[:300]}", err=True)
        raise typer.Exit(cred.EXIT_UNAVAILABLE) from None


def create_user(
    email: Annotated[str, typer.Option("--email", help="The new user's email address.")],
    admin: Annotated[bool, typer.Option("--admin", help="Make the user an operator.")] = False,
    trial_credit: Annotated[bool, typer.Option("--trial-credit", help="Grant the sign-up trial credit.")] = False,
    password_stdin: PasswordStdinOpt = False,
    db: DbOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Create a user in the database directly (migrating it first): no server or login needed.

    This is how the first admin is made: `suanli admin create-user --email ops@example.com --admin`."""
    from suanli.control.accounts import accounts
    from suanli.control.ids import utcnow

    password = cred.read_password(password_stdin, confirm=True)
    with _transaction(db, config) as (s, settings):
        credit = settings.trial_credit if trial_credit else Decimal(0)
        user, org = accounts.create_user(s, email, password, utcnow(), admin=admin, trial_credit=credit)
        user_email, user_id, org_id = user.email, user.id, org.id
    console.print(f"created {'admin ' if admin else ''}user [bold]{user_email}[/] ({user_id}; org {org_id})")


def set_password(email: EmailOpt, password_stdin: PasswordStdinOpt = False, db: DbOpt = None,
                 config: ConfigOpt = None) -> None:  # fmt: skip
    """Set a user's password in the database directly: no server or login needed. As a reset by mail does, it
    revokes every token of the user (a running server stops accepting them within 5 seconds), ends their instance
    proxy sessions, spends their reset links and removes their SSH keys."""
    from sqlalchemy import select

    from suanli.control.accounts import accounts, password_resets
    from suanli.control.errors import ServiceError
    from suanli.control.ids import utcnow
    from suanli.db.models import User

    address = accounts.normalise_email(email)
    password = cred.read_password(password_stdin, confirm=True)
    try:
        accounts.check_password(password)
    except ServiceError as e:
        fail(e.message)
    hashed = accounts.hash_password(password)
    with _transaction(db, config) as (s, _):
        user_id = s.scalar(select(User.id).where(User.email == address))
        if user_id is None:
            fail(f"no user has the email {address} ('suanli admin users' lists them)")
        out = password_resets.set_password(s, user_id, hashed, utcnow(), drop_ssh_keys=True)
    console.print(f"password set for [bold]{address}[/]; {out.tokens} token(s) revoked, {out.ssh_keys} SSH key(s) "
                  f"removed, {out.endpoint_keys} endpoint key(s) revoked")  # fmt: skip

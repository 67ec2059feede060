"""Password commands: change yours (`passwd`), ask for a reset link by mail (`forgot-password`) and redeem it
(`reset-password`). Any new password signs you out everywhere else; an operator's `suanli admin set-password`
is the way where the server sends no mail."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import parse_qs, urlsplit

import typer

from suanli.cli import credentials as cred
from suanli.cli.common import JsonOpt, console, emit_json
from suanli.cli.credentials import ServerOpt, jsonable

StdinOpt = Annotated[
    bool,
    typer.Option("--password-stdin", help="Read the passwords from stdin, one per line (for scripts)."),
]


def passwd(password_stdin: StdinOpt = False, server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """Change your password, given the current one (with --password-stdin: the current one on the first line,
    the new one on the second). Every other login, console session and API token of yours is revoked; this
    login stays."""
    current = cred.read_password(password_stdin, confirm=False, prompt="Current password")
    new = cred.read_password(password_stdin, confirm=True, prompt="New password")
    with cred.api(server) as c:
        out = c.change_password(current, new)
    if json_out:
        emit_json(jsonable(out))
        return
    console.print(f"password changed for [bold]{out.email}[/]; {out.revoked_tokens} other token(s) revoked")


def forgot_password(
    email: Annotated[str, typer.Option("--email", help="Your account's email address.")],
    server: ServerOpt = None,
) -> None:
    """Mail a link to reset your password (where the server sends mail); then run 'suanli reset-password' with
    it. The answer is the same whether or not an account has the address."""
    with cred.api(server, auth=False) as c:
        detail = c.forgot_password(email)
    console.print(detail)


def reset_password(
    token: Annotated[str, typer.Argument(help="The token of the link in the reset e-mail, or the whole link.")],
    password_stdin: cred.PasswordStdinOpt = False,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Set a new password with the link mailed by 'suanli forgot-password'. Every token of the account is revoked:
    log in again with the new password."""
    if "token=" in token:  # the whole link pasted
        token = parse_qs(urlsplit(token).query).get("token", [""])[0]
    new = cred.read_password(password_stdin, confirm=True, prompt="New password")
    with cred.api(server, auth=False) as c:
        out = c.reset_password(token, new)
    if json_out:
        emit_json(jsonable(out))
        return
    console.print(f"password set for [bold]{out.email}[/]; {out.revoked_tokens} token(s) revoked; log in again "
                  "with 'suanli login'")  # fmt: skip


COMMANDS = (("passwd", passwd), ("forgot-password", forgot_password), ("reset-password", reset_password))

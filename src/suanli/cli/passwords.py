"""Password commands: change yours (`passwd`), ask for a reset link by mail (`forgot-password`) and redeem it
(`reset-password`, which asks for the link: a command line is readable by every user of the host). Any new
password signs you out everywhere else; an operator's `suanli admin set-password` is the way where the server
sends no mail."""

from __future__ import annotations

import sys
from typing import Annotated
from urllib.parse import parse_qs, urlsplit

import typer

from suanli.cli import credentials as cred
from suanli.cli.common import JsonOpt, console, emit_json, fail
from suanli.cli.credentials import ServerOpt, jsonable
from suanli.cli.terminal import shown

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
    console.print(f"password changed for [bold]{shown(out.email)}[/]; {out.revoked_tokens} other token(s) revoked")


def forgot_password(
    email: Annotated[str, typer.Option("--email", help="Your account's email address.")],
    server: ServerOpt = None,
) -> None:
    """Mail a link to reset your password (where the server sends mail); then run 'suanli reset-password' with
    it. The answer is the same whether or not an account has the address."""
    with cred.api(server, auth=False) as c:
        detail = c.forgot_password(email)
    console.print(shown(detail))


def reset_password(
    stdin: Annotated[
        bool, typer.Option("--stdin", help="Read the link (or token), then the new password, from stdin, one a line.")
    ] = False,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Set a new password with the link mailed by 'suanli forgot-password' (asked for, not taken as an argument:
    a command line is readable by every user of the host). Every token of the account is revoked and its SSH keys
    are removed: log in again with the new password, and add your keys again."""
    link = _line() if stdin else str(typer.prompt("Link from the e-mail (or its token)", hide_input=True))
    token = parse_qs(urlsplit(link).query).get("token", [""])[0] if "token=" in link else link.strip()
    new = cred.read_password(stdin, confirm=True, prompt="New password", flag="--stdin")
    with cred.api(server, auth=False) as c:
        out = c.reset_password(token, new)
    if json_out:
        emit_json(jsonable(out))
        return
    console.print(f"password set for [bold]{shown(out.email)}[/]; {out.revoked_tokens} token(s) revoked, "
                  f"{out.removed_ssh_keys} SSH key(s) removed, {out.revoked_endpoint_keys} endpoint key(s) revoked; "
                  "log in again with 'suanli login'")  # fmt: skip


def _line() -> str:
    line = sys.stdin.readline().strip()
    if not line:
        fail("--stdin: stdin is empty; pipe the link, then the new password, one a line")
    return line


COMMANDS = (("passwd", passwd), ("forgot-password", forgot_password), ("reset-password", reset_password))

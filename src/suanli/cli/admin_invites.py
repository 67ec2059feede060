"""`suanli admin invites …`: operators' invite codes, for a server whose signup is invite-only (`signup: invite`)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from suanli.cli import credentials as cred
from suanli.cli.common import JsonOpt, check_positive, console, emit_json
from suanli.cli.credentials import ServerOpt, jsonable, when

invites_app = typer.Typer(no_args_is_help=True, help="Invite codes for signup where it is invite-only.")


@invites_app.command("create")
def create(
    uses: Annotated[int, typer.Option("--uses", help="How many people may sign up with it.")] = 1,
    expires_in_days: Annotated[int, typer.Option("--expires-in-days", help="It expires after N days.")] = 7,
    note: Annotated[str, typer.Option("--note", help="Who it is for, to recognise it by.")] = "",
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """A new invite code; it is printed once (`suanli signup --invite CODE`) and stored only as a hash."""
    check_positive(uses, "--uses")
    check_positive(expires_in_days, "--expires-in-days")
    with cred.api(server) as c:
        code = c.admin_invite_create(uses, expires_in_days, note)
    if json_out:
        emit_json({**jsonable(code), "code": code.code})
        return
    typer.echo(code.code)
    typer.echo(f"invite code {code.id}: {code.uses_left} signups until {when(code.expires_at)}", err=True)


@invites_app.command("list")
def listing(server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """Invite codes (their prefixes, never the codes) with the signups they have left."""
    with cred.api(server) as c:
        rows = c.admin_invites()
    if json_out:
        emit_json(jsonable(rows))
        return
    table = Table(title="invite codes")
    for col in ("id", "prefix", "note", "uses left", "created", "expires", "revoked"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.id, r.prefix + "…", r.note, str(r.uses_left), when(r.created_at), when(r.expires_at),
                      when(r.revoked_at))  # fmt: skip
    console.print(table)


@invites_app.command("revoke")
def revoke(code_id: Annotated[str, typer.Argument(metavar="ID", help="Invite code id (code_…).")],
           server: ServerOpt = None) -> None:  # fmt: skip
    """Revoke an invite code: nobody signs up with it from now on."""
    with cred.api(server) as c:
        r = c.admin_invite_revoke(code_id)
    console.print(f"revoked {r.id} ({r.uses_left} signups unused)")

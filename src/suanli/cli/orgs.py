"""`suanli orgs …`: organisations, their members and roles, spend limits and invitations.

Nobody is added to an org without consent: `suanli orgs invite` sends an invitation that the invitee answers with
`suanli orgs accept` or `suanli orgs decline`. Roles (owner, admin, member, viewer) are in docs/control-plane.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from suanli.cli import credentials as cred
from suanli.cli.common import JsonOpt, check_choice, console, emit_json, fail
from suanli.cli.credentials import ServerOpt, jsonable, money, org_id, when
from suanli.cli.terminal import shown

if TYPE_CHECKING:  # the client (httpx) is imported when a command runs
    from suanli.client import Client

ROLES = ("owner", "admin", "member", "viewer")
orgs_app = typer.Typer(no_args_is_help=True, help="Organisations: share a balance with other users.")
OrgArg = Annotated[str, typer.Argument(metavar="ORG", help="Organisation id or name.")]
UserArg = Annotated[str, typer.Argument(metavar="USER", help="The member's email or user id.")]
InvitationArg = Annotated[str, typer.Argument(metavar="INVITATION", help="Invitation id (inv_…).")]


def orgs_table(rows: Any, title: str = "organisations") -> Table:
    table = Table(title=title)
    for col in ("id", "name", "kind", "role", "GPU quota", "CPU quota", "memory quota"):
        table.add_column(col)
    for o in rows:
        quotas = ("-" if q is None else f"{q}{unit}" for q, unit in ((o.quota_gpus, ""), (o.quota_cpus, " cores"),
                                                                      (o.quota_memory_gib, " GiB")))  # fmt: skip
        table.add_row(o.id, shown(o.name), "personal" if o.personal else "team", o.role or "-", *quotas)
    return table


def _org(c: Client, ref: str) -> str:
    return org_id(c, ref) or ref


def _user(c: Client, oid: str, ref: str, org: str) -> str:
    """A user id from an email of a member (or an id as it is)."""
    if "@" not in ref:
        return ref
    uid = next((m.user_id for m in c.members(oid) if m.email == ref.strip().lower()), "")
    if not uid:
        fail(f"USER: {ref} is not a member of {org}")
    return uid


def _limit_text(text: str) -> str | None:
    if text.strip().lower() == "none":
        return None
    return str(cred.parse_amount(text, "LIMIT"))


@orgs_app.command("list")
def orgs_list(server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """The organisations you belong to, with your role."""
    with cred.api(server) as c:
        rows = c.orgs()
    if json_out:
        emit_json(jsonable(rows))
        return
    console.print(orgs_table(rows))


@orgs_app.command("create")
def orgs_create(
    name: Annotated[str, typer.Argument(help="A unique name.")], server: ServerOpt = None, json_out: JsonOpt = False
) -> None:
    """A team organisation that you own."""
    with cred.api(server) as c:
        o = c.org_create(name)
    if json_out:
        emit_json(jsonable(o))
        return
    console.print(f"created organisation {shown(o.name)} ({o.id})")


@orgs_app.command("members")
def orgs_members(org: OrgArg, server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """The members of an organisation: roles, monthly spend limits, and what each was charged this month."""
    with cred.api(server) as c:
        rows = c.members(_org(c, org))
    if json_out:
        emit_json(jsonable(rows))
        return
    table = Table(title=f"members of {org}")
    for col in ("email", "user id", "role", "spend limit / month", "this month"):
        table.add_column(col, justify="right" if col in ("spend limit / month", "this month") else "left")
    for m in rows:
        limit = "-" if m.monthly_spend_limit is None else money(m.monthly_spend_limit)
        table.add_row(shown(m.email), m.user_id, m.role, limit, money(m.month_to_date))
    console.print(table)


@orgs_app.command("invite")
def orgs_invite(
    org: OrgArg,
    email: Annotated[str, typer.Argument(help="Who to invite (registered or not).")],
    role: Annotated[str, typer.Option("--role", help="owner|admin|member|viewer.")] = "member",
    spend_limit: Annotated[
        str | None, typer.Option("--spend-limit", metavar="AMOUNT", help="Most they may spend a month.")
    ] = None,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Invite someone into a team organisation (owners and admins); they accept with 'suanli orgs accept'."""
    role = check_choice(role, ROLES, "--role")
    limit = None if spend_limit is None else _limit_text(spend_limit)
    with cred.api(server) as c:
        inv = c.invite(_org(c, org), email, role, monthly_spend_limit=limit)
    if json_out:
        emit_json({**jsonable(inv), "code": inv.code})
        return
    console.print(f"invited {shown(inv.email)} to {shown(inv.org_name)} as {inv.role} ({inv.id}, until "
                  f"{when(inv.expires_at)}); they accept with 'suanli orgs accept {inv.id}'")  # fmt: skip
    typer.echo(f"invitation code (where signup is invite-only: suanli signup --invite CODE): {inv.code}", err=True)


@orgs_app.command("invitations")
def orgs_invitations(
    org: Annotated[
        str | None, typer.Argument(metavar="[ORG]", help="An org you manage: its pending invitations.")
    ] = None,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Pending invitations to you (or, with ORG, those the organisation sent)."""
    with cred.api(server) as c:
        rows = c.invitations(_org(c, org) if org else None)
    if json_out:
        emit_json(jsonable(rows))
        return
    if not rows:
        console.print("no pending invitations")
        return
    table = Table(title=f"invitations of {org}" if org else "invitations to you")
    for col in ("id", "organisation", "email", "role", "spend limit / month", "invited by", "expires"):
        table.add_column(col)
    for i in rows:
        limit = "-" if i.monthly_spend_limit is None else money(i.monthly_spend_limit)
        table.add_row(i.id, shown(i.org_name), shown(i.email), i.role, limit, shown(i.invited_by), when(i.expires_at))
    console.print(table)


@orgs_app.command("accept")
def orgs_accept(invitation: InvitationArg, server: ServerOpt = None) -> None:
    """Accept an invitation: join the organisation with its role."""
    with cred.api(server) as c:
        o = c.accept(invitation)
    console.print(f"joined {shown(o.name)} ({o.id}) as {o.role}")


@orgs_app.command("decline")
def orgs_decline(invitation: InvitationArg, server: ServerOpt = None) -> None:
    """Decline an invitation."""
    with cred.api(server) as c:
        i = c.decline(invitation)
    console.print(f"declined the invitation to {shown(i.org_name)}")


@orgs_app.command("cancel-invitation")
def orgs_cancel(org: OrgArg, invitation: InvitationArg, server: ServerOpt = None) -> None:
    """Withdraw an invitation the organisation sent (owners and admins)."""
    with cred.api(server) as c:
        i = c.invitation_cancel(_org(c, org), invitation)
    console.print(f"invitation {i.id} to {shown(i.email)}: {i.state}")


@orgs_app.command("role")
def orgs_role(
    org: OrgArg,
    user: UserArg,
    role: Annotated[str, typer.Argument(metavar="ROLE", help="owner|admin|member|viewer.")],
    server: ServerOpt = None,
) -> None:
    """Change a member's role (owners and admins; only owners make or unmake owners)."""
    role = check_choice(role, ROLES, "ROLE")
    with cred.api(server) as c:
        oid = _org(c, org)
        m = c.member_set(oid, _user(c, oid, user, org), role=role)
    console.print(f"{shown(m.email)} is now {m.role} of {org}")


@orgs_app.command("spend-limit")
def orgs_spend_limit(
    org: OrgArg,
    user: UserArg,
    amount: Annotated[str, typer.Argument(metavar="AMOUNT", help="Most they may spend a month, or 'none'.")],
    server: ServerOpt = None,
) -> None:
    """Set a member's monthly spend limit (owners and admins): their work and plans are refused past it."""
    limit = _limit_text(amount)
    with cred.api(server) as c:
        oid = _org(c, org)
        m = c.member_set(oid, _user(c, oid, user, org), monthly_spend_limit=limit)
    limit_text = "no limit" if m.monthly_spend_limit is None else f"{money(m.monthly_spend_limit)} a month"
    console.print(f"{shown(m.email)} in {org}: {limit_text} ({money(m.month_to_date)} charged this month)")


@orgs_app.command("remove-member")
def orgs_remove_member(org: OrgArg, user: UserArg, server: ServerOpt = None) -> None:
    """Remove a member from a team organisation (owners and admins)."""
    with cred.api(server) as c:
        oid = _org(c, org)
        c.member_remove(oid, _user(c, oid, user, org))
    console.print(f"removed {user} from {org}")


@orgs_app.command("leave")
def orgs_leave(org: OrgArg, server: ServerOpt = None) -> None:
    """Leave a team organisation (its last owner cannot)."""
    with cred.api(server) as c:
        c.member_remove(_org(c, org), c.me().user.id)
    console.print(f"left {org}")

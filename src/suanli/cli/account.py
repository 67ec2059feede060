"""Tenant commands: sign up, log in and out, who am I, verify an e-mail, balance and usage, tokens (orgs: orgs.py; offers and quotes:
market.py).

All of them talk to a suanli server through `suanli.client.Client` (see `suanli.cli.credentials` for which
server, which token, and the exit codes).
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import parse_qs, urlsplit

import typer
from rich.table import Table

from suanli.cli import credentials as cred
from suanli.cli import market, orgs, passwords
from suanli.cli.common import (
    JsonOpt,
    check_positive,
    console,
    emit_json,
    fail,
    human_duration,
)
from suanli.cli.credentials import PasswordStdinOpt, ServerOpt, jsonable, money, org_id, unit_price, when
from suanli.cli.terminal import shown

EmailOpt = Annotated[str, typer.Option("--email", help="Account email address.")]
OrgOpt = Annotated[
    str | None, typer.Option("--org", metavar="ORG", help="Organisation id or name (default: your personal org).")
]


# ---- sessions -----------------------------------------------------------------------------------------------
def signup(
    email: EmailOpt,
    password_stdin: PasswordStdinOpt = False,
    invite: Annotated[
        str | None,
        typer.Option(
            "--invite",
            metavar="CODE",
            help="An invitation's code or an operator's invite code (where signup is invite-only).",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace the login saved for this server (it is kept otherwise).")
    ] = False,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Create an account (a personal organisation with the trial credit) and log in as it. Where the server sends
    mail, the trial credit comes once you verify your e-mail ('suanli verify')."""
    url = cred.resolve(server)
    current = cred.saved(url)
    if current.get("token") and not force:
        fail(f"already logged in to {url} as {current.get('email', 'someone')}; signing up would replace that login: "
             "'suanli logout' first, pass --force, or use another SUANLI_HOME")  # fmt: skip
    password = cred.read_password(password_stdin, confirm=True)
    with cred.api(server, auth=False) as c:
        out = c.signup(email, password, invite)
    cred.save(c.server, out.token, out.user.email)
    if json_out:
        doc = jsonable(out)
        doc.pop("token", None)
        emit_json({"server": c.server, **doc})
        return
    replaced = f" (replacing the login of {current.get('email')})" if current.get("token") else ""
    console.print(f"signed up [bold]{shown(out.user.email)}[/] on {c.server}; balance {money(out.balance)} "
                  f"{out.currency}; logged in{replaced}")  # fmt: skip
    if out.trial_pending:
        console.print("the trial credit comes when you verify your e-mail: open the link mailed to you, or run "
                      "'suanli verify TOKEN' ('suanli verify --resend' mails a new link)")  # fmt: skip


def login(
    email: EmailOpt,
    password_stdin: PasswordStdinOpt = False,
    server: ServerOpt = None,
) -> None:
    """Log in and save the token for this server (in SUANLI_HOME/credentials.json, readable only by you)."""
    password = cred.read_password(password_stdin, confirm=False)
    with cred.api(server, auth=False) as c:
        out = c.login(email, password)
    before = cred.saved(c.server).get("email")
    cred.save(c.server, out.token, out.user.email)
    role = " (admin)" if out.user.is_admin else ""
    replaced = f" (replacing the login of {before})" if before and before != out.user.email else ""
    console.print(f"logged in to {c.server} as [bold]{shown(out.user.email)}[/]{role}{replaced}")


def logout(server: ServerOpt = None) -> None:
    """Revoke this login's token on the server and forget it here."""
    from suanli.client import ApiError, Client

    url = cred.resolve(server)
    token = cred.token_for(url)
    if token is None:
        fail(f"not logged in to {url}")
    try:
        with Client(url, token) as c:
            c.logout()
    except ApiError as e:
        if e.status not in (0, 401):
            cred.api_fail(e)
        if e.status == 0:
            typer.echo(f"warning: {e.message}; the token was not revoked, only forgotten here", err=True)
    cred.forget(url)
    console.print(f"logged out of {url}")


def whoami(server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """The logged-in user and their organisations."""
    with cred.api(server) as c:
        me = c.me()
    if json_out:
        emit_json({"server": c.server, **jsonable(me)})
        return
    u = me.user
    console.print(f"[bold]{shown(u.email)}[/]{' (admin)' if u.is_admin else ''} on {c.server}")
    console.print(f"user {u.id}; personal organisation {u.personal_org_id}")
    if me.email_verified:
        console.print("e-mail verified")
    elif me.trial_pending:
        console.print("e-mail not verified: verify it to receive the trial credit ('suanli verify --resend')")
    console.print(orgs.orgs_table(me.orgs))


def verify(
    token: Annotated[
        str | None, typer.Argument(help="The token of the link in the verification e-mail, or the whole link.")
    ] = None,
    resend: Annotated[
        bool, typer.Option("--resend", help="Mail a new verification link to the logged-in user instead.")
    ] = False,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Verify your e-mail with the link mailed at signup, which releases the trial credit (where the server sends
    mail). The link verifies the account it was mailed to, whoever runs this; no login needed."""
    if resend == (token is not None):
        fail("give TOKEN, or --resend")
    if resend:
        with cred.api(server) as c:
            sent_to = c.resend_verification()
        if json_out:
            emit_json({"sent_to": sent_to})
            return
        console.print(f"a new verification link is on its way to [bold]{shown(sent_to)}[/]")
        return
    assert token is not None
    if "token=" in token:  # the whole link pasted
        token = parse_qs(urlsplit(token).query).get("token", [""])[0]
    with cred.api(server, auth=False) as c:
        out = c.verify_email(token)
    if json_out:
        emit_json(jsonable(out))
        return
    console.print(f"verified [bold]{shown(out.email)}[/]; trial credit {money(out.credited)} {shown(out.currency)}; "
                  f"balance {money(out.balance)} {shown(out.currency)}")  # fmt: skip


# ---- money --------------------------------------------------------------------------------------------------
def balance(org: OrgOpt = None, server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """An organisation's prepaid balance and the hourly rate of what it runs now."""
    with cred.api(server) as c:
        b = c.balance(org_id(c, org))
    if json_out:
        emit_json(jsonable(b))
        return
    console.print(f"[bold]{money(b.balance)} {b.currency}[/]  ({b.org_id}; running now: {money(b.held_per_hour)}/h)")


def usage(
    org: OrgOpt = None,
    csv: Annotated[bool, typer.Option("--csv", help="Print the statement as CSV.")] = False,
    user: Annotated[
        str | None, typer.Option("--user", metavar="USER", help="Only this member's usage (email or user id).")
    ] = None,
    workload: Annotated[
        str | None, typer.Option("--workload", help="Only this workload (its id, or its name: every run of that name).")
    ] = None,
    since: Annotated[str | None, typer.Option("--since", help="ISO time, e.g. 2025-01-01 (UTC).")] = None,
    until: Annotated[str | None, typer.Option("--until", help="ISO time (UTC).")] = None,
    storage: Annotated[
        bool, typer.Option("--storage", help="Only the volume storage lines (with --json: those, as JSON).")
    ] = False,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Usage statement: one row per allocation (workload, user, GPUs, seconds charged, cost), then volume storage:
    one line per volume (hours charged from --since to --until, cost). --user and --workload show allocations only;
    --csv prints the allocations."""
    if csv and json_out:
        fail("give at most one of --csv and --json")
    if storage and (csv or user or workload):
        fail("--storage: not with --csv, --user or --workload (storage is charged to the organisation)")
    if storage:
        with cred.api(server) as c:
            lines = c.storage_usage(org_id(c, org), since=since, until=until)
        if json_out:
            emit_json(jsonable(lines))
            return
        _storage_table(lines)
        return
    with cred.api(server) as c:
        oid = org_id(c, org)
        uid = user
        if user is not None and "@" in user:
            members = c.members(oid or c.me().user.personal_org_id)
            uid = next((m.user_id for m in members if m.email == user.strip().lower()), None)
            if uid is None:
                fail(f"--user: {user} is not a member of this organisation")
        filters: dict[str, Any] = {"user_id": uid, "workload": workload, "since": since, "until": until}
        if csv:
            typer.echo(c.usage_csv(oid, **filters), nl=False)
            return
        rows = c.usage(oid, **filters)
        lines = [] if json_out or user or workload else c.storage_usage(oid, since=since, until=until)
    if json_out:
        emit_json(rows)
        return
    if not rows and not lines:
        console.print("no usage yet")
        return
    if not rows:
        _storage_table(lines)
        return
    table = Table(title="usage")
    from suanli.workloads.host import host_text

    for col in ("workload", "user", "GPU", "GPUs", "host", "mode", "started", "stopped", "charged", "active", "cost"):
        table.add_column(col, justify="right" if col in ("GPUs", "charged", "active", "cost") else "left")
    for r in rows:
        gpus = str(r["gpus"]) if r.get("milli", 1000) == 1000 else f"{r['milli'] / 1000:g}"
        table.add_row(
            r.get("workload") or r["allocation"], r["user"], r.get("gpu_model") or "-", gpus,
            host_text(int(r.get("cpu_milli") or 0), int(r.get("memory_mib") or 0)), r["billing_mode"],
            when(r["started_at"]), when(r.get("stopped_at")), human_duration(float(r["seconds_charged"])),
            r.get("activity") or "-", money(r["cost"]),
        )  # fmt: skip
    console.print(table)
    if lines:
        _storage_table(lines)


def _storage_table(lines: list[Any]) -> None:
    if not lines:
        console.print("no storage charged")
        return
    table = Table(title="volume storage")
    for col in ("volume", "size", "hours", "first hour", "last hour", "rate/h now", "cost"):
        table.add_column(col, justify="right" if col in ("size", "hours", "rate/h now", "cost") else "left")
    from suanli.workloads.volumes import format_size

    for r in lines:
        table.add_row(
            r.volume, format_size(r.size_bytes) if r.size_bytes is not None else "(removed)", str(r.hours),
            when(r.first_hour), when(r.last_hour), unit_price(r.price_per_hour), unit_price(r.cost),
        )  # fmt: skip
    console.print(table)


def statement(
    org: OrgOpt = None,
    since: Annotated[
        str | None,
        typer.Option("--since", metavar="DATE", help="From this day or time on (ISO, UTC), e.g. 2026-01-01."),
    ] = None,
    csv: Annotated[bool, typer.Option("--csv", help="Print it as CSV (exact amounts and balances).")] = False,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Every transaction of the organisation, oldest first: top-ups, trial credit, usage per workload, plan
    purchases, refunds and credits, each with its memo and the balance after it."""
    if csv and json_out:
        fail("give at most one of --csv and --json")
    with cred.api(server) as c:
        oid = org_id(c, org)
        if csv:
            typer.echo(c.statement_csv(oid, since=since), nl=False)
            return
        st = c.statement_all(oid, since=since)
    if json_out:
        emit_json(jsonable(st))
        return
    table = Table(title=f"statement of {st.org_id} ({st.currency}); opening balance {unit_price(st.opening_balance)}")
    for col in ("#", "time", "kind", "workload", "amount", "balance", "memo"):
        table.add_column(col, justify="right" if col in ("#", "amount", "balance") else "left")
    for r in st.rows:
        table.add_row(str(r.id), when(r.created_at), r.kind, r.workload_name or r.workload or "",
                      unit_price(r.amount), unit_price(r.balance), r.memo)  # fmt: skip
    console.print(table if st.rows else "no transactions")
    console.print(f"closing balance {unit_price(st.closing_balance)} {st.currency}")


# ---- tokens -------------------------------------------------------------------------------------------------
tokens_app = typer.Typer(no_args_is_help=True, help="API tokens for scripts and CI (SUANLI_TOKEN=…).")


@tokens_app.command("create")
def tokens_create(
    name: Annotated[str, typer.Argument(help="A name to recognise the token by.")],
    expires_in_days: Annotated[
        int | None, typer.Option("--expires-in-days", help="Expire after N days (default: never).")
    ] = None,
    password_stdin: PasswordStdinOpt = False,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """A new API token; it is printed once and stored on the server only as a hash. One that would outlive this
    login (or never expire) needs your password: from stdin (--password-stdin), else asked on a terminal."""
    check_positive(expires_in_days, "--expires-in-days")
    with cred.api(server) as c:
        t = cred.with_password(lambda pw: c.tokens_create(name, expires_in_days, pw), password_stdin)
    if json_out:
        emit_json(jsonable(t))
        return
    typer.echo(t.token)
    typer.echo(f"token {t.id} ({t.name}); expires {when(t.expires_at) if t.expires_at else 'never'}", err=True)


@tokens_app.command("list")
def tokens_list(server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """Your tokens (logins included); only their prefixes, never the tokens."""
    with cred.api(server) as c:
        rows = c.tokens_list()
    if json_out:
        emit_json(jsonable(rows))
        return
    table = Table(title="API tokens")
    for col in ("id", "name", "prefix", "created", "expires", "revoked"):
        table.add_column(col)
    for t in rows:
        table.add_row(t.id, t.name, t.prefix + "…", when(t.created_at), when(t.expires_at), when(t.revoked_at))
    console.print(table)


@tokens_app.command("revoke")
def tokens_revoke(
    token_id: Annotated[str, typer.Argument(metavar="ID", help="Token id (tok_…).")],
    server: ServerOpt = None,
) -> None:
    """Revoke a token: requests carrying it are refused from now on."""
    with cred.api(server) as c:
        t = c.tokens_revoke(token_id)
    console.print(f"revoked {t.id} ({t.name})")


def register(app: typer.Typer) -> None:
    """Put the tenant commands on the root app."""
    for name, fn in (("signup", signup), ("login", login), ("logout", logout), ("whoami", whoami), ("verify", verify),
                     ("offers", market.offers), ("quote", market.quote), ("balance", balance), ("usage", usage),
                     ("statement", statement)):  # fmt: skip
        app.command(name)(fn)
    for name, fn in passwords.COMMANDS:
        app.command(name)(fn)
    app.add_typer(tokens_app, name="tokens")
    app.add_typer(orgs.orgs_app, name="orgs")
    app.add_typer(market.plans_app, name="plans")

"""`suanli redeem CODE` (tenants) and `suanli admin codes …` (operators): top-up codes, printed once, redeemed once.
The rules are in docs/payments.md."""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime, time, timedelta
from typing import Annotated

import typer
from rich.table import Table

from suanli.cli import credentials as cred
from suanli.cli.common import JsonOpt, check_positive, console, emit_json, fail
from suanli.cli.credentials import ServerOpt, jsonable, money, org_id, when
from suanli.cli.terminal import shown

codes_app = typer.Typer(no_args_is_help=True, help="Top-up codes: make a batch, list batches and codes, void codes.")
BatchArg = Annotated[str, typer.Argument(metavar="BATCH", help="Batch id (batch_…).")]


def _cell(text: str) -> str:
    """Text a spreadsheet would run as a formula starts with an apostrophe instead (CSV injection)."""
    return "'" + text if text.startswith(("=", "+", "-", "@", "\t", "\r")) else text


def parse_expiry(text: str) -> datetime:
    """A day (the codes work through the end of it, UTC) or an ISO time (UTC if it has no zone)."""
    try:
        if len(text.strip()) == 10:
            return datetime.combine(date.fromisoformat(text.strip()) + timedelta(days=1), time(), UTC)
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        fail(f"invalid --expires {text!r}: a day such as 2027-01-31 or a time such as 2027-01-31T18:00:00+08:00")
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


@codes_app.command("create")
def create(
    amount: Annotated[str, typer.Option("--amount", help="What each code is worth, e.g. 100 or 49.90.")],
    count: Annotated[int, typer.Option("--count", help="How many codes (at most 1000).")],
    expires: Annotated[
        str | None, typer.Option("--expires", metavar="DATE", help="They work through this day (UTC), e.g. 2027-01-31.")
    ] = None,
    note: Annotated[str, typer.Option("--note", help="Shown in each redemption's statement line.")] = "",
    org: Annotated[
        str | None, typer.Option("--org", help="Only this organisation (id or name) may redeem them.")
    ] = None,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print the codes as CSV, to print or mail-merge.")] = False,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Make a batch of codes and print them: this is the only time they are shown (they are stored hashed)."""
    if as_csv and json_out:
        fail("give at most one of --csv and --json")
    check_positive(count, "--count")
    value = cred.parse_amount(amount, "--amount")
    expires_at = parse_expiry(expires) if expires else None
    with cred.api(server) as c:
        made = c.admin_topup_codes_create(value, count, expires_at=expires_at, note=note, org=org)
    b = made.batch
    if json_out:
        emit_json({"batch": jsonable(b), "codes": [{"id": x.id, "code": x.code} for x in made.codes]})
        return
    if as_csv:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(("code", "amount", "expires_at", "batch", "code_id", "note"))
        for x in made.codes:
            w.writerow((x.code, f"{b.amount:f}", b.expires_at.isoformat() if b.expires_at else "", b.id, x.id,
                        _cell(b.note)))  # fmt: skip
        typer.echo(buf.getvalue(), nl=False)
        return
    table = Table(title=f"batch {b.id}: {b.count} codes of {money(b.amount)}, expire {when(b.expires_at)}")
    for col in ("#", "code", "id"):
        table.add_column(col, no_wrap=True)
    for i, x in enumerate(made.codes, 1):
        table.add_row(str(i), x.code, x.id)
    console.print(table)
    console.print("these codes are shown only now: print or save them (suanli admin codes create … --csv)")


@codes_app.command("list")
def listing(
    batch: Annotated[str | None, typer.Argument(metavar="[BATCH]", help="A batch: list its codes.")] = None,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Batches with how many codes were redeemed and voided; with BATCH, its codes (which were redeemed, by whom,
    into which org, when). Never the codes themselves."""
    with cred.api(server) as c:
        if batch is None:
            rows = c.admin_topup_batches()
            if json_out:
                emit_json(jsonable(rows))
                return
            table = Table(title="top-up code batches")
            for col in ("id", "amount", "codes", "redeemed", "voided", "org", "note", "by", "created", "expires"):
                table.add_column(col, justify="right" if col in ("amount", "codes", "redeemed", "voided") else "left")
            for b in rows:
                table.add_row(b.id, money(b.amount), str(b.count), str(b.redeemed), str(b.voided), b.org_id or "any",
                              b.note, b.created_by, when(b.created_at), when(b.expires_at))  # fmt: skip
            console.print(table if rows else "no batches")
            return
        detail = c.admin_topup_batch(batch)
    if json_out:
        emit_json(jsonable(detail))
        return
    table = Table(title=f"batch {detail.id}: {detail.count} codes of {money(detail.amount)} ({detail.note})")
    for col in ("id", "ends in", "state", "redeemed by", "org", "at", "transaction"):
        table.add_column(col)
    for x in detail.codes:
        at = x.redeemed_at or x.voided_at
        table.add_row(x.id, "…" + x.hint, x.state, shown(x.redeemed_by or ""), x.redeemed_org or "",
                      when(at) if at else "", str(x.transaction_id or ""))  # fmt: skip
    console.print(table)


@codes_app.command("void")
def void(
    batch: BatchArg,
    codes: Annotated[list[str] | None, typer.Argument(metavar="[CODE_ID]...", help="Only these codes (tc_…).")] = None,
    server: ServerOpt = None,
) -> None:
    """Void a batch's unredeemed codes, or only the ones named: nobody can redeem them from now on."""
    with cred.api(server) as c:
        b = c.admin_topup_codes_void(batch, codes or None)
    console.print(f"batch {b.id}: {b.voided} voided, {b.redeemed} redeemed, of {b.count}")


def redeem(
    code: Annotated[str, typer.Argument(metavar="CODE", help="The top-up code, e.g. 7K2QD-9XW4M-RT6ZP-H3N8B.")],
    org: Annotated[
        str | None, typer.Option("--org", metavar="ORG", help="Into this team (id or name; default: your own org).")
    ] = None,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Redeem a top-up code: its amount is added to the organisation's balance (once; a code works only once)."""
    with cred.api(server) as c:
        r = c.redeem(code, org_id(c, org))
    if json_out:
        emit_json(jsonable(r))
        return
    console.print(f"redeemed {money(r.amount)} into {r.org_id}; balance [bold]{money(r.balance)}[/] "
                  f"(transaction {r.transaction_id})")  # fmt: skip

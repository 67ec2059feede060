"""`suanli admin prices …`: the price book. Show it, change one GPU's price, its price billed by usage, the host
CPU and memory prices or one plan, or load a whole book (which replaces the version it was made from, or fails)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.table import Table

from suanli.cli import credentials as cred
from suanli.cli.common import JsonOpt, console, emit_json, fail
from suanli.cli.credentials import ServerOpt, money, unit_price

prices_app = typer.Typer(
    help="The price book: show it, or change a GPU's price, its price billed by usage, the host CPU and memory prices, "
    "or load a whole book."
)


def _print_book(book: dict[str, Any]) -> None:
    cur = book.get("currency", "")
    table = Table(title=f"price book v{book.get('version', '?')} ({cur} per GPU-hour)")
    table.add_column("GPU")
    table.add_column("on demand", justify="right")
    spot = book.get("spot_factor")
    table.add_column(f"spot (x{spot})" if spot else "spot", justify="right")
    floor = book.get("usage_floor")
    table.add_column(f"usage: busy (idle x{floor})" if floor else "usage", justify="right")
    usage = book.get("usage_gpu_hour", {})
    for gpu, price in sorted(book.get("gpu_hour", {}).items()):
        busy = usage.get(gpu)
        by_usage = "-" if busy is None else f"{money(busy)} ({money(Decimal(busy) * Decimal(floor or 0))})"
        table.add_row(gpu, money(price), money(Decimal(price) * Decimal(spot)) if spot else "-", by_usage)
    console.print(table)
    plans = ", ".join(f"{k} {float(p['discount']):.0%} off" for k, p in book.get("plans", {}).items())
    console.print(f"host: CPU {unit_price(book.get('cpu_core_hour'))}/core-hour, memory "
                  f"{unit_price(book.get('memory_gib_hour'))}/GiB-hour (CPU-only work, and what GPU work asks for)")  # fmt: skip
    console.print(f"slice premium x{book.get('slice_premium')}; storage {book.get('storage_gb_month')}/GB-month")
    if plans:
        console.print(f"plans: {plans}")


@prices_app.callback(invoke_without_command=True)
def prices(ctx: typer.Context, server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """Show the price book in force (with no subcommand)."""
    if ctx.invoked_subcommand is not None:
        return
    with cred.api(server) as c:
        book = c.prices()
    if json_out:
        emit_json(book)
        return
    _print_book(book)


@prices_app.command("set")
def prices_set(
    gpu: Annotated[str, typer.Argument(help="GPU model, e.g. H20.")],
    price: Annotated[str, typer.Argument(help="On-demand price per GPU-hour, e.g. 9.00.")],
    server: ServerOpt = None,
) -> None:
    """Set one GPU model's on-demand price (a new version of the book)."""
    value = cred.parse_amount(price, "PRICE")
    with cred.api(server) as c:
        book = c.admin_set_gpu_price(gpu, value)
    console.print(f"price book v{book['version']}: {gpu} at {money(value)} {book.get('currency', '')}/GPU-hour")


@prices_app.command("set-host")
def prices_set_host(
    cpu_core_hour: Annotated[
        str | None, typer.Option("--cpu-core-hour", help="Host CPU price per core-hour, e.g. 0.10.")
    ] = None,
    memory_gib_hour: Annotated[
        str | None, typer.Option("--memory-gib-hour", help="Host memory price per GiB-hour, e.g. 0.025.")
    ] = None,
    server: ServerOpt = None,
) -> None:
    """Set the host CPU and/or memory price (a new version of the book): what CPU-only work pays, and what GPU work
    pays for the cores and memory it asks for."""
    if cpu_core_hour is None and memory_gib_hour is None:
        fail("give --cpu-core-hour, --memory-gib-hour or both")
    cpu = cred.parse_amount(cpu_core_hour, "--cpu-core-hour") if cpu_core_hour is not None else None
    mem = cred.parse_amount(memory_gib_hour, "--memory-gib-hour") if memory_gib_hour is not None else None
    with cred.api(server) as c:
        book = c.admin_set_host_prices(cpu, mem)
    cur = book.get("currency", "")
    console.print(f"price book v{book['version']}: CPU {unit_price(book['cpu_core_hour'])} {cur}/core-hour, memory "
                  f"{unit_price(book['memory_gib_hour'])} {cur}/GiB-hour")  # fmt: skip


@prices_app.command("set-usage")
def prices_set_usage(
    gpu: Annotated[str | None, typer.Argument(metavar="GPU", help="GPU model, e.g. H20.")] = None,
    price: Annotated[
        str | None,
        typer.Argument(metavar="PRICE", help="Per GPU-hour fully active, e.g. 10.625; 'none' stops usage billing."),
    ] = None,
    floor: Annotated[
        str | None, typer.Option("--floor", help="Share of the usage price an idle GPU-hour costs, 0..1, e.g. 0.2.")
    ] = None,
    server: ServerOpt = None,
) -> None:
    """Set a GPU model's price billed by usage (per GPU-hour fully active) and/or the floor, as a new version of
    the book; work running keeps the prices it started at. See docs/billing.md."""
    if (gpu is None) != (price is None):
        fail("give GPU and PRICE together (PRICE 'none' stops offering GPU by usage)")
    if gpu is None and floor is None:
        fail("give GPU PRICE, --floor or both")
    prices_by_gpu: dict[str, Decimal | None] = {}
    if gpu is not None and price is not None:
        prices_by_gpu[gpu] = None if price.strip().lower() == "none" else cred.parse_amount(price, "PRICE")
    share = cred.parse_amount(floor, "--floor") if floor is not None else None
    with cred.api(server) as c:
        book = c.admin_set_usage_prices(prices_by_gpu, share)
    cur = book.get("currency", "")
    for name, value in prices_by_gpu.items():
        said = "no longer billed by usage" if value is None else f"{money(value)} {cur}/GPU-hour fully active"
        console.print(f"price book v{book['version']}: {name} {said}")
    console.print(f"price book v{book['version']}: an idle GPU-hour costs {book['usage_floor']} of the usage price")


@prices_app.command("remove")
def prices_remove(gpu: Annotated[str, typer.Argument(help="GPU model.")], server: ServerOpt = None) -> None:
    """Stop offering a GPU model, on demand and by usage (it keeps running what runs; nothing new is rented)."""
    with cred.api(server) as c:
        book = c.admin_set_gpu_price(gpu, remove=True)
    console.print(f"price book v{book['version']}: {gpu} is no longer priced")


@prices_app.command("load")
def prices_load(
    file: Annotated[Path, typer.Argument(metavar="FILE.yaml", help="A whole price book (YAML or JSON).")],
    if_version: Annotated[
        int | None,
        typer.Option("--if-version", min=1, help="Replace only this version (default: the file's own `version`)."),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace whatever version is in force.")] = False,
    server: ServerOpt = None,
) -> None:
    """Replace the whole price book from a file (the shape 'suanli admin prices --json' prints). A file that names
    its `version` (a book dumped, then edited) replaces that version only: if another edit was made since, nothing
    changes and the command says so (exit 2); --force replaces whatever is in force."""
    if force and if_version is not None:
        fail("give --if-version or --force, not both")
    try:
        book = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        fail(f"{file}: {' '.join(str(e).split())}")
    if not isinstance(book, dict):
        fail(f"{file}: expected a mapping (currency, gpu_hour, …)")
    made_from = if_version if if_version is not None else book.get("version")
    if made_from is not None and not force and not (isinstance(made_from, int) and made_from >= 1):
        fail(f"{file}: version must be a whole number from 1 (the book it was made from), not {made_from!r}")
    from suanli.client import ApiError

    with cred.api(server) as c:
        try:
            out = c.admin_set_prices(book, if_version=None if force else made_from)
        except ApiError as e:
            if e.status != 412:
                raise
            fail(f"{file} was made from price book version {made_from}, and another edit was made since; nothing "
                 "changed. Dump the book again and redo the change, or --force to replace whatever is in force")  # fmt: skip
    console.print(f"price book v{out['version']}: {len(out.get('gpu_hour', {}))} GPU models priced")


plan_app = typer.Typer(no_args_is_help=True, help="Plans (prepaid GPU-hours at a discount): add, change or retire one.")
prices_app.add_typer(plan_app, name="plan")


@plan_app.command("set")
def plan_set(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The plan's name, e.g. monthly or 月付.")],
    hours: Annotated[int, typer.Option("--hours", help="GPU-hours the plan reserves, e.g. 720.")],
    discount: Annotated[str, typer.Option("--discount", help="Share off the on-demand price, e.g. 0.10.")],
    server: ServerOpt = None,
) -> None:
    """Add or change one plan (a new version of the book); plans already bought keep their terms."""
    share = cred.parse_amount(discount, "--discount")
    with cred.api(server) as c:
        book = c.admin_set_plan(name, hours, share)
    console.print(f"price book v{book['version']}: plan {name}: {hours} h at {share:.0%} off")


@plan_app.command("retire")
def plan_retire(name: Annotated[str, typer.Argument(metavar="NAME")], server: ServerOpt = None) -> None:
    """Stop selling one plan (a new version of the book); plans already bought keep their terms."""
    with cred.api(server) as c:
        book = c.admin_retire_plan(name)
    console.print(f"price book v{book['version']}: plan {name} is no longer sold")

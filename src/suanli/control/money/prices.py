"""The operator's price book in force: the newest stored version, or the shipped default on a fresh install.

Every edit reads the book in force and stores it changed as a new version, so edits take turns (`EDIT_LOCK`: an
advisory lock on PostgreSQL, where two transactions would otherwise both change version N and the later one drop
the other's change; SQLite's write lock already serialises them). A whole book may name the version it replaces."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Connection, select
from sqlalchemy.orm import Session

from suanli import catalog
from suanli.billing.prices import PriceBook, default_price_book
from suanli.control.errors import Invalid, NotFound, PreconditionFailed
from suanli.db.engine import exclusive
from suanli.db.models import PriceBookVersion

EDIT_LOCK = 0x5A4E_5052  # advisory lock: edits of the price book take turns


def current(s: Session) -> tuple[int, PriceBook]:
    """(version, book); version 0 is the shipped default, not yet stored."""
    row = s.scalars(select(PriceBookVersion).order_by(PriceBookVersion.id.desc()).limit(1)).first()
    if row is None:
        return 0, default_price_book()
    return row.id, PriceBook.model_validate(row.body)


def version(s: Session | Connection) -> int:
    """The version in force (0: the shipped default), without parsing the book."""
    return s.scalar(select(PriceBookVersion.id).order_by(PriceBookVersion.id.desc()).limit(1)) or 0


def edit(
    s: Session, change: Callable[[PriceBook, dict[str, Any]], None], now: datetime, by: str | None
) -> tuple[int, PriceBook]:
    """The one way a partial edit is made: the book in force, read under `EDIT_LOCK` (held until the transaction
    ends); `change` edits its JSON document in place (or raises to refuse); the result, validated, stored as the
    next version. (version, new book)."""
    exclusive(s, EDIT_LOCK)
    _, book = current(s)
    body = book.model_dump(mode="json")
    change(book, body)
    new = validate(body)
    return store(s, new, now, by), new


def replace_book(s: Session, book: PriceBook, now: datetime, by: str | None, replaces: int | None = None) -> int:
    """Store `book` whole as the new version; with `replaces`, only while that version is still the one in force."""
    exclusive(s, EDIT_LOCK)
    if replaces is not None and (now_in_force := version(s)) != replaces:
        raise PreconditionFailed(
            f"If-Match: the price book is at version {now_in_force}, not {replaces}: another edit was made since it "
            "was read; read it again and make the change there"
        )
    return store(s, book, now, by)


def set_plan(
    s: Session, name: str, hours: int, discount: Decimal, now: datetime, by: str | None
) -> tuple[int, PriceBook]:
    """Add or change one plan, as a new version of the book. Plans bought keep their terms."""

    def change(_: PriceBook, body: dict[str, Any]) -> None:
        body["plans"] = {**body["plans"], name: {"hours": hours, "discount": str(discount)}}

    return edit(s, change, now, by)


def retire_plan(s: Session, name: str, now: datetime, by: str | None) -> tuple[int, PriceBook]:
    """Stop selling one plan, as a new version of the book (plans bought keep their terms)."""

    def change(_: PriceBook, body: dict[str, Any]) -> None:
        if name not in body["plans"]:
            raise NotFound(f"name: no plan {name!r} in the price book")
        body["plans"] = {k: v for k, v in body["plans"].items() if k != name}

    return edit(s, change, now, by)


def validate(body: dict[str, object]) -> PriceBook:
    """A price book whose GPU models are all catalog models, named canonically. A usage price of a model with no
    on-demand price stays in the book but is not offered (usage is offered beside on-demand only)."""
    try:
        book = PriceBook.model_validate(body)
    except ValidationError as e:
        fields = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise Invalid(f"price book: {fields}") from e
    names = {field: _canonical(field, getattr(book, field)) for field in ("gpu_hour", "usage_gpu_hour")}
    return book.model_copy(update=names)


def _canonical(field: str, prices: dict[str, Decimal]) -> dict[str, Decimal]:
    """GPU models named as the catalog names them, each once."""
    out: dict[str, Decimal] = {}
    for model, price in prices.items():
        try:
            name = catalog.gpu(model).name
        except catalog.CatalogError as e:
            raise Invalid(f"{field}.{model}: {e}") from e
        if name in out:
            raise Invalid(f"{field}.{model}: {name} is priced twice")
        out[name] = price
    return out


def store(s: Session, book: PriceBook, now: datetime, by: str | None) -> int:
    row = PriceBookVersion(body=book.model_dump(mode="json"), created_at=now, created_by=by)
    s.add(row)
    s.flush()
    return row.id


def seed(s: Session, currency: str, now: datetime) -> None:
    """On first start, store the shipped book in the configured currency so every later change is versioned."""
    if s.scalar(select(PriceBookVersion.id).limit(1)) is None:
        store(s, default_price_book().model_copy(update={"currency": currency}), now, None)


def set_gpu_price(
    s: Session, model: str, on_demand: Decimal | None, now: datetime, by: str | None, *, remove: bool = False
) -> tuple[int, PriceBook]:
    """Change one GPU model's hourly price (or stop offering it) as a new version of the book."""
    try:
        name = catalog.gpu(model).name
    except catalog.CatalogError as e:
        raise Invalid(f"gpu: {e}") from e
    if not remove and (on_demand is None or on_demand < 0):
        raise Invalid("price: a non-negative amount per GPU-hour")

    def change(book: PriceBook, body: dict[str, Any]) -> None:
        prices = {k: str(v) for k, v in book.gpu_hour.items()}
        if remove:  # its usage price stays, not offered: usage is offered beside on-demand only
            prices.pop(name, None)
        else:
            prices[name] = str(on_demand)
        body["gpu_hour"] = prices

    return edit(s, change, now, by)


def set_usage_prices(
    s: Session, gpu_hour: dict[str, Decimal | None], floor: Decimal | None, now: datetime, by: str | None
) -> tuple[int, PriceBook]:
    """Change usage prices per GPU-hour at full activity (None: stop offering that model by usage) and/or the
    floor (the share of it an idle GPU-hour costs), as a new version of the book. A model must be priced on demand
    to be given a usage price: usage is offered beside on-demand only."""

    def change(book: PriceBook, body: dict[str, Any]) -> None:
        usage = dict(body["usage_gpu_hour"])
        for model, price in gpu_hour.items():
            try:
                name = catalog.gpu(model).name
            except catalog.CatalogError as e:
                raise Invalid(f"gpu_hour.{model}: {e}") from e
            if price is None:
                usage.pop(name, None)
            elif name not in book.gpu_hour:
                raise Invalid(
                    f"gpu_hour.{model}: {name} is not priced on demand; usage is offered beside on-demand only"
                )
            else:
                usage[name] = str(price)
        body["usage_gpu_hour"] = usage
        if floor is not None:
            body["usage_floor"] = str(floor)

    return edit(s, change, now, by)


def set_host_prices(
    s: Session, cpu_core_hour: Decimal | None, memory_gib_hour: Decimal | None, now: datetime, by: str | None
) -> tuple[int, PriceBook]:
    """Change the host prices (None: keep that one) as a new version of the book."""

    def change(_: PriceBook, body: dict[str, Any]) -> None:
        for name, value in (("cpu_core_hour", cpu_core_hour), ("memory_gib_hour", memory_gib_hour)):
            if value is not None:
                body[name] = str(value)

    return edit(s, change, now, by)

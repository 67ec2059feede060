"""Column types both databases share: exact money and aware UTC times.

Money is exact on both databases, to the ledger's internal precision (1e-8): `Numeric(20, 8)` on PostgreSQL, and
on SQLite (whose NUMERIC affinity stores REAL, a float) an INTEGER count of 1e-8 units, so that sums and the running
balance's `balance + amount` are integer arithmetic in SQL (`Money`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import BigInteger, DateTime, Numeric, TypeDecorator

from suanli.billing.money import INTERNAL

UNITS = int(1 / INTERNAL)  # 10**8 units to the currency unit; SQLite's 64-bit integers then hold ¥92 billion


class Money(TypeDecorator[Decimal]):
    """A money amount: Numeric(20, 8) on PostgreSQL; on SQLite an INTEGER of 1e-8 units (never a REAL). Amounts
    with more than 8 decimals are refused rather than rounded here: the ledger quantizes before it writes."""

    impl = Numeric(20, 8)
    cache_ok = True

    def load_dialect_impl(self, dialect: Any) -> Any:
        return dialect.type_descriptor(BigInteger() if dialect.name == "sqlite" else Numeric(20, 8))

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        if value is None or dialect.name != "sqlite":
            return value
        if isinstance(value, float):
            raise TypeError("money must be Decimal or int, not float")
        units = Decimal(value) * UNITS
        if units != units.to_integral_value():
            raise ValueError(f"money with more than 8 decimals: {value}")
        return int(units)

    def process_result_value(self, value: Any, dialect: Any) -> Decimal | None:
        if value is None:
            return None
        if dialect.name != "sqlite":
            return Decimal(value)
        return Decimal(int(value)).scaleb(-8)


MONEY = Money()


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on both databases (SQLite would otherwise hand back naive ones)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: pass an aware UTC time")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)

"""Money as `Decimal`: exact internally (to 1e-8 of the currency unit), two decimals when shown."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

ZERO = Decimal(0)
INTERNAL = Decimal("0.00000001")  # 1e-8: per-second charges of cheap GPU slices stay exact
SHOWN = Decimal("0.01")


def exact(value: Decimal | int | str) -> Decimal:
    """A money amount at internal precision. Floats are refused: they cannot represent cents exactly."""
    if isinstance(value, float):
        raise TypeError("money must be Decimal, int or str, not float")
    try:
        d = Decimal(value)
    except InvalidOperation as e:
        raise ValueError(f"not an amount: {value!r}") from e
    if not d.is_finite():
        raise ValueError(f"not a finite amount: {value!r}")
    return d.quantize(INTERNAL, rounding=ROUND_HALF_EVEN)


def shown(value: Decimal) -> str:
    """Two decimals, banker's rounding, as statements and `suanli balance` print it."""
    return str(value.quantize(SHOWN, rounding=ROUND_HALF_EVEN))

"""Paying for tokens: what a key of another org owes an endpoint's owner, per 1M tokens. Pure.

A usage row is charged in parts as its tokens arrive (a late report adds some); each part is the difference of the
running totals' exact amounts, so the parts of a row always sum to exactly what its whole would cost: nothing is
lost or made up by rounding each part on its own.
"""

from __future__ import annotations

from decimal import Decimal

from suanli.billing.money import ZERO, exact

PER = 1_000_000


def cost_of_tokens(tokens: int, price_per_1m: Decimal) -> Decimal:
    """`tokens` at `price_per_1m`, exact to the ledger's precision."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    return exact(Decimal(tokens) * price_per_1m / PER) if tokens else ZERO


def part_charge(charged: int, total: int, price_per_1m: Decimal) -> Decimal:
    """What tokens `charged`..`total` of one row cost: cost(total) - cost(charged)."""
    if not 0 <= charged <= total:
        raise ValueError(f"need 0 <= charged ({charged}) <= total ({total})")
    return cost_of_tokens(total, price_per_1m) - cost_of_tokens(charged, price_per_1m)

"""Jinja2 environment and the filters every page uses: money as ¥ with two decimals, times in the browser's zone."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup, escape

from suanli.web import nav

TEMPLATES = Path(__file__).parent / "templates"
SYMBOLS = {"CNY": "¥", "USD": "$", "EUR": "€", "JPY": "¥", "HKD": "HK$"}
CENTS = Decimal("0.01")


def money(value: Any, currency: str = "CNY") -> str:
    """An exact amount (the API sends strings) as `¥1,234.56`; banker's rounding to cents as statements do."""
    try:
        d = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return str(value)
    d = d.quantize(CENTS, rounding=ROUND_HALF_EVEN)
    sign = "-" if d < 0 else ""
    return f"{sign}{SYMBOLS.get(currency, currency + ' ')}{abs(d):,.2f}"


def when(value: Any) -> Markup:
    """A `<time>` the browser rewrites into its own zone (static/console.js); the UTC text stays without script."""
    if value in (None, ""):
        return Markup("—")
    iso = str(value)
    shown = iso.replace("T", " ")[:19] + " UTC"
    return Markup('<time datetime="{}">{}</time>').format(iso, shown)


def duration(seconds: Any) -> str:
    try:
        s = int(Decimal(str(seconds)))
    except (InvalidOperation, ValueError):
        return "—"
    h, rem = divmod(max(s, 0), 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h {m:02d}m" if h else f"{m}m {sec:02d}s"


def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]), auto_reload=False)
    env.filters.update(money=money, when=when, duration=duration, e=escape)
    env.globals.update(nav_tenant=nav.TENANT, nav_operator=nav.OPERATOR, nav_active=nav.active)
    return env


ENV = environment()

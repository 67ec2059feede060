"""Host CPU and memory as people read them: milli-cores as cores, MiB as GiB, exactly (no float rounding)."""

from __future__ import annotations

from decimal import Decimal


def _plain(value: Decimal) -> str:
    text = f"{value:f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def cores(milli: int) -> str:
    """1500 -> '1.5', 2000 -> '2'."""
    return _plain(Decimal(milli) / 1000)


def gib(mib: int) -> str:
    """2048 -> '2', 1536 -> '1.5', 1 -> '0.0009765625'."""
    return _plain(Decimal(mib) / 1024)


def host_text(cpu_milli: int, memory_mib: int) -> str:
    """'1 core, 2 GiB'; '-' when neither is held."""
    if not cpu_milli and not memory_mib:
        return "-"
    return f"{cores(cpu_milli)} core{'' if cpu_milli == 1000 else 's'}, {gib(memory_mib)} GiB"

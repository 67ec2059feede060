"""One frame of `suanli admin top`, built from the server's JSON alone (no I/O), so it is tested without a server:
a header with the cluster summary, one line per node with a cell per GPU (utilisation as a block's height and
colour, temperature coloured against hot thresholds, a letter for the holding workload, ✗ for unhealthy), the
unhealthy GPUs' reasons and a legend, fitted to the terminal's width and height."""

from __future__ import annotations

import io
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

SYMBOLS = {"CNY": "¥", "USD": "$", "EUR": "€"}

# ---- the heat map's scale ----
BARS = "▁▂▃▄▅▆▇█"  # utilisation 0-100 % as the height of a block
UTIL_STYLES = ((10.0, "grey50"), (50.0, "green"), (85.0, "yellow"), (float("inf"), "red"))
WARM_C, HOT_C = 70.0, 85.0  # temperature: yellow from WARM_C, bold red from HOT_C (H100 slows down near 87 °C)
STATE_STYLES = {"ready": "green", "draining": "yellow", "down": "bold red"}
UNHEALTHY, NO_READING, READ_ERROR = "✗", "·", "!"
TAGS = "abcdefghijklmnopqrstuvwxyz"
MIN_ROWS = 3  # `top` shows at least this many node rows, however short the terminal
MIN_OWNER, MIN_OWNER_WIDE = 8, 30  # owner column: shown from this width; wide cells only leaving this much
MAX_REASONS = 5  # unhealthy GPUs listed under the grid (the rest counted)
UNLIMITED = 1 << 30


# ---- formatting -----------------------------------------------------------------------------------------------
def num(value: Any, fmt: str = "{:.0f}", none: str = "-") -> str:
    return none if value is None else fmt.format(value)


def clock(value: Any) -> str:
    """The time of day of an ISO timestamp (UTC, as the server gives it)."""
    if not value:
        return "-"
    return str(value).replace("T", " ")[11:19]


def _price(amount: Any, currency: str) -> str:
    try:
        value = Decimal(str(amount))
    except (InvalidOperation, ValueError):
        return str(amount)
    sign = SYMBOLS.get(currency)
    return f"{sign}{value:,.2f}" if sign else f"{value:,.2f} {currency}".strip()


def util_style(util: float | None) -> str:
    if util is None:
        return "dim"
    return next(style for bound, style in UTIL_STYLES if util < bound)


def temp_style(temp: float | None) -> str:
    if temp is None:
        return "dim"
    return "bold red" if temp >= HOT_C else "yellow" if temp >= WARM_C else ""


def _bar(util: float) -> str:
    return BARS[min(len(BARS) - 1, max(0, int(util / 100 * len(BARS))))]


def _short_id(ref: str) -> str:
    """wl_8f3a2c… → wl_8f3a2c (the prefix and six hex digits say which, in a crowded row)."""
    head, _, tail = ref.partition("_")
    return f"{head}_{tail[:6]}" if tail else ref[:9]


def _reading(g: dict[str, Any]) -> bool:
    return g.get("t") is not None and not g.get("error")


# ---- `top`: one frame -------------------------------------------------------------------------------------------
def _nodes(gpus: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for g in gpus:
        out.setdefault(str(g.get("node", "?")), []).append(g)
    for rows in out.values():
        rows.sort(key=lambda g: int(g.get("gpu") or 0))
    return out


def _problem(rows: list[dict[str, Any]]) -> int:
    """How badly a node needs looking at: unhealthy GPUs, out of service, silent or failing readings, hot."""
    score = 0
    for g in rows:
        if not g.get("healthy", True):
            score += 100
        elif not _reading(g):
            score += 10
        elif (g.get("temp_c") or 0) >= HOT_C:
            score += 1
    state = rows[0].get("node_state") if rows else "ready"
    return score + (0 if state == "ready" else 50 if state == "draining" else 200)


def _cell(g: dict[str, Any], tag: str, wide: bool) -> Text:
    """One GPU: a block whose height and colour say its utilisation, its temperature, and who holds it."""
    util, temp = g.get("util"), g.get("temp_c")
    read = _reading(g)
    cell = Text()
    if not g.get("healthy", True):
        cell.append(UNHEALTHY, style="bold white on red")
    elif g.get("error"):
        cell.append(READ_ERROR, style="bold magenta")
    elif not read or util is None:
        cell.append(NO_READING, style="dim")
    else:
        cell.append(_bar(util), style=util_style(util))
    if wide:
        cell.append(
            f"{util:>3.0f}%" if read and util is not None else "   -", style=util_style(util) if read else "dim"
        )
        cell.append(" ")
    if read and temp is not None:
        cell.append("hi" if temp >= 100 else f"{temp:>2.0f}", style=temp_style(temp))
    else:
        cell.append("--", style="dim")
    if wide:
        cell.append("°", style="dim")
    cell.append(tag or " ", style="bold cyan")
    return cell


def _common_prefix(names: Iterable[str]) -> str:
    """`cluster.` when every node name starts with the same cluster prefix (shown once, in the header)."""
    prefixes = {n.rsplit(".", 1)[0] + "." if "." in n else "" for n in names}
    return prefixes.pop() if len(prefixes) == 1 else ""


def _pack(segments: list[Text], width: int, gap: str = "   ") -> list[Text]:
    """Segments side by side, as many to a line as fit in `width` (one too long for a line gets its own)."""
    lines: list[Text] = []
    for seg in segments:
        if lines and lines[-1].cell_len + len(gap) + seg.cell_len <= width:
            lines[-1].append(gap)
            lines[-1].append_text(seg)
        else:
            lines.append(seg.copy())
    return lines


def _header(summary: dict[str, Any], gpus: list[dict[str, Any]], n_nodes: int, prefix: str) -> list[Text]:
    """The summary as segments (`_pack` lays them out): fleet, models, utilisation, temperature, queue, waste,
    revenue."""
    s = summary or {}
    counts = s.get("gpus") or {}
    total = counts.get("total", len(gpus))
    reporting = counts.get("reporting", sum(_reading(g) for g in gpus))
    at = str(s.get("at") or "")
    states = s.get("nodes") or {}
    title = Text()
    title.append("suanli top", style="bold")
    if at:
        title.append(f"  {clock(at)} UTC", style="dim")
    if prefix:
        title.append(f"  cluster {prefix.rstrip('.')}")
    segments = [title]
    fleet = Text(f"{total:,} GPUs ({reporting:,} reporting) on {n_nodes:,} nodes")
    if states:
        fleet.append(": ")
        for i, (state, count) in enumerate(sorted(states.items())):
            fleet.append(("" if i == 0 else ", ") + f"{count:,} {state}", style=STATE_STYLES.get(state, ""))
    segments.append(fleet)

    for m in counts.get("by_model") or []:
        models = Text()
        models.append(f"{m.get('model')}: ", style="bold")
        models.append(f"{m.get('allocated', 0):,} allocated, {m.get('free', 0):,} free, ")
        bad = int(m.get("unhealthy", 0) or 0)
        models.append(f"{bad:,} unhealthy", style="bold red" if bad else "")
        if m.get("draining"):
            models.append(f", {int(m['draining']):,} draining", style="yellow")
        segments.append(models)

    u, t = s.get("utilisation") or {}, s.get("temperature") or {}
    util = Text("util ")
    avg = u.get("avg")
    util.append(num(avg, "{:.1f}%"), style=util_style(avg))
    util.append(f" avg (allocated {num(u.get('allocated_avg'), '{:.1f}%')})")
    temp = Text("temp")
    for key in ("p50", "p90", "max"):
        temp.append(f" {key} ")
        temp.append(num(t.get(key), "{:.0f}°C"), style=temp_style(t.get(key)))
    segments += [util, temp]

    queue, waste = s.get("queue") or {}, s.get("waste") or {}
    segments.append(Text("queue " + (", ".join(f"{k} {v:,}" for k, v in sorted(queue.items())) or "empty")))
    frac, frag = waste.get("waste_fraction"), waste.get("fragmentation")
    idle = Text("waste ")
    idle.append(num(frac, "{:.1%}"), style="yellow" if (frac or 0) >= 0.1 else "")
    idle.append(f" idle ({waste.get('idle_gpus', 0):,} GPUs), fragmentation {num(frag, '{:.1%}')}")
    segments.append(idle)
    if s.get("revenue_per_hour") is not None:
        segments.append(Text(f"revenue {_price(s['revenue_per_hour'], str(s.get('currency') or ''))}/h"))
    return segments


def _legend(wide: bool) -> list[Text]:
    scale = Text("util ", style="dim")
    for (bound, style), label in zip(UTIL_STYLES, ("<10", "<50", "<85", "≥85"), strict=True):
        level = 0 if bound == 10 else 100 if bound == float("inf") else bound - 1
        scale.append(_bar(level), style=style)
        scale.append(f"{label}% ", style="dim")
    temp = Text("temp °C ", style="dim")
    temp.append(f"≥{WARM_C:.0f}", style="yellow")
    temp.append(" ")
    temp.append(f"≥{HOT_C:.0f}", style="bold red")
    marks = Text()
    marks.append(UNHEALTHY, style="bold white on red")
    marks.append(" unhealthy ", style="dim")
    marks.append(READ_ERROR, style="bold magenta")
    marks.append(" read error ", style="dim")
    marks.append(f"{NO_READING} no reading", style="dim")
    who = Text("a,b…: the workload holding the GPU (owner column)" if wide else "a,b…: holder", style="dim")
    return [scale, temp, marks, who]


def render_top(summary: dict[str, Any], gpus: list[dict[str, Any]], width: int, height: int) -> RenderableType:
    """One frame of `suanli admin top`: the summary, then one line per node (one cell per GPU: utilisation as a
    coloured block, temperature, holder), unhealthy GPUs with their reasons, and a legend. Fits `height` lines:
    when the nodes do not, those with problems come first and the rest are counted."""
    nodes = _nodes(gpus)
    prefix = _common_prefix(nodes)
    header = _pack(_header(summary, gpus, len(nodes), prefix), width)

    per_node = max((len(rows) for rows in nodes.values()), default=8)
    name_w = min(max((len(n) - len(prefix) for n in nodes), default=4), max(12, width // 5))
    state_w = 8
    wide = width - name_w - state_w - 3 - (11 * per_node - 1) >= MIN_OWNER_WIDE  # util % too, and an owner column
    cells_w = (11 if wide else 5) * per_node - 1
    owner_w = width - name_w - state_w - cells_w - 3

    unhealthy = [g for g in gpus if not g.get("healthy", True)]
    reasons = [Text(f"unhealthy GPUs ({len(unhealthy):,})", style="bold red")] if unhealthy else []
    for g in unhealthy[:MAX_REASONS]:
        line = Text(f" {UNHEALTHY} ", style="bold red")
        line.append(f"{str(g.get('node', ''))[len(prefix) :]} GPU {g.get('gpu')}: ", style="bold")
        line.append(str(g.get("health_reason") or "no reason given"))
        reasons.append(line)
    if len(unhealthy) > MAX_REASONS:
        reasons.append(Text(f" … {len(unhealthy) - MAX_REASONS:,} more unhealthy GPUs", style="red"))

    legend = _pack(_legend(wide), width, gap="  ")
    measure = Console(width=max(width, 20), file=io.StringIO(), color_system=None)
    fixed = sum(len(t.wrap(measure, measure.width)) for t in [*header, *reasons, *legend]) + 2  # + table head, more
    budget = max(MIN_ROWS, height - fixed - 1) if height < UNLIMITED else UNLIMITED
    names = sorted(nodes)
    hidden = 0
    if len(names) > budget:
        names.sort(key=lambda n: -_problem(nodes[n]))  # stable: problems first, then by name
        hidden = len(names) - budget
        names = names[:budget]

    table = Table(
        box=None, padding=(0, 1, 0, 0), pad_edge=False, show_header=True, header_style="bold dim", expand=False
    )
    table.add_column("node", no_wrap=True, overflow="ellipsis", width=name_w)
    table.add_column("state", no_wrap=True, overflow="ellipsis", width=state_w)
    table.add_column("GPUs: util temp holder" if wide else "GPUs", no_wrap=True, width=cells_w)
    if owner_w >= MIN_OWNER:
        table.add_column("owner", no_wrap=True, overflow="ellipsis", width=owner_w)
    for name in names:
        rows = nodes[name]
        holders: dict[str, str] = {}
        for g in rows:
            w = g.get("workload") or ""
            if w and w not in holders:
                holders[w] = TAGS[len(holders) % len(TAGS)]
        cells = Text(" ").join(_cell(g, holders.get(g.get("workload") or "", ""), wide) for g in rows)
        orgs = {g.get("workload"): g.get("org") for g in rows}
        owner = Text()
        for w, tag in holders.items():
            owner.append(f"{tag}=", style="bold cyan")
            org = orgs.get(w) or ""
            owner.append(_short_id(w) + (f"/{_short_id(org)}" if org else "") + " ")
        state = str(rows[0].get("node_state") or "?")
        bad = sum(not g.get("healthy", True) for g in rows)
        if bad:
            owner.append(f"{bad} unhealthy", style="bold red")
        row = [Text(name[len(prefix) :]), Text(state, style=STATE_STYLES.get(state, "")), cells, owner]
        table.add_row(*row[: len(table.columns)])

    parts: list[RenderableType] = [*header, table]
    if hidden:
        parts.append(Text(f"… {hidden:,} more nodes (problems first; --json for all)", style="dim"))
    parts += [*reasons, *legend]
    if not nodes:
        parts.insert(len(header), Text("no GPUs registered (suanli admin register --preset …)", style="dim"))
    return Group(*parts)


# ---- `top`: the command -------------------------------------------------------------------------------------------

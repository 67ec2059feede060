"""GPU telemetry on the command line: `suanli admin top` (a live heat map of every node and GPU; each frame is
drawn by `top_frame.render_top`), `admin events`, `admin fault`, `admin node-metrics`, and the tenant's
`suanli metrics WORKLOAD`. Times given to `--since`/`--until` are ISO 8601 (UTC when no offset is given) or a
time ago: -15m, -2h, -1d.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from suanli.cli import credentials as cred
from suanli.cli.common import JsonOpt, check_choice, console, emit_json, fail
from suanli.cli.credentials import ServerOpt, when
from suanli.cli.top_frame import UNHEALTHY, UNLIMITED, clock, num, render_top, temp_style, util_style

if TYPE_CHECKING:
    from suanli.client import Client

FAULT_KINDS = ("overtemp", "xid", "ecc_dbe", "off_bus", "silent")
RESOLUTIONS = ("auto", "raw", "1m", "1h")


NodeArg = Annotated[str, typer.Argument(metavar="NODE", help="Node name or id.")]
SinceOpt = Annotated[
    str | None,
    typer.Option("--since", metavar="ISO|-15m", help="Start: ISO 8601, or a time ago (-30s, -15m, -2h, -1d)."),
]
UntilOpt = Annotated[
    str | None, typer.Option("--until", metavar="ISO|-5m", help="End: ISO 8601, or a time ago (default: now).")
]
ResolutionOpt = Annotated[
    str,
    typer.Option(
        "--resolution",
        metavar="auto|raw|1m|1h",
        help="Raw samples, or per-minute / per-hour min-avg-max; auto: the finest that covers the range.",
    ),
]


# ---- parsing ----------------------------------------------------------------------------------------------------
_AGO = re.compile(r"^-?\s*(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>s|sec|m|min|h|d|w)$", re.IGNORECASE)
_UNIT_S = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_when(text: str | None, option: str, now: datetime | None = None) -> datetime | None:
    """A moment from ISO 8601 (no offset: UTC) or a time ago (`-15m`, `2h`, `-1d`, `now`); bad input: `fail`."""
    if text is None:
        return None
    value = text.strip()
    now = now or datetime.now(UTC)
    if value.lower() == "now":
        return now
    m = _AGO.match(value)
    if m:
        return now - timedelta(seconds=float(m["n"]) * _UNIT_S[m["unit"].lower()])
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        fail(f"invalid {option} {text!r}: give ISO 8601 (2025-06-01T12:00:00Z) or a time ago such as -15m, -2h, -1d")
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def _time_range(since: str | None, until: str | None) -> tuple[datetime | None, datetime | None]:
    now = datetime.now(UTC)
    lo, hi = parse_when(since, "--since", now), parse_when(until, "--until", now)
    if lo is not None and hi is not None and lo >= hi:
        fail(f"--since {since} is not before --until {until}")
    if lo is not None and lo > now:
        fail(f"invalid --since {since!r}: it is in the future")
    return lo, hi


def _filter(gpus: list[dict[str, Any]], names: set[str] | None, prefix: str | None) -> list[dict[str, Any]]:
    return [g for g in gpus if (names is None or g.get("node") in names)
            and (prefix is None or str(g.get("node", "")).startswith(prefix))]  # fmt: skip


def _cluster_nodes(c: Client, cluster: str) -> set[str]:
    names: set[str] = set()
    page = 20_000
    while True:
        rows = c.admin_nodes(cluster=cluster, limit=page, offset=len(names))
        names.update(n.name for n in rows)
        if len(rows) < page:
            break
    if not names:
        fail(f"--cluster {cluster!r}: no nodes in that cluster (see 'suanli admin clusters')")
    return names


def top(
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit (for scripts).")] = False,
    interval: Annotated[
        float, typer.Option("--interval", "-n", metavar="SECONDS", help="Seconds between frames.")
    ] = 2.0,
    cluster: Annotated[str | None, typer.Option("--cluster", help="Only this cluster's nodes (name or id).")] = None,
    node_prefix: Annotated[
        str | None, typer.Option("--node-prefix", metavar="PREFIX", help="Only nodes whose name starts so.")
    ] = None,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Every node and GPU, live: utilisation and temperature as a heat map, holders, health, and the fleet's
    allocation, queue, waste and revenue. Ctrl-C quits. Fleets taller than the terminal show problems first."""
    from suanli.client import ApiError

    if not interval > 0:
        fail(f"--interval must be positive (got {interval:g})")
    with cred.api(server) as c:
        names = _cluster_nodes(c, cluster) if cluster else None

        def fetch() -> tuple[dict[str, Any], list[dict[str, Any]]]:
            return c.cluster_summary(), _filter(c.admin_gpus(), names, node_prefix)

        if json_out:
            summary, gpus = fetch()
            emit_json({"summary": summary, "gpus": gpus})
            return

        def frame(data: tuple[dict[str, Any], list[dict[str, Any]]]) -> RenderableType:
            size = console.size
            return render_top(*data, width=size.width, height=size.height if console.is_terminal else UNLIMITED)

        if once or not console.is_terminal:
            try:
                while True:
                    console.print(frame(fetch()))
                    if once:
                        return
                    time.sleep(interval)  # batch mode (a pipe): one frame after another, like `top -b`
            except KeyboardInterrupt:
                return
        _live(fetch, frame, interval, ApiError)


def _live(
    fetch: Callable[[], tuple[dict[str, Any], list[dict[str, Any]]]],
    frame: Callable[[tuple[dict[str, Any], list[dict[str, Any]]]], RenderableType],
    interval: float,
    api_error: type[Exception],
) -> None:
    """Redraw in place until Ctrl-C (exit 0); while the server does not answer, the last frame stays with a note."""
    from rich.live import Live

    data = fetch()
    try:
        with Live(frame(data), console=console, auto_refresh=False, vertical_overflow="crop") as live:
            while True:
                time.sleep(interval)
                try:
                    data = fetch()
                except api_error as e:
                    status = getattr(e, "status", 0)
                    if status and status < 500:
                        raise
                    note = Text(f"{datetime.now(UTC):%H:%M:%S} no answer: {e}; retrying", style="bold red")
                    live.update(Group(note, frame(data)), refresh=True)
                    continue
                live.update(frame(data), refresh=True)
    except KeyboardInterrupt:
        pass


# ---- health events and faults -------------------------------------------------------------------------------
EVENT_STYLES = {"injected": "magenta", "drained": "yellow", "ready": "green", "repaired": "green", "down": "red"}


def events(
    node: NodeArg,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000, help="Newest this many events.")] = 200,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """A node's health events, oldest first: rules that fired (XIDs, ECC, heat, silence) and what was done."""
    with cred.api(server) as c:
        rows = c.node_events(node, limit=limit)
    if json_out:
        emit_json(rows)
        return
    if not rows:
        console.print(f"{escape(node)}: no health events")
        return
    table = Table(title=f"{escape(node)}: health events ({len(rows)})")
    for col in ("at", "GPU", "kind", "reason"):
        table.add_column(col, justify="right" if col == "GPU" else "left", no_wrap=col != "reason")
    for e in rows:
        kind = str(e.get("kind", ""))
        style = EVENT_STYLES.get(kind, "bold red")
        gpu = "-" if e.get("gpu") is None else str(e["gpu"])
        table.add_row(when(e.get("at")), gpu, Text(kind, style=style), escape(str(e.get("reason", ""))))
    console.print(table)


def fault(
    node: NodeArg,
    gpu: Annotated[int, typer.Option("--gpu", min=0, help="GPU index on the node.")],
    kind: Annotated[str, typer.Option("--kind", metavar="|".join(FAULT_KINDS), help="What goes wrong.")],
    xid: Annotated[int, typer.Option("--xid", min=0, help="The XID number, for --kind xid (e.g. 79, 48).")] = 0,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Inject a fault into a virtual node's simulated GPU: its next samples report it, and the health rules
    act (mark it unhealthy, drain the node, stop its work as a node failure). Repair: 'suanli admin undrain'."""
    kind = check_choice(kind, FAULT_KINDS, "--kind")
    if kind == "xid" and xid <= 0:
        fail("--xid: --kind xid needs the XID number, e.g. --xid 79 (fallen off the bus)")
    if kind != "xid" and xid:
        fail(f"--xid is only for --kind xid (not {kind})")
    with cred.api(server) as c:
        out = c.inject_fault(node, gpu, kind, xid)
    if json_out:
        emit_json(out)
        return
    what = f"xid {xid}" if kind == "xid" else kind
    name = str(out.get("node") or node)
    console.print(
        f"injected {what} into {escape(name)} GPU {gpu} (fault {out.get('id')}); it shows in the next samples"
    )
    console.print(f"watch: suanli admin events {escape(name)}   repair: suanli admin undrain {escape(name)}")


# ---- series ---------------------------------------------------------------------------------------------------
def _stats(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Latest, average (weighted by samples per bucket) and maximum of util, temperature and power."""
    pts = [p for p in points if not p.get("error")]
    out: dict[str, Any] = {"points": len(points), "last": pts[-1] if pts else None}
    for key, top_key in (("util", "util_max"), ("temp_c", "temp_max"), ("power_w", "power_max")):
        vals = [(float(p[key]), int(p.get("n") or 1)) for p in pts if p.get(key) is not None]
        weight = sum(n for _, n in vals)
        out[f"{key}_avg"] = sum(v * n for v, n in vals) / weight if weight else None
        highs = [float(p.get(top_key) if p.get(top_key) is not None else p[key]) for p in pts if p.get(key) is not None]
        out[f"{key}_max"] = max(highs, default=None)
        out[f"{key}_last"] = float(pts[-1][key]) if pts and pts[-1].get(key) is not None else None
    return out


def _range_title(doc: dict[str, Any]) -> str:
    return f"{when(doc.get('since'))} → {when(doc.get('until'))} UTC, {doc.get('resolution')}"


def node_metrics(
    node: NodeArg,
    since: SinceOpt = None,
    until: UntilOpt = None,
    resolution: ResolutionOpt = "auto",
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """A node's GPUs over a time range (default: the last 15 minutes): latest, average and peak utilisation,
    temperature and power, one row per GPU."""
    resolution = check_choice(resolution, RESOLUTIONS, "--resolution")
    lo, hi = _time_range(since, until)
    with cred.api(server) as c:
        doc = c.node_metrics(node, since=lo, until=hi, resolution=resolution)
    if json_out:
        emit_json(doc)
        return
    table = Table(title=f"{escape(str(doc.get('node', node)))}: {_range_title(doc)}")
    cols = ("GPU", "model", "health", "points", "util now", "avg", "max", "temp now", "avg", "max", "power now",
            "avg", "max")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="left" if col in ("model", "health") else "right", no_wrap=True)
    for g in doc.get("gpus") or []:
        st = _stats(g.get("points") or [])
        health = Text("ok", style="green") if g.get("healthy", True) else Text(f"{UNHEALTHY} unhealthy", "bold red")
        table.add_row(
            str(g.get("gpu")), str(g.get("model", "")), health, f"{st['points']:,}",
            *_triple(st, "util", "{:.0f}%", util_style), *_triple(st, "temp_c", "{:.0f}°C", temp_style),
            *_triple(st, "power_w", "{:.0f} W", lambda _: ""),
        )  # fmt: skip
    console.print(table)
    if not any(g.get("points") for g in doc.get("gpus") or []):
        console.print("no samples in that range (telemetry starts with the server's background loops)")


def _held(start: Any, end: Any) -> str:
    """2025-06-01 12:00:00–12:45:10 (the date once when both ends share it)."""
    a, b = when(start), when(end)
    return f"{a}–{b[11:] if a[:10] == b[:10] else b}"


def _triple(st: dict[str, Any], key: str, fmt: str, style: Callable[[float | None], str]) -> list[Text]:
    return [Text(num(st[f"{key}_{k}"], fmt), style=style(st[f"{key}_{k}"])) for k in ("last", "avg", "max")]


def metrics(
    ref: Annotated[str, typer.Argument(metavar="WORKLOAD", help="Workload id (wl_…) or name (the newest).")],
    since: SinceOpt = None,
    until: UntilOpt = None,
    resolution: ResolutionOpt = "auto",
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Your workload's GPUs while it held them (default: its whole life on GPUs): utilisation, temperature and
    power, one row per GPU and attempt."""
    resolution = check_choice(resolution, RESOLUTIONS, "--resolution")
    lo, hi = _time_range(since, until)
    with cred.api(server) as c:
        doc = c.workload_metrics(ref, since=lo, until=hi, resolution=resolution)
    if json_out:
        emit_json(doc)
        return
    gpus = doc.get("gpus") or []
    name = doc.get("name") or ""
    title = f"{doc.get('workload', ref)}{f' ({name})' if name else ''}: {_range_title(doc)}"
    if not gpus:
        console.print(f"{escape(title)}\nno GPUs held in that range (a pending workload has none yet)")
        return
    table = Table(title=escape(title))
    cols = ("node", "GPU", "held (UTC)", "util avg", "max", "temp avg", "max", "power avg", "last reading")
    for col in cols:
        left = col in ("node", "held (UTC)", "last reading")
        table.add_column(col, justify="left" if left else "right", no_wrap=col != "last reading")
    for g in gpus:
        st = _stats(g.get("points") or [])
        last = st["last"]
        reading = "-"
        if last is not None:
            reading = (f"{num(last.get('util'), '{:.0f}%')} {num(last.get('temp_c'), '{:.0f}°C')} "
                       f"{num(last.get('power_w'), '{:.0f} W')} at {clock(last.get('t'))}")  # fmt: skip
        table.add_row(
            escape(str(g.get("node", ""))), str(g.get("gpu")), _held(g.get("from"), g.get("to")),
            Text(num(st["util_avg"], "{:.0f}%"), util_style(st["util_avg"])),
            Text(num(st["util_max"], "{:.0f}%"), util_style(st["util_max"])),
            Text(num(st["temp_c_avg"], "{:.0f}°C"), temp_style(st["temp_c_avg"])),
            Text(num(st["temp_c_max"], "{:.0f}°C"), temp_style(st["temp_c_max"])),
            num(st["power_w_avg"], "{:.0f} W"), reading,
        )  # fmt: skip
    console.print(table)
    if doc.get("windows_left_out"):
        console.print(f"{doc['windows_left_out']} older GPU windows left out; narrow the range with --since/--until")


# ---- registration -----------------------------------------------------------------------------------------------
def register_admin(app: typer.Typer) -> None:
    """Put the operator's telemetry commands on `suanli admin`."""
    app.command("top")(top)
    app.command("events")(events)
    app.command("fault")(fault)
    app.command("node-metrics")(node_metrics)


def register(app: typer.Typer) -> None:
    """Put the tenant's `suanli metrics` on the root app."""
    app.command("metrics")(metrics)

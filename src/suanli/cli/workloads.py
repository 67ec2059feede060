"""Workload commands: `suanli run`, `ps`, `describe`, `logs`, `stop`, `start`, `scale` (jobs and instances).

Logs go to stdout as the workload wrote them; `run --follow` prints its progress there too and ends with one
summary line. A job that does not succeed ends `run --follow` with one `error:` line on stderr and exit code 1;
Ctrl-C while following only detaches (exit 0): the workload keeps running on the server.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml
from rich.cells import cell_len
from rich.markup import escape
from rich.table import Table

from suanli.cli import credentials as cred
from suanli.cli.common import JsonOpt, console, emit_json, fail, one_line, user_errors
from suanli.cli.credentials import EXIT_UNAVAILABLE, ServerOpt, jsonable, money, org_id, when
from suanli.cli.terminal import visible
from suanli.cli.workload_views import age, cut, elapsed, gpus_label, price, span, where, why

if TYPE_CHECKING:  # the client (httpx) is imported when a command runs
    from suanli.client import Client, Workload

POLL_S = 1.0  # seconds between polls while following (tests set it to 0)
WAITING = ("pending", "scheduled", "starting")
NAME_WIDTH, MIN_NAME = 24, 8
MIN_REASON = 12  # narrower than this, `ps` leaves the REASON column out (see `describe`)

RefArg = Annotated[str, typer.Argument(metavar="REF", help="Workload id (wl_…) or name (the newest of that name).")]
FollowOpt = Annotated[bool, typer.Option("--follow", "-f", help="Keep printing the log until the workload ends.")]
OrgOpt = Annotated[
    str | None, typer.Option("--org", metavar="ORG", help="Organisation id or name (default: your personal org).")
]


# ---- output -------------------------------------------------------------------------------------------------
def _write(text: str) -> None:
    """Log text exactly as written (no markup, no wrapping)."""
    sys.stdout.write(text)
    sys.stdout.flush()


def _write_visible(text: str) -> None:
    """Someone else's log text: a carriage return (a progress bar's redraw) as a new line, other control and
    invisible characters as escapes (`cli/terminal.py`)."""
    _write(visible(text.replace("\r\n", "\n").replace("\r", "\n")))


# ---- run ------------------------------------------------------------------------------------------------------
def _read_spec(file: Path) -> dict[str, Any]:
    with user_errors():
        text = file.read_text(encoding="utf-8")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        fail(f"{file}: not valid YAML: {e}")
    if not isinstance(doc, dict):
        fail(f"{file}: a workload spec is a mapping (name:, kind:, command:, resources: …)")
    return doc


def upload_dir(file: Path, spec: dict[str, Any], workdir: Path | None) -> Path | None:
    """What `run` uploads for a job: --workdir DIR, else the spec file's directory when the spec names a
    `workdir`. The server runs the job in `workdir` inside the upload (a relative path, default '.'), so with
    the spec file's directory uploaded, `workdir` is relative to the spec file. Instances upload nothing."""
    kind = str(spec.get("kind", "job"))
    if workdir is not None and kind != "job":
        fail("--workdir: only a job uploads a workdir; an instance keeps its own disk")
    wd = spec.get("workdir")
    if kind != "job" or (wd is None and workdir is None):
        return None
    if wd is not None and (not isinstance(wd, str) or not wd.strip()):
        fail(f"{file}: workdir must be a relative path such as '.' or 'src'")
    root = workdir if workdir is not None else file.parent
    if wd is not None and Path(wd).is_absolute():
        return root  # the server refuses it and says why
    cwd = root / (wd or ".")
    if not cwd.is_dir():
        where = f"--workdir {workdir}" if workdir is not None else f"the directory of {file}"
        fail(f"workdir {wd or '.'!r}: {cwd} is not a directory (it is looked for in {where})")
    return root


def run(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="Workload spec (YAML).")],
    follow: FollowOpt = False,
    workdir: Annotated[
        Path | None,
        typer.Option(
            "--workdir",
            metavar="DIR",
            help="Upload this directory (default: the spec file's, for a job "
            "with a workdir); the job runs in the spec's workdir inside it.",
        ),
    ] = None,
    org: OrgOpt = None,
    model: Annotated[
        list[str] | None,
        typer.Option("--model", metavar="NAME", help="A hub model to mount read-only (`suanli hub models`); repeat."),
    ] = None,
    dataset: Annotated[
        list[str] | None,
        typer.Option("--dataset", metavar="NAME", help="A hub dataset to mount read-only; repeat."),
    ] = None,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Submit a job or an instance; with --follow, watch it queue, stream its log and report how it ended. A spec of
    `kind: service` deploys an endpoint (`suanli deploy`)."""
    if follow and json_out:
        fail("give at most one of --follow and --json")
    doc = _read_spec(file)
    if doc.get("kind") == "service":  # an endpoint: `suanli deploy`'s spec
        from suanli.cli.serving import deploy_spec

        deploy_spec(file.read_text(encoding="utf-8"), org, server, json_out)
        return
    upload = upload_dir(file, doc, workdir)
    spec: Path | dict[str, Any] = file
    if model or dataset:  # added to the spec's own `models:` / `datasets:`, read as the server reads YAML
        from suanli.workloads.spec import SpecError, load_yaml

        try:
            doc = load_yaml(file.read_text(encoding="utf-8"))
        except SpecError as e:
            fail(f"{file}: {e}")
        for key, names in (("models", model or []), ("datasets", dataset or [])):
            have = doc.get(key) or []
            if not isinstance(have, list):
                fail(f"{file}: {key} must be a list of hub names")
            doc[key] = list(dict.fromkeys([*have, *names]))
        spec = doc
    with cred.api(server) as c:
        oid = org_id(c, org)
        with user_errors():
            w = c.submit(spec, workdir=upload, org_id=oid)
        if json_out:
            emit_json(jsonable(w))
            return
        if not follow:
            console.print(f"submitted [bold]{w.id}[/] ({escape(w.name)}): {w.state} - {escape(why(w))}")
            console.print(f"follow it: suanli logs -f {w.id}   details: suanli describe {w.id}")
            return
        console.print(f"submitted [bold]{w.id}[/] ({escape(w.name)})")
        try:
            w = follow_workload(c, w)
        except KeyboardInterrupt:
            console.print(f"detached; the workload keeps running: suanli logs -f {w.id}")
            return
    end(w)


def follow_workload(c: Client, w: Workload, rank: int = 0) -> Workload:
    """Progress lines while it waits (each when it changes), then its log, then the finished workload."""
    import time

    from suanli.client import ApiError

    last = ""
    while w.state in WAITING:
        line = f"{w.state}: {why(w)}"
        if line != last:
            console.print(escape(line), highlight=False)
            last = line
        time.sleep(POLL_S)
        w = c.workload(w.id)
    if not w.finished:
        on = f" on {where(w.allocation.nodes)}" if w.allocation and w.allocation.nodes else ""
        console.print(escape(f"{w.state}{on}: {w.reason}"), highlight=False)
    tail = "\n"
    try:
        for text in c.follow_logs(w.id, rank=rank, poll_s=POLL_S):
            _write(text)
            tail = text[-1:]
    except ApiError as e:
        if e.status != 404:  # no log: it never started
            raise
    if tail != "\n":
        _write("\n")
    return c.wait(w.id, poll_s=POLL_S)


def end(w: Workload) -> None:
    """The summary line; exit 1 unless the job succeeded (or the instance was stopped)."""
    ran = elapsed(w.started_at, w.finished_at)
    took = "without starting" if ran is None else f"{'in' if w.state == 'succeeded' else 'after'} {span(ran)}"
    cost = f"cost {price(w.cost, w.currency)}"
    if w.state == "succeeded" or (w.kind == "instance" and w.state == "stopped"):
        console.print(f"{w.id} {w.state} {took}, {cost}", highlight=False)
        return
    code = f" (exit code {w.exit_code})" if w.exit_code is not None else ""
    typer.echo(f"error: {w.id} {w.state}{code} {took}: {one_line(w.reason)}; {cost}", err=True)
    raise typer.Exit(EXIT_UNAVAILABLE)


# ---- ps and describe ------------------------------------------------------------------------------------------
def ps(
    all: Annotated[bool, typer.Option("--all", "-a", help="Finished workloads too.")] = False,
    org: OrgOpt = None,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Your workloads (in all your organisations), newest first: running and waiting ones, or --all."""
    with cred.api(server) as c:
        rows = c.workloads(all=all, org_id=org_id(c, org))
    if json_out:
        emit_json(jsonable(rows))
        return
    if not rows:
        console.print("no workloads" + ("" if all else " running or waiting (--all: finished ones too)"))
        return
    cur = next((w.currency for w in rows if w.currency), "")
    heads = ("ID", "NAME", "KIND", "STATE", "GPUS", "NODES", "AGE/RUNTIME", "COST", "RATE/h")
    cells = [
        (w.id, cut(w.name, NAME_WIDTH), w.kind, w.state, gpus_label(w), str(w.nodes or "-"), age(w),
         money(w.cost), money(w.rate_per_hour) if w.rate_per_hour and not w.finished else "-")
        for w in rows
    ]  # fmt: skip
    widths = [max(cell_len(h), *(cell_len(r[i]) for r in cells)) for i, h in enumerate(heads)]
    room = console.width - sum(w + 2 for w in widths) - 2  # what is left for REASON (2 spaces between columns)
    if room < 0 and widths[1] > MIN_NAME:  # too narrow: shorten the names before Rich squeezes every column
        widths[1] = max(MIN_NAME, widths[1] + room)
        cells = [(r[0], cut(r[1], widths[1]), *r[2:]) for r in cells]
        room = console.width - sum(w + 2 for w in widths) - 2
    table = Table(title=f"workloads{f' (money in {cur})' if cur else ''}", box=None, pad_edge=False)
    for col in heads + (("REASON",) if room >= MIN_REASON else ()):
        table.add_column(col, justify="right" if col in ("NODES", "COST", "RATE/h") else "left", no_wrap=True)
    for w, row in zip(rows, cells, strict=True):
        reason = (escape(cut(why(w), room)),) if room >= MIN_REASON else ()
        table.add_row(*map(escape, row), *reason)
    console.print(table)


def _spec_lines(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """The spec in a few lines; env values are left out (they may be secrets)."""
    out = [("command", str(spec.get("command", "")))] if spec.get("command") else []
    res = spec.get("resources")
    if isinstance(res, dict) and res:
        out.append(("resources", " ".join(f"{k}={json.dumps(v) if isinstance(v, dict | list) else v}"
                                          for k, v in res.items() if v is not None)))  # fmt: skip
    if isinstance(spec.get("env"), dict) and spec["env"]:
        out.append(("env", ", ".join(spec["env"])))
    for k, v in spec.items():
        if k not in ("name", "kind", "command", "resources", "env") and v not in (None, "", [], {}):
            out.append((k, json.dumps(v) if isinstance(v, dict | list) else str(v)))
    return out


def describe(ref: RefArg, server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """Everything about one workload: state and why, spec, where it runs, cost, and its events."""
    with cred.api(server) as c:
        w = c.workload(ref)
    if json_out:
        emit_json(jsonable(w))
        return
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    rows: list[tuple[str, str]] = [
        ("name", f"{w.name} ({w.kind})"),
        ("state", f"{w.state}: {w.reason}" if w.reason else w.state),
    ]
    if w.pending is not None and w.state == "pending":
        rows.append(("waiting", why(w)))
    rows += [("org / user", f"{w.org_id} / {w.user_id}"), ("created", when(w.created_at)),
             ("started", when(w.started_at)), ("finished", when(w.finished_at)), ("runtime", age(w)),
             ("attempt", str(w.attempt))]  # fmt: skip
    if w.exit_code is not None:
        rows.append(("exit code", str(w.exit_code)))
    scaled = f" (scaled to {w.scale_to} by its owner)" if w.scale_to else ""
    rows.append(("GPUs", f"{gpus_label(w)} on {w.nodes or '-'} node{'s' if w.nodes != 1 else ''}{scaled}"))
    a = w.allocation
    if a is not None:
        rows.append(("billing", f"{a.billing_mode}, {price(a.rate_per_hour, w.currency)}/h (allocation {a.id})"))
        if a.cpu_milli or a.memory_mib:
            from suanli.workloads.host import host_text

            rows.append(("host", f"{host_text(a.cpu_milli, a.memory_mib)}, {price(a.host_rate_per_hour, w.currency)}/h "
                                  "of the rate"))  # fmt: skip
    rows.append(("cost", price(w.cost, w.currency) + ("" if w.finished else " so far")))
    rows += [(f"spec {k}", v) for k, v in _spec_lines(w.spec or {})]
    for key, value in rows:
        grid.add_row(key, escape(value))
    console.print(f"[bold]{w.id}[/]")
    console.print(grid)
    if a is not None and a.nodes:
        nodes = Table(title="allocation")
        nodes.add_column("node")
        nodes.add_column("GPU indices")
        for node, idx in a.nodes.items():
            nodes.add_row(escape(node), ",".join(map(str, idx)) or "-")
        console.print(nodes)
    if w.events:
        events = Table(title="events")
        for col in ("at", "state", "reason"):
            events.add_column(col, no_wrap=col != "reason")
        for e in w.events:
            events.add_row(when(e.at), e.state, escape(e.reason))
        console.print(events)


# ---- logs, stop, start ----------------------------------------------------------------------------------------
def logs(
    ref: RefArg,
    follow: FollowOpt = False,
    rank: Annotated[int, typer.Option("--rank", min=0, help="Which node-rank's log (0: the first node).")] = 0,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="Write another user's log as it is, terminal escape sequences "
            "included (your own jobs' logs always are).",
        ),
    ] = False,
    server: ServerOpt = None,
) -> None:
    """A workload's log (node-rank 0 unless --rank); with -f, keep printing until it ends (Ctrl-C stops). Another
    user's log has its control characters shown as escapes unless --raw: it may set your terminal's title or
    clipboard, or print over what is shown."""
    with cred.api(server) as c:
        write = _write if raw or c.workload(ref).user_id == c.me().user.id else _write_visible
        if follow:
            try:
                for text in c.follow_logs(ref, rank=rank, poll_s=POLL_S):
                    write(text)
            except KeyboardInterrupt:
                return
            return
        offset = 0
        while True:
            chunk = c.logs(ref, offset, rank)
            write(chunk.data)
            if chunk.done or not chunk.data or chunk.next_offset == offset:
                return
            offset = chunk.next_offset


def stop(ref: RefArg, server: ServerOpt = None) -> None:
    """Stop a workload: waiting ones are cancelled, running ones get SIGTERM, then SIGKILL after a grace period."""
    with cred.api(server) as c:
        w = c.stop(ref)
    if w.finished:
        console.print(f"{w.id} ({escape(w.name)}) {w.state}")
    else:
        console.print(f"stopping {w.id} ({escape(w.name)}): it ends after its grace period; see suanli ps")


def start(
    ref: RefArg,
    no_gpu: Annotated[
        bool, typer.Option("--no-gpu", help="CPU only this time (1 core, 2 GiB, at CPU price): reach the disk.")
    ] = False,
    server: ServerOpt = None,
) -> None:
    """Start a stopped instance again (it queues like a new one; its disk is kept; its GPUs come back)."""
    with cred.api(server) as c:
        w = c.start(ref, no_gpu=no_gpu)
    console.print(f"{w.id} ({escape(w.name)}) {w.state}: {escape(why(w))}")


def environments(server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """The environments the operator published, for a spec's `image: NAME` (without one: the server's Python)."""
    with cred.api(server) as c:
        names = c.environments()
    if json_out:
        emit_json(names)
    elif not names:
        console.print("no environments published: workloads run with the server's own Python (read-only)")
    else:
        for name in names:
            console.print(escape(name))


def register(app: typer.Typer) -> None:
    """Put the workload commands on the root app."""
    from suanli.cli.scale import scale

    for name, fn in (("run", run), ("ps", ps), ("describe", describe), ("logs", logs), ("stop", stop),
                     ("start", start), ("scale", scale), ("environments", environments)):  # fmt: skip
        app.command(name)(fn)

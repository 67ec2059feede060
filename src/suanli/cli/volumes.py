"""`suanli volumes …`: persistent volumes, their files and their versions.

A place in a volume is written `vol:NAME/PATH` (or `NAME:PATH`); `NAME@N` is version N (read-only). Who may do
what in a team org's volume goes by role: docs/storage.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table

from suanli.cli import credentials as cred
from suanli.cli.common import JsonOpt, console, emit_json, fail
from suanli.cli.credentials import ServerOpt, jsonable, money, when
from suanli.cli.terminal import shown
from suanli.workloads.volumes import VolumeRuleError, format_size, parse_ref

app = typer.Typer(no_args_is_help=True, help="Persistent volumes: files kept between workloads, with versions.")
NameArg = Annotated[str, typer.Argument(metavar="NAME", help="The volume's name (or id).")]
RefArg = Annotated[str, typer.Argument(metavar="NAME@N", help="A version of a volume, e.g. data@3.")]
OrgOpt = Annotated[str | None, typer.Option("--org", metavar="ORG", help="Organisation id or name (default: yours).")]


def _size(n: int) -> str:
    return format_size(n) if n else "0"


def _ref(text: str, *, version: bool) -> tuple[str, int | None]:
    try:
        ref = parse_ref(text)
    except VolumeRuleError as e:
        fail(f"{text}: {e}")
    if version and ref.version is None:
        fail(f"{text}: name a version, e.g. {ref.name}@1 (see `suanli volumes versions {ref.name}`)")
    return ref.name, ref.version


def remote(text: str) -> tuple[str, str] | None:
    """(volume, path) of `vol:NAME/PATH` or `NAME:PATH`; None for a local path."""
    if text.startswith("vol:"):
        name, _, path = text[4:].partition("/")
        return name, path
    head, colon, path = text.partition(":")
    if colon and "/" not in head and head and not Path(text).exists():
        return head, path
    return None


def volumes_table(rows: Any) -> Table:
    table = Table(title="volumes")
    for col in ("name", "org", "size", "used", "files", "versions", "snapshots", "state", "per hour", "backend"):
        table.add_column(col)
    for v in rows:
        table.add_row(v.name, v.org_id, _size(v.size_bytes), _size(v.used_bytes), str(v.files), str(v.last_version),
                      _size(v.snapshot_bytes), v.state, money(v.price_per_hour), v.backend)  # fmt: skip
    return table


@app.command("create")
def create(
    name: NameArg,
    size: Annotated[str, typer.Option("--size", help="Its limit and what is billed: 200Gi, 500G, bytes.")],
    org: OrgOpt = None,
    backend: Annotated[
        str, typer.Option("--backend", help="local (default) or s3 (where the operator set it up).")
    ] = "local",
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """A new volume; a team org's volumes are shared by its members."""
    with cred.api(server) as c:
        v = c.volume_create(name, size, org, backend)
    if json_out:
        emit_json(jsonable(v))
        return
    console.print(f"created volume {v.name} ({v.id}), {_size(v.size_bytes)}")


@app.command("ls")
def ls(
    where: Annotated[str | None, typer.Argument(metavar="[vol:NAME/DIR]", help="A directory of a volume.")] = None,
    org: OrgOpt = None,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Your volumes; with vol:NAME/DIR, the entries of a directory of one."""
    with cred.api(server) as c:
        if where is None:
            rows: Any = c.volumes(org)
            if json_out:
                emit_json(jsonable(rows))
            else:
                console.print(volumes_table(rows))
            return
        place = remote(where) or (where, "")
        entries = c.volume_ls(place[0], place[1], org)
    if json_out:
        emit_json(jsonable(entries))
        return
    table = Table(title=f"vol:{place[0]}/{place[1]}")
    for col in ("name", "kind", "size"):
        table.add_column(col)
    for e in entries:
        table.add_row(shown(e.name + ("/" if e.kind == "dir" else "")), e.kind, str(e.size) if e.kind == "file" else "")
    console.print(table)


@app.command("describe")
def describe(name: NameArg, org: OrgOpt = None, server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """A volume: size, what it holds, versions, state, and the live workloads that mount it."""
    with cred.api(server) as c:
        v = c.volume(name, org)
    if json_out:
        emit_json(jsonable(v))
        return
    console.print(volumes_table([v]))
    console.print(f"created {when(v.created_at)}; measured {when(v.measured_at)}")
    console.print("mounted by: " + (", ".join(v.mounted_by) if v.mounted_by else "no live workload"))


@app.command("resize")
def resize(
    name: NameArg,
    size: Annotated[str, typer.Option("--size", help="The new limit (not below what it holds).")],
    org: OrgOpt = None,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """A new size: larger, or smaller down to what the volume holds."""
    with cred.api(server) as c:
        v = c.volume_resize(name, size, org)
    if json_out:
        emit_json(jsonable(v))
        return
    console.print(f"{v.name}: {_size(v.size_bytes)}")


@app.command("rm")
def rm(name: NameArg, org: OrgOpt = None, server: ServerOpt = None) -> None:
    """Remove a volume and all its versions (owners and admins); refused while a live workload mounts it."""
    with cred.api(server) as c:
        c.volume_remove(name, org)
    console.print(f"removed volume {name}")


def _bar() -> Progress:
    return Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    console=console, transient=False)  # fmt: skip


@app.command("cp")
def cp(
    src: Annotated[str, typer.Argument(metavar="SRC", help="A local path, or vol:NAME/PATH.")],
    dst: Annotated[str, typer.Argument(metavar="DST", help="vol:NAME/PATH, or a local path.")],
    org: OrgOpt = None,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
    http: Annotated[
        bool, typer.Option("--http", help="Copy over HTTP even on the server's own host (no same-host copy).")
    ] = False,
    verify: Annotated[
        bool, typer.Option("--verify", help="After a same-host copy of a file, compare its sha256 on both sides.")
    ] = False,
) -> None:
    """Copy a file or a directory into a volume or out of one, with a progress bar. Over HTTP a file resumes after
    a break (run the same command again) and its sha256 is checked; a directory travels as one checked tar stream.
    On the server's own host (a loopback server address) the open files are passed to the server instead, which
    copies them in the kernel as `cp` does."""
    from suanli.cli.malloc import tune_for_streams

    a, b = remote(src), remote(dst)
    if (a is None) == (b is None):
        fail("cp: one of SRC and DST must be in a volume (vol:NAME/PATH), the other local")
    tune_for_streams()
    with cred.api(server) as c, _bar() as bar:
        if b is not None:
            local = Path(src)
            if not local.exists():
                fail(f"SRC: {src} does not exist")
            total = (
                sum(p.stat().st_size for p in local.rglob("*") if p.is_file())
                if local.is_dir()
                else local.stat().st_size
            )
            path = b[1] if b[1] and not b[1].endswith("/") else b[1] + local.name if not local.is_dir() else b[1]
            task = bar.add_task(f"{src} → vol:{b[0]}/{path}", total=total)
            out = c.volume_upload(b[0], local, path, org, progress=lambda n: bar.advance(task, n),
                                  same_host=False if http else None, verify=verify)  # fmt: skip
        else:
            assert a is not None
            stat = c.volume_stat(a[0], a[1], org)
            local = Path(dst)
            if local.is_dir() and stat["kind"] == "file":
                local = local / Path(a[1]).name
            task = bar.add_task(f"vol:{a[0]}/{a[1]} → {local}", total=stat["size"] or None)
            out = c.volume_download(a[0], a[1], local, org, progress=lambda n: bar.advance(task, n),
                                    same_host=False if http else None, verify=verify)  # fmt: skip
    if json_out:
        emit_json(jsonable(out))
        return
    note = f", resumed from byte {out.resumed_from}" if out.resumed_from else ""
    note += " (same host: a kernel copy)" if out.via == "same-host" else ""
    console.print(
        f"copied {out.files} file(s), {out.bytes} bytes{note}" + (f"; sha256 {out.sha256}" if out.sha256 else "")
    )


@app.command("snapshot")
def snapshot(
    name: NameArg,
    message: Annotated[str, typer.Option("-m", "--message", help="What this version is.")] = "",
    org: OrgOpt = None,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """A new version of what the volume holds now (it may be mounted); unchanged files are stored once."""
    with cred.api(server) as c:
        v = c.volume_snapshot(name, message, org)
    if json_out:
        emit_json(jsonable(v))
        return
    console.print(f"{name}@{v.number}: {v.files} files, {v.bytes} bytes; {v.added_bytes} bytes new")


@app.command("versions")
def versions(name: NameArg, org: OrgOpt = None, server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """A volume's versions, oldest first."""
    with cred.api(server) as c:
        rows = c.volume_versions(name, org)
    if json_out:
        emit_json(jsonable(rows))
        return
    table = Table(title=f"versions of {name}")
    for col in ("version", "created", "files", "size", "new bytes", "message"):
        table.add_column(col)
    for v in rows:
        table.add_row(f"{name}@{v.number}", when(v.created_at), str(v.files), _size(v.bytes), _size(v.added_bytes),
                      v.message)  # fmt: skip
    console.print(table)


@app.command("restore")
def restore(ref: RefArg, org: OrgOpt = None, server: ServerOpt = None) -> None:
    """Make the volume's files those of version N again (refused while a live workload mounts it)."""
    name, n = _ref(ref, version=True)
    with cred.api(server) as c:
        c.volume_restore(name, n or 0, org)
    console.print(f"{name} now holds {ref}'s files")


@app.command("clone")
def clone(
    ref: RefArg,
    new: Annotated[str, typer.Argument(metavar="NEW", help="The new volume's name.")],
    org: OrgOpt = None,
    server: ServerOpt = None,
) -> None:
    """A new volume holding version N's files (sharing their storage)."""
    name, n = _ref(ref, version=True)
    with cred.api(server) as c:
        v = c.volume_clone(name, n or 0, new, org)
    console.print(f"created volume {v.name} ({v.id}) from {ref}")


@app.command("diff")
def diff(
    a: RefArg,
    b: Annotated[str, typer.Argument(metavar="NAME@M", help="The later version.")],
    org: OrgOpt = None,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Files added, removed and changed between two versions of a volume."""
    (na, va), (nb, vb) = _ref(a, version=True), _ref(b, version=True)
    if na != nb:
        fail(f"diff: {a} and {b} are versions of different volumes")
    with cred.api(server) as c:
        d = c.volume_diff(na, va or 0, vb or 0, org)
    if json_out:
        emit_json(jsonable(d))
        return
    for mark, paths, style in (("+", d.added, "green"), ("-", d.removed, "red"), ("~", d.changed, "yellow")):
        for p in paths:
            console.print(f"[{style}]{mark} {shown(p)}[/{style}]")
    console.print(f"{len(d.added)} added, {len(d.removed)} removed, {len(d.changed)} changed")

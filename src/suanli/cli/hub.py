"""`suanli hub …` (every user: what models and datasets the hub holds) and `suanli admin hub …` (the operator:
add and remove them).

The admin commands work on the server's hub directory and database directly, as `admin create-user` does: they
run on the server host, where the files are (an entry may be gigabytes; it is not sent over HTTP), and a server
never reads a directory because a request named it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from suanli.cli import credentials as cred
from suanli.cli.common import JsonOpt, console, emit_json, fail, human_size
from suanli.cli.credentials import ServerOpt, jsonable, when
from suanli.cli.server_db import ConfigOpt, DbOpt, open_database

if TYPE_CHECKING:  # the client (httpx) and the database are imported when a command runs
    from suanli.client import HubEntry

app = typer.Typer(no_args_is_help=True, help="Public models and datasets, for a spec's `models:` and `datasets:`.")
admin_app = typer.Typer(no_args_is_help=True, help="Add and remove the hub's models and datasets (on the server host).")
NameArg = Annotated[str, typer.Argument(metavar="NAME", help="The entry's name (what a spec names).")]


def _table(title: str, rows: list[HubEntry]) -> Table:
    table = Table(title=title)
    for col in ("name", "load it as", "revision", "size", "files", "license", "added"):
        table.add_column(col)
    for e in rows:
        table.add_row(escape(e.name), escape(e.repo_id), e.revision[:12], human_size(e.size_bytes), str(e.files),
                      escape(e.license or ""), when(e.added_at))  # fmt: skip
    return table


def _list(kind: str, server: str | None, json_out: bool) -> None:
    with cred.api(server) as c:
        rows = c.hub_models() if kind == "model" else c.hub_datasets()
    if json_out:
        emit_json(jsonable(rows))
    elif not rows:
        console.print(f"no {kind}s in the hub yet (the operator adds them: suanli admin hub add-{kind})")
    else:
        console.print(_table(f"hub {kind}s", rows))
        console.print(f"use one: `{kind}s: [NAME]` in a spec" + (" or `suanli run --model NAME`" if kind == "model"
                      else " or `suanli run --dataset NAME`") + "; load it offline by the id in 'load it as'")  # fmt: skip


@app.command("models")
def models(server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """The hub's models: name, the id to load it by (`from_pretrained`), revision, size, licence."""
    _list("model", server, json_out)


@app.command("datasets")
def datasets(server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """The hub's datasets: name, the id to load it by (`load_dataset`), revision, size, licence."""
    _list("dataset", server, json_out)


@app.command("show")
def show(
    name: NameArg,
    dataset: Annotated[bool, typer.Option("--dataset", help="A dataset (default: a model).")] = False,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """One entry with each file's size and SHA-256."""
    with cred.api(server) as c:
        e = c.hub_entry("dataset" if dataset else "model", name)
    if json_out:
        emit_json(jsonable(e))
        return
    console.print(_table(f"hub {e.kind}", [e]))
    files = Table()
    for col in ("file", "size", "sha256"):
        files.add_column(col)
    for f in e.file_list or []:
        files.add_row(escape(f.path), str(f.size), f.sha256)
    console.print(files)


def _admin_add(kind: str, name: str, source: str, repo: str | None, license: str | None, db: str | None,
               config: Path | None) -> None:  # fmt: skip
    from suanli.control.errors import ServiceError
    from suanli.control.ids import utcnow
    from suanli.control.storage import hub

    with open_database(db, config) as (settings, database):
        store = hub.store_of(settings.hub_dir, settings.home)
        console.print(f"adding {kind} {escape(name)} from {escape(source)} into {store.root} …")
        try:
            row = hub.add(database, store, kind, name, source, utcnow(), repo_id=repo, license=license)
        except ServiceError as e:
            fail(e.message)
    console.print(f"added {kind} [bold]{escape(row.name)}[/]: load it as {escape(row.repo_id)} (revision "
                  f"{row.revision[:12]}, {len(row.files)} files, {human_size(row.size_bytes)}, licence "
                  f"{escape(row.license or 'not stated')})")  # fmt: skip


SourceOpt = Annotated[str, typer.Option("--from", help="A directory on this host, or hf://ORG/NAME[@REVISION].")]
RepoOpt = Annotated[
    str | None,
    typer.Option("--repo", help="The id programs load it by, ORG/NAME (required with a directory; hf:// gives it)."),
]
LicenseOpt = Annotated[
    str | None, typer.Option("--license", help="Its licence (default: the `license:` of its README.md card).")
]


@admin_app.command("add-model")
def add_model(name: NameArg, source: SourceOpt, repo: RepoOpt = None, license: LicenseOpt = None, db: DbOpt = None,
              config: ConfigOpt = None) -> None:  # fmt: skip
    """Add a model, stored once, read-only, in the Hugging Face cache layout with every file's SHA-256."""
    _admin_add("model", name, source, repo, license, db, config)


@admin_app.command("add-dataset")
def add_dataset(name: NameArg, source: SourceOpt, repo: RepoOpt = None, license: LicenseOpt = None,
                db: DbOpt = None, config: ConfigOpt = None) -> None:  # fmt: skip
    """Add a dataset (its files, and the same prepared by `datasets` for load_dataset offline)."""
    _admin_add("dataset", name, source, repo, license, db, config)


@admin_app.command("rm")
def rm(
    name: NameArg,
    dataset: Annotated[bool, typer.Option("--dataset", help="A dataset (default: a model).")] = False,
    db: DbOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Remove an entry (refused while unfinished workloads name it)."""
    from suanli.control.errors import ServiceError
    from suanli.control.storage import hub

    kind = "dataset" if dataset else "model"
    with open_database(db, config) as (settings, database):
        try:
            hub.remove(database, hub.store_of(settings.hub_dir, settings.home), kind, name)
        except ServiceError as e:
            fail(e.message)
    console.print(f"removed {kind} {escape(name)}")


@admin_app.command("verify")
def verify(
    name: NameArg,
    dataset: Annotated[bool, typer.Option("--dataset", help="A dataset (default: a model).")] = False,
    db: DbOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Check every file of an entry against its recorded size and SHA-256."""
    from suanli.control.errors import ServiceError
    from suanli.control.storage import hub

    kind = "dataset" if dataset else "model"
    with open_database(db, config) as (settings, database):
        try:
            with database.read() as s:
                row = hub.entry(s, kind, name)
        except ServiceError as e:
            fail(e.message)
        bad = hub.store_of(settings.hub_dir, settings.home).verify(row.folder, row.revision, hub.files_of(row))
    if bad:
        fail(f"{kind} {name}: {len(bad)} file(s) differ from their checksums: {', '.join(bad[:10])}")
    console.print(f"{kind} {escape(name)}: all {len(row.files)} files match their SHA-256")

"""The hub of public models and datasets: the operator adds and removes entries, every tenant lists them, and a
workload that names some (`models:`, `datasets:`) gets them bound read-only into its sandbox with the Hugging Face
variables set so the libraries load them offline, with no copy.

Inside a sandbox (`sandbox_binds`):

    /hub/models--ORG--NAME             each named entry's repository, read-only   HF_HUB_CACHE=/hub
    /tmp/huggingface/                  the workload's own (its private /tmp)      HF_HOME
    /tmp/huggingface/datasets/ORG___NAME  each named dataset, prepared, read-only HF_DATASETS_CACHE
    HF_HUB_OFFLINE=1 (and the older TRANSFORMERS_OFFLINE, HF_DATASETS_OFFLINE)

HF_HOME and the datasets cache are writable folders holding read-only binds: `datasets` writes lock files beside
the folders it reads, and libraries keep tokens, modules and temporary files under HF_HOME. Hub reads cost tenants
nothing: no meter counts them and the hub is not part of any org's storage quota.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from suanli.control.errors import Conflict, Invalid, NotFound
from suanli.control.ids import new_id
from suanli.db.engine import Database
from suanli.db.models import HubEntry, Workload  # (db.models first: it imports db.hub at its end)
from suanli.storage.hub import FileEntry, HubError, HubStore, Stored
from suanli.workloads.models import HUB_NAME
from suanli.workloads.spec import WorkloadSpec

SANDBOX_HUB = "/hub"
SANDBOX_HF_HOME = "/tmp/huggingface"
SANDBOX_DATASETS = f"{SANDBOX_HF_HOME}/datasets"
ACTIVE = ("pending", "scheduled", "starting", "running")
FIELD = {"model": "models", "dataset": "datasets"}


def store_of(hub_dir: Path | None, home: Path) -> HubStore:
    """The operator's hub directory (`hub_dir`), by default `hub/` in the data directory."""
    return HubStore(hub_dir if hub_dir is not None else home / "hub")


def check_name(name: str) -> str:
    if not HUB_NAME.fullmatch(name) or ".." in name:
        raise Invalid(f"name: {name!r} must be 1-63 of a-z, 0-9, '.', '_', '-', starting with a letter or digit")
    return name


def add(
    db: Database, store: HubStore, kind: str, name: str, source: str, now: datetime, *, repo_id: str | None = None,
    license: str | None = None,
) -> HubEntry:  # fmt: skip
    """Store an entry from a directory or `hf://ORG/NAME[@REVISION]` and record it. The name and repository must be
    new (409). The files are copied outside any transaction (they may be gigabytes), placed, then the row is
    written; if it cannot be, the files are removed again."""
    check_name(name)
    if kind not in FIELD:
        raise Invalid(f"kind: must be one of {', '.join(FIELD)}")
    with db.read() as s:
        if s.scalar(select(HubEntry.id).where(HubEntry.kind == kind, HubEntry.name == name)) is not None:
            raise Conflict(f"a {kind} called {name!r} is already in the hub; `suanli admin hub rm {name}` first")
    try:
        if source.startswith("hf://"):
            ref, _, revision = source.removeprefix("hf://").partition("@")
            if repo_id is not None and repo_id != ref:
                raise Invalid(f"repo: {repo_id!r} differs from the source's {ref!r}; give one")
            stored = store.add_hf(kind, ref, revision or "main", license=license)
        else:
            if repo_id is None:
                raise Invalid("repo: the repository id programs load it by (ORG/NAME) is required with a directory")
            stored = store.add_dir(kind, repo_id, Path(source), license=license)
    except HubError as e:
        raise Invalid(str(e)) from None
    row = HubEntry(id=new_id("hub"), kind=kind, name=name, repo_id=stored.repo_id, revision=stored.revision,
                   size_bytes=stored.size_bytes, license=stored.license, source=source[:1024], folder=stored.folder,
                   prepared=stored.prepared, files=[f.__dict__ for f in stored.files], created_at=now)  # fmt: skip
    try:
        with db.write() as s, s.begin():
            s.add(row)
            s.flush()
            s.expunge(row)
    except IntegrityError:
        store.remove(stored.folder, stored.prepared)
        raise Conflict(f"{name!r} or {stored.repo_id!r} was just added to the hub by someone else") from None
    return row


def entries(s: Session, kind: str) -> list[HubEntry]:
    return list(s.scalars(select(HubEntry).where(HubEntry.kind == kind).order_by(HubEntry.name)))


def entry(s: Session, kind: str, name: str) -> HubEntry:
    row = s.scalar(select(HubEntry).where(HubEntry.kind == kind, HubEntry.name == name))
    if row is None:
        raise NotFound(f"no {kind} called {name!r} in the hub")
    return row


def users(s: Session, kind: str, name: str) -> list[str]:
    """Workloads not yet finished that name the entry (their names)."""
    field = FIELD[kind]
    rows = s.execute(select(Workload.name, Workload.spec).where(Workload.state.in_(ACTIVE)).order_by(Workload.name))
    return [r.name for r in rows if name in (r.spec or {}).get(field, ())]


def remove(db: Database, store: HubStore, kind: str, name: str) -> HubEntry:
    """Remove an entry: refused (409, the workloads named) while work that names it has not finished; the row goes
    first, then the files."""
    with db.write() as s, s.begin():
        row = entry(s, kind, name)
        busy = users(s, kind, name)
        if busy:
            shown = ", ".join(busy[:10]) + (f" and {len(busy) - 10} more" if len(busy) > 10 else "")
            raise Conflict(f"{kind} {name!r} is used by unfinished workloads: {shown}")
        s.delete(row)
        s.flush()
        s.expunge(row)
    store.remove(row.folder, row.prepared)
    return row


def check_spec(s: Session, spec: WorkloadSpec) -> None:
    """Every name in `models:` and `datasets:` is in the hub (at submission: a 422 naming the field)."""
    for kind, names in (("model", spec.models), ("dataset", spec.datasets)):
        if not names:
            continue
        known = set(s.scalars(select(HubEntry.name).where(HubEntry.kind == kind, HubEntry.name.in_(names))))
        missing = [n for n in names if n not in known]
        if missing:
            raise Invalid(f"{FIELD[kind]}: no {kind} called {missing[0]!r} in the hub (`suanli hub {FIELD[kind]}` "
                          "lists them)")  # fmt: skip


@dataclass(frozen=True)
class Binds:
    """What a workload's sandbox gets for its hub entries."""

    mounts: tuple[tuple[str, str, bool], ...]  # (host path, path inside, writable)
    env: dict[str, str]


def sandbox_binds(s: Session, store: HubStore, spec: WorkloadSpec, sandboxed: bool = True) -> Binds:
    """Read-only binds and the Hugging Face variables for the entries a spec names (none: nothing). Raises Invalid
    when an entry was removed since the workload was submitted."""
    if not spec.models and not spec.datasets:
        return Binds((), {})
    check_spec(s, spec)
    rows = [entry(s, "model", n) for n in spec.models] + [entry(s, "dataset", n) for n in spec.datasets]
    try:
        return binds(store, [stored_of(r) for r in rows], sandboxed)
    except HubError as e:
        raise Invalid(f"models: {e}") from None


def binds(store: HubStore, stored: list[Stored], sandboxed: bool = True) -> Binds:
    """What a sandbox gets for these entries: each repository at /hub/<its folder>, each prepared dataset under
    the datasets cache, and the variables. Unsandboxed work (the operator's own, `sandbox: off`) is pointed at the
    hub directory itself."""
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    datasets = any(e.kind == "dataset" for e in stored)
    if not sandboxed:
        env["HF_HUB_CACHE"] = str(store.root / "hub")
        if datasets:
            env["HF_DATASETS_CACHE"] = str(store.root / "datasets")
        return Binds((), env)
    mounts: list[tuple[str, str, bool]] = []
    for e in stored:
        host = store.path(e.folder)
        mounts.append((str(host), f"{SANDBOX_HUB}/{host.name}", False))
        if e.prepared:
            prepared = store.path(e.prepared)
            mounts.append((str(prepared), f"{SANDBOX_DATASETS}/{prepared.name}", False))
    env |= {"HF_HOME": SANDBOX_HF_HOME, "HF_HUB_CACHE": SANDBOX_HUB}
    if datasets:
        env["HF_DATASETS_CACHE"] = SANDBOX_DATASETS
    return Binds(tuple(mounts), env)


def files_of(row: HubEntry) -> tuple[FileEntry, ...]:
    return tuple(FileEntry(str(f["path"]), int(f["size"]), str(f["sha256"])) for f in row.files)


def stored_of(row: HubEntry) -> Stored:
    return Stored(row.kind, row.repo_id, row.revision, files_of(row), row.folder, row.prepared, row.license)


def describe(row: HubEntry, with_files: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": row.name, "kind": row.kind, "repo_id": row.repo_id, "revision": row.revision,
        "size_bytes": row.size_bytes, "license": row.license, "files": len(row.files), "added_at": row.created_at,
    }  # fmt: skip
    if with_files:
        out["file_list"] = [dict(f) for f in row.files]
    return out

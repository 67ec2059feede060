"""The hub of public models and datasets, as every signed-in user sees it (the operator adds entries with
`suanli admin hub`): names, repository ids, revisions, sizes, licences and each file's SHA-256. Host paths are
never shown."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Path
from pydantic import Field

from suanli.api.deps import Auth, Caller, in_thread
from suanli.api.schemas import Out
from suanli.api.strict_json import StrictJSONRoute
from suanli.control.storage import hub

router = APIRouter(route_class=StrictJSONRoute, tags=["hub"])
NameArg = Path(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9._-]*$")


class HubFileOut(Out):
    path: str
    size: int
    sha256: str


class HubEntryOut(Out):
    name: str = Field(description="what a spec names: `models: [NAME]`")
    kind: str
    repo_id: str = Field(description="what programs load it by: from_pretrained(REPO_ID), load_dataset(REPO_ID)")
    revision: str
    size_bytes: int
    license: str | None
    files: int
    added_at: datetime
    file_list: list[HubFileOut] | None = Field(None, description="each file with its size and SHA-256 (one entry)")


def _list(ctx: Caller, kind: str) -> list[HubEntryOut]:
    with ctx.db.read() as s:
        return [HubEntryOut(**hub.describe(r)) for r in hub.entries(s, kind)]


def _one(ctx: Caller, kind: str, name: str) -> HubEntryOut:
    with ctx.db.read() as s:
        return HubEntryOut(**hub.describe(hub.entry(s, kind, name), with_files=True))


@router.get("/hub/models")
@in_thread
def models(ctx: Auth) -> list[HubEntryOut]:
    """Every model in the hub, by name."""
    return _list(ctx, "model")


@router.get("/hub/datasets")
@in_thread
def datasets(ctx: Auth) -> list[HubEntryOut]:
    """Every dataset in the hub, by name."""
    return _list(ctx, "dataset")


@router.get("/hub/models/{name}")
@in_thread
def model(ctx: Auth, name: str = NameArg) -> HubEntryOut:
    """One model with its files' sizes and SHA-256 checksums (404 when there is none of that name)."""
    return _one(ctx, "model", name)


@router.get("/hub/datasets/{name}")
@in_thread
def dataset(ctx: Auth, name: str = NameArg) -> HubEntryOut:
    """One dataset with its files' sizes and SHA-256 checksums (404 when there is none of that name)."""
    return _one(ctx, "dataset", name)

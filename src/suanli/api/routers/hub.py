"""The hub of public models and datasets, as every signed-in user sees it (the operator adds entries with
`suanli admin hub`): names, repository ids, revisions, sizes, licences and each file's SHA-256. Host paths are
never shown."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from fastapi import APIRouter, Path
from pydantic import Field

from suanli.api.deps import Auth, in_thread
from suanli.api.schemas import Out
from suanli.api.strict_json import StrictJSONRoute
from suanli.control import hub

router = APIRouter(route_class=StrictJSONRoute, tags=["hub"])
Kind = Literal["models", "datasets"]
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


def _kind(kind: Kind) -> str:
    return "model" if kind == "models" else "dataset"


@router.get("/hub/{kind}")
@in_thread
def list_entries(kind: Kind, ctx: Auth) -> list[HubEntryOut]:
    """Every model (or dataset) in the hub, by name."""
    with ctx.db.read() as s:
        return [HubEntryOut(**hub.describe(r)) for r in hub.entries(s, _kind(kind))]


@router.get("/hub/{kind}/{name}")
@in_thread
def get_entry(kind: Kind, ctx: Auth, name: str = NameArg) -> HubEntryOut:
    """One entry with its files' sizes and SHA-256 checksums (404 when there is none of that name)."""
    with ctx.db.read() as s:
        return HubEntryOut(**hub.describe(hub.entry(s, _kind(kind), name), with_files=True))

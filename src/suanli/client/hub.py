"""The SDK's calls for the hub of public models and datasets (`suanli hub`).

A mixin of `suanli.client.Client` (kept apart so each file stays small).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

from suanli.client.models import load


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class HubEntry:
    """A model or dataset of the hub: `name` goes in a spec (`models: [name]`), `repo_id` in the program
    (`from_pretrained(repo_id)`, `load_dataset(repo_id)`)."""

    name: str
    kind: str  # model | dataset
    repo_id: str
    revision: str
    size_bytes: int
    license: str | None
    files: int
    added_at: datetime
    file_list: list[HubFile] | None = None  # with `Client.hub_entry` only


class HubCalls:
    if TYPE_CHECKING:  # provided by `Client`

        def _get(self, path: str, **params: Any) -> Any: ...

    def hub_models(self) -> list[HubEntry]:
        """The models of the hub, by name."""
        return [load(HubEntry, e) for e in self._get("/hub/models")]

    def hub_datasets(self) -> list[HubEntry]:
        """The datasets of the hub, by name."""
        return [load(HubEntry, e) for e in self._get("/hub/datasets")]

    def hub_entry(self, kind: Literal["model", "dataset"], name: str) -> HubEntry:
        """One model or dataset with each file's size and SHA-256."""
        return load(HubEntry, self._get(f"/hub/{kind}s/{quote(name, safe='')}"))

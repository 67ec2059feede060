"""A workload can nest its volume's directories deeper than any path names them (each mkdir relative to the last).
Over HTTP the walks of such a tree (`os.fwalk`, `shutil.rmtree`: a frame a level) raised RecursionError: a 500 on
every copy in (each measures the volume first), on a tar out, a snapshot and a resize, and the tree could not be
removed at all. Walks are loops now, bounded by `MAX_WALK_DEPTH`: each such route is a 422 naming the volume, and
removal works at any depth. Through the API in-process, on both databases; the tree is made on disk inside the
volume's data directory, as a workload makes it (the API names paths at most 64 directories deep)."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from suanli.storage.archive import remove_tree
from suanli.storage.volumes import MAX_WALK_DEPTH
from tests.control_plane import Tenant, signup
from tests.test_hardening_local_copy import chain
from tests.test_volumes_api import API, api, create, live, put, root

__all__ = ["api"]
DEEP = MAX_WALK_DEPTH + 50


@pytest.fixture
def cleaned(api: TestClient) -> Iterator[None]:
    """Whatever a test leaves of its volumes is removed after it (pytest's own clean-up recurses a frame a level)."""
    yield
    remove_tree(root(api))


@pytest.fixture
def deep(api: TestClient, cleaned: None) -> tuple[Tenant, dict[str, Any], Path]:
    """A volume holding a file and a tree `DEEP` directories deep, made as a workload makes it."""
    t = signup(api, "deep@example.com")
    vol = create(api, t, "data", "8Mi").json()
    assert put(api, t, "data", "keep.txt", b"kept").status_code == 200
    (live(api, vol) / "top").mkdir()
    chain(live(api, vol) / "top", DEEP)
    return t, vol, live(api, vol)


def names(body: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        return tar.getnames()


def refused_by_volume(r: Any) -> None:
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith("volume: ") and f"more than {MAX_WALK_DEPTH} levels deep" in detail, detail


def test_every_route_that_walks_a_too_deep_tree_refuses_it_naming_the_volume(api: TestClient, deep: Any) -> None:
    t, _, _ = deep
    h = t.headers
    refused_by_volume(put(api, t, "data", "more.txt", b"x"))  # measured first
    refused_by_volume(api.put(f"{API}/volumes/data/tree", params={"path": "in"}, content=b"", headers=h))
    refused_by_volume(api.get(f"{API}/volumes/data/tree", params={"path": ""}, headers=h))
    refused_by_volume(api.get(f"{API}/volumes/data/tree", params={"path": "top"}, headers=h))
    refused_by_volume(api.post(f"{API}/volumes/data/versions", json={"message": "m"}, headers=h))
    refused_by_volume(api.patch(f"{API}/volumes/data", json={"size": "16Mi"}, headers=h))
    # what walks no tree still answers: a file, a listing
    assert api.get(f"{API}/volumes/data/files", params={"path": "keep.txt"}, headers=h).content == b"kept"
    listed = [e["name"] for e in api.get(f"{API}/volumes/data/ls", params={"path": ""}, headers=h).json()]
    assert listed == ["keep.txt", "top"]


def test_a_too_deep_tree_is_removed_over_http_and_the_volume_takes_copies_again(api: TestClient, deep: Any) -> None:
    t, _, data = deep
    h = t.headers
    r = api.delete(f"{API}/volumes/data/files", params={"path": "top"}, headers=h)
    assert r.status_code == 204, r.text
    assert not (data / "top").exists()
    assert put(api, t, "data", "more.txt", b"x").status_code == 200
    tree = api.get(f"{API}/volumes/data/tree", params={"path": ""}, headers=h)
    assert tree.status_code == 200
    assert sorted(names(tree.content)) == ["keep.txt", "more.txt"]


def test_a_volume_holding_a_too_deep_tree_is_deleted(api: TestClient, deep: Any) -> None:
    t, _, data = deep
    r = api.delete(f"{API}/volumes/data", headers=t.headers)
    assert r.status_code == 204, r.text
    assert not data.exists()


def test_a_tar_nesting_deeper_than_a_walk_descends_is_refused_naming_the_body(api: TestClient, cleaned: None) -> None:
    """Unpacked, then merged into the tree by a recursion a frame a level: a RecursionError, and a tree no walk
    of the volume could count."""
    t = signup(api, "tar@example.com")
    create(api, t, "data", "8Mi")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("d/" * DEEP + "f")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    h = t.headers
    r = api.put(f"{API}/volumes/data/tree", params={"path": "in"}, content=buf.getvalue(), headers=h)
    assert r.status_code == 422 and r.json()["detail"].startswith("body: "), r.text
    assert f"more than {MAX_WALK_DEPTH} levels" in r.json()["detail"]
    assert api.get(f"{API}/volumes/data/ls", params={"path": ""}, headers=h).json() == []
    shallow = io.BytesIO()
    with tarfile.open(fileobj=shallow, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("d/" * (MAX_WALK_DEPTH - 2) + "f")  # below "in": at the limit, taken
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    r = api.put(f"{API}/volumes/data/tree", params={"path": "in"}, content=shallow.getvalue(), headers=h)
    assert r.status_code == 200, r.text
    r = api.get(f"{API}/volumes/data/tree", params={"path": "in"}, headers=h)
    assert r.status_code == 200 and len(names(r.content)) == MAX_WALK_DEPTH - 1
    r = api.delete(f"{API}/volumes/data/files", params={"path": "in"}, headers=h)
    assert r.status_code == 204 and api.get(f"{API}/volumes/data/ls", params={"path": ""}, headers=h).json() == []


def test_a_mounted_volume_too_deep_to_count_is_full_until_trimmed(api: TestClient, deep: Any) -> None:
    """The sweep that measures the volumes live workloads write raised RecursionError at this one (and so never
    marked it full): what a workload hides below the depth a walk counts is treated as more than its size."""
    from suanli.control.ids import utcnow
    from suanli.control.storage import volume_files

    t, _, _ = deep
    job = {"name": "nester", "command": "sleep 60", "resources": {"gpus": 0},
           "volumes": [{"name": "data", "path": "/data"}]}  # fmt: skip
    assert api.post(f"{API}/workloads", json={"spec": job}, headers=t.headers).status_code == 201
    db = api.app.state.server.db  # type: ignore[attr-defined]
    assert volume_files.measure_mounted(db, root(api), utcnow()) == 1
    assert api.get(f"{API}/volumes/data", headers=t.headers).json()["state"] == "full"
    assert put(api, t, "data", "more.txt", b"x").status_code == 507
    assert api.delete(f"{API}/volumes/data/files", params={"path": "top"}, headers=t.headers).status_code == 204
    assert api.get(f"{API}/volumes/data", headers=t.headers).json()["state"] == "ready"
    assert volume_files.measure_mounted(db, root(api), utcnow()) == 1
    assert api.get(f"{API}/volumes/data", headers=t.headers).json()["state"] == "ready"

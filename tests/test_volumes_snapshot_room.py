"""Versions hold disk too: an org's snapshots are bounded, and a volume whose org stopped paying takes none.

The attack (a hostile review): `volume_bytes_per_org` bounded only the volumes' sizes; every snapshot of changed
content added blobs without bound, balance or state check, so a ¥10 tenant looping write-and-snapshot filled the
server's disk within the first hour (six 7 MiB versions of an 8 MiB volume kept 42 MiB on an 8 MiB quota), and a
read-only (unpaid) volume still took snapshots. Both databases.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.control_plane import admin_token, bearer, signup

API = "/api/v1"
MiB = 1 << 20


@pytest.fixture
def api(db_url: str, tmp_path: Path, cheap_password_hashing: None) -> Iterator[TestClient]:
    from suanli.api.app import create_app
    from tests.control_plane import settings

    s = settings(tmp_path / "home", db_url, volume_max_bytes=8 * MiB, volumes_per_org=3,
                 volume_bytes_per_org=8 * MiB, volume_snapshot_bytes_per_org=8 * MiB)  # fmt: skip
    with TestClient(create_app(s)) as client:
        r = client.post(f"{API}/admin/clusters", json={"local": True, "name": "this-host"},
                        headers=bearer(admin_token(client)))  # fmt: skip
        assert r.status_code == 201, r.text
        yield client


def _blobs(api: TestClient, org_id: str) -> int:
    root = api.app.state.server.settings.volumes_root / org_id / "blobs"  # type: ignore[attr-defined]
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(root) for f in files)


def test_snapshots_stop_at_the_orgs_snapshot_room(api: TestClient) -> None:
    t = signup(api, "a@example.com")
    vol = api.post(f"{API}/volumes", json={"name": "data", "size": "8Mi"}, headers=t.headers).json()
    codes = []
    for i in range(6):
        api.delete(f"{API}/volumes/data/files", params={"path": "f"}, headers=t.headers)
        r = api.put(f"{API}/volumes/data/files", params={"path": "f"}, content=os.urandom(7 * MiB), headers=t.headers)
        assert r.status_code == 200, r.text
        r = api.post(f"{API}/volumes/data/versions", json={"message": str(i)}, headers=t.headers)
        codes.append(r.status_code)
        if r.status_code != 201:
            assert "volume_snapshot_bytes_per_org" in r.json()["detail"], r.text
    assert codes[0] == 201 and set(codes[1:]) == {409}, codes
    assert _blobs(api, vol["org_id"]) <= 8 * MiB


def test_a_read_only_volume_takes_no_snapshot(api: TestClient) -> None:
    from suanli.db.volumes import Volume

    db = api.app.state.server.db  # type: ignore[attr-defined]
    t = signup(api, "b@example.com")
    vol = api.post(f"{API}/volumes", json={"name": "data", "size": "8Mi"}, headers=t.headers).json()
    api.put(f"{API}/volumes/data/files", params={"path": "f"}, content=os.urandom(MiB), headers=t.headers)
    with db.write() as s, s.begin():
        s.get(Volume, vol["id"]).state = "read-only"
    r = api.post(f"{API}/volumes/data/versions", json={"message": "x"}, headers=t.headers)
    assert r.status_code == 402, r.text


def test_a_volume_removed_during_its_snapshot_leaves_nothing_on_disk(api: TestClient, monkeypatch: Any) -> None:
    """A hostile review: the snapshot went on writing its manifest into the removed volume's directory (made again),
    and the blob store kept what it named for ever, billed to nobody. The removal now waits for the snapshot and
    takes all of it; the snapshot answers that the volume is gone."""
    from suanli.storage import volume_versions as vv

    t = signup(api, "c@example.com")
    vol = api.post(f"{API}/volumes", json={"name": "data", "size": "8Mi"}, headers=t.headers).json()
    api.put(f"{API}/volumes/data/files", params={"path": "f"}, content=os.urandom(6 * MiB), headers=t.headers)
    real_store, out = vv._store, {}

    def store_then_remove(p: Any, name: str, dfd: int, most: int) -> Any:
        got = real_store(p, name, dfd, most)  # the file is in the blob store; now its owner removes the volume
        out["th"] = threading.Thread(target=lambda: out.setdefault("rm", api.delete(f"{API}/volumes/data",
                                                                                   headers=t.headers)))  # fmt: skip
        out["th"].start()
        time.sleep(1.0)  # the removal has begun (its row goes at once; its files wait for this snapshot)
        return got

    monkeypatch.setattr(vv, "_store", store_then_remove)
    r = api.post(f"{API}/volumes/data/versions", json={"message": "x"}, headers=t.headers)
    out["th"].join(30)
    assert out["rm"].status_code == 204
    assert r.status_code == 404 and "removed" in r.json()["detail"], r.text
    org = api.app.state.server.settings.volumes_root / vol["org_id"]  # type: ignore[attr-defined]
    assert _blobs(api, vol["org_id"]) == 0 and not (org / "vols" / vol["id"]).exists()


def test_a_held_upload_and_a_tree_together_stay_within_the_volume(api: TestClient) -> None:
    """A hostile review: a held upload waits beside the tree, and `PUT /tree` did not count it: an 8 MiB volume
    held 14 MiB."""
    from tests.test_volumes_api import tar

    t = signup(api, "d@example.com")
    api.post(f"{API}/volumes", json={"name": "data", "size": "8Mi"}, headers=t.headers)
    r = api.put(f"{API}/volumes/data/files", params={"path": "held", "hold": "true"}, content=b"h" * (5 * MiB),
                headers=t.headers)  # fmt: skip
    assert r.status_code == 200, r.text
    r = api.put(f"{API}/volumes/data/tree", content=tar({"t": b"t" * (5 * MiB)}), headers=t.headers)
    assert r.status_code == 507, r.text
    r = api.put(f"{API}/volumes/data/tree", content=tar({"t": b"t" * (2 * MiB)}), headers=t.headers)
    assert r.status_code == 200, r.text  # what the held upload leaves

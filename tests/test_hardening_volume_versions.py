"""Versions under attack, on both databases: a restore or a clone never puts more in a volume than its size (a
version snapshotted before the volume shrank was restored whole: 8 MiB live in a volume billed as 1 MiB), counted
in the blocks the tree's measure counts; and two restores of one volume at once leave one version's tree, not a mix
of both (they shared one scratch directory), with no 500."""

from __future__ import annotations

import io
import tarfile
import threading
from typing import Any

from fastapi.testclient import TestClient

from tests.control_plane import signup
from tests.test_hardening_volume_names import _live, volumes_api  # noqa: F401  (the fixture api)

API = "/api/v1"
MiB = 1 << 20


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_restore_never_puts_more_than_the_volumes_size_in_it(api: TestClient) -> None:
    t = signup(api, "restore@example.com")
    vol = api.post(f"{API}/volumes", json={"name": "data", "size": "16Mi"}, headers=t.headers).json()
    assert api.put(f"{API}/volumes/data/files", params={"path": "big"}, content=b"y" * (8 * MiB), headers=t.headers).status_code == 200  # fmt: skip
    assert api.post(f"{API}/volumes/data/versions", json={}, headers=t.headers).status_code == 201
    assert api.delete(f"{API}/volumes/data/files", params={"path": "big"}, headers=t.headers).status_code == 204
    assert api.patch(f"{API}/volumes/data", json={"size": "1Mi"}, headers=t.headers).status_code == 200
    r = api.post(f"{API}/volumes/data/restore", json={"version": 1}, headers=t.headers)
    assert r.status_code == 409 and r.json()["detail"].startswith("version"), r.text
    assert list(_live(api, vol).iterdir()) == []  # the live tree as it was
    assert api.patch(f"{API}/volumes/data", json={"size": "16Mi"}, headers=t.headers).status_code == 200
    assert api.post(f"{API}/volumes/data/restore", json={"version": 1}, headers=t.headers).status_code == 200


def test_a_clone_counts_the_versions_blocks_not_its_bytes(api: TestClient) -> None:
    """300 files of one byte are 300 bytes but 300 blocks of 4 KiB (1.2 MiB), as the tree's measure counts them."""
    t = signup(api, "clone@example.com")
    api.post(f"{API}/volumes", json={"name": "tiny", "size": "2Mi"}, headers=t.headers)
    body = _tar({f"f{i}": b"x" for i in range(300)})
    assert api.put(f"{API}/volumes/tiny/tree", params={"path": ""}, content=body, headers=t.headers).status_code == 200
    assert api.post(f"{API}/volumes/tiny/versions", json={}, headers=t.headers).status_code == 201
    for i in range(300):
        api.delete(f"{API}/volumes/tiny/files", params={"path": f"f{i}"}, headers=t.headers)
    assert api.patch(f"{API}/volumes/tiny", json={"size": "1Mi"}, headers=t.headers).status_code == 200
    r = api.post(f"{API}/volumes/tiny/clone", json={"version": 1, "name": "copy"}, headers=t.headers)
    assert r.status_code == 409 and r.json()["detail"].startswith("version"), r.text


def test_two_restores_at_once_leave_one_versions_tree(api: TestClient) -> None:
    t = signup(api, "restores@example.com")
    vol = api.post(f"{API}/volumes", json={"name": "data", "size": "32Mi"}, headers=t.headers).json()
    for prefix in ("one", "two"):
        if prefix == "two":
            assert api.delete(f"{API}/volumes/data/files", params={"path": "one"}, headers=t.headers).status_code == 204
        body = _tar({f"{prefix}/{i}": prefix[0].encode() for i in range(400)})
        assert api.put(f"{API}/volumes/data/tree", params={"path": ""}, content=body, headers=t.headers).status_code == 200  # fmt: skip
        assert api.post(f"{API}/volumes/data/versions", json={}, headers=t.headers).status_code == 201
    codes: list[int] = []
    for _ in range(3):
        out: dict[int, Any] = {}

        def restore(n: int, out: dict[int, Any] = out) -> None:
            out[n] = api.post(f"{API}/volumes/data/restore", json={"version": n}, headers=t.headers)

        threads = [threading.Thread(target=restore, args=(n,)) for n in (1, 2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        codes += [out[1].status_code, out[2].status_code]
        live = _live(api, vol)
        tops = sorted(p.name for p in live.iterdir())
        assert tops in (["one"], ["two"]) and sum(1 for p in live.rglob("*") if p.is_file()) == 400, (codes, tops)
    assert set(codes) == {200}, codes


def test_each_volume_pays_for_what_its_versions_hold(api: TestClient) -> None:
    """The org's blob store keeps one copy of each content, and a version paid only for what was new to the store:
    two volumes with the same 8 MiB, the first removed, and the second's versions held the 8 MiB billed to nobody.
    A volume's versions now pay for the content they name that its earlier versions did not."""
    import hashlib

    t = signup(api, "dodge@example.com")
    content = b"z" * (8 * MiB)
    for name in ("a", "b"):
        assert api.post(f"{API}/volumes", json={"name": name, "size": "16Mi"}, headers=t.headers).status_code == 201
        assert api.put(f"{API}/volumes/{name}/files", params={"path": "data"}, content=content, headers=t.headers).status_code == 200  # fmt: skip
        v = api.post(f"{API}/volumes/{name}/versions", json={}, headers=t.headers).json()
        assert v["added_bytes"] == len(content), (name, v)
    assert api.delete(f"{API}/volumes/a", headers=t.headers).status_code == 204
    assert api.delete(f"{API}/volumes/b/files", params={"path": "data"}, headers=t.headers).status_code == 204
    assert api.patch(f"{API}/volumes/b", json={"size": "1Mi"}, headers=t.headers).status_code == 200
    b = api.get(f"{API}/volumes/b", headers=t.headers).json()
    sha = hashlib.sha256(content).hexdigest()
    blob = api.app.state.server.settings.volumes_root / b["org_id"] / "blobs" / sha[:2] / sha  # type: ignore[attr-defined]
    assert blob.exists()  # kept: b's version names it
    assert b["size_bytes"] + b["snapshot_bytes"] >= len(content)  # and b pays for it
    assert api.put(f"{API}/volumes/b/files", params={"path": "again"}, content=b"q", headers=t.headers).status_code == 200  # fmt: skip
    v2 = api.post(f"{API}/volumes/b/versions", json={}, headers=t.headers).json()
    assert v2["added_bytes"] == 1  # content its own earlier version holds is not paid twice

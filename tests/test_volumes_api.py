"""Volumes through the API in-process, on both databases: every field bounded, another org's volumes invisible,
roles decide who writes, snapshots and deletes, paths never leave the volume (not through `..`, not through a link
a workload planted), sizes are limits, and versions store unchanged files once."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.control_plane import Tenant, admin_token, bearer, join, signup

API = "/api/v1"
MiB = 1 << 20


@pytest.fixture
def api(db_url: str, tmp_path: Path, cheap_password_hashing: None) -> Iterator[TestClient]:
    from suanli.api.app import create_app
    from tests.control_plane import settings

    s = settings(tmp_path / "home", db_url, volume_max_bytes=64 * MiB, volumes_per_org=3)
    with TestClient(create_app(s)) as client:
        r = client.post(f"{API}/admin/clusters", json={"local": True, "name": "this-host"},
                        headers=bearer(admin_token(client)))  # fmt: skip
        assert r.status_code == 201, r.text
        yield client


def root(api: TestClient) -> Path:
    return api.app.state.server.settings.volumes_root  # type: ignore[attr-defined]


def create(api: TestClient, who: Tenant, name: str = "data", size: Any = "8Mi", **more: Any) -> Any:
    return api.post(f"{API}/volumes", json={"name": name, "size": size, **more}, headers=who.headers)


def put(api: TestClient, who: Tenant, vol: str, path: str, data: bytes, **params: Any) -> Any:
    return api.put(f"{API}/volumes/{vol}/files", params={"path": path, **params}, content=data, headers=who.headers)


def get(api: TestClient, who: Tenant, vol: str, path: str, **headers: str) -> Any:
    return api.get(f"{API}/volumes/{vol}/files", params={"path": path}, headers={**who.headers, **headers})


def live(api: TestClient, vol: dict[str, Any]) -> Path:
    return root(api) / vol["org_id"] / "vols" / vol["id"] / "data"


def tar(files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            t.addfile(info)
    return buf.getvalue()


# ---- fields -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "../x", "size": "1Gi"}, "name"),
        ({"name": "Data", "size": "1Gi"}, "name"),
        ({"name": "a" * 64, "size": "1Gi"}, "name"),
        ({"name": "data", "size": "-1"}, "size"),
        ({"name": "data", "size": "1Ki"}, "size"),
        ({"name": "data", "size": "9" * 40}, "size"),
        ({"name": "data", "size": "65Mi"}, "size"),  # over volume_max_bytes
        ({"name": "data", "size": True}, "size"),
        ({"name": "data", "size": "1Mi", "backend": "nfs"}, "backend"),
        ({"name": "data", "size": "1Mi", "extra": 1}, "extra"),
    ],
)
def test_every_field_is_bounded_and_named(api: TestClient, body: dict[str, Any], field: str) -> None:
    t = signup(api, "a@example.com")
    r = api.post(f"{API}/volumes", json=body, headers=t.headers)
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"]


def test_sizes_names_and_the_count_per_org(api: TestClient) -> None:
    t = signup(api, "a@example.com")
    r = create(api, t, size="2Mi")
    assert r.status_code == 201 and r.json()["size_bytes"] == 2 * MiB, r.text
    assert create(api, t).status_code == 409  # the name exists
    assert create(api, t, "b").status_code == 201 and create(api, t, "c").status_code == 201
    r = create(api, t, "d")
    assert r.status_code == 409 and "volumes_per_org" in r.json()["detail"]
    assert [v["name"] for v in api.get(f"{API}/volumes", headers=t.headers).json()] == ["b", "c", "data"]


# ---- tenants ----------------------------------------------------------------------------------------------------------
def test_another_orgs_volume_does_not_exist(api: TestClient) -> None:
    alice, mallory = signup(api, "alice@example.com"), signup(api, "mallory@example.com")
    vol = create(api, alice).json()
    assert put(api, alice, "data", "secret.txt", b"s3cret").status_code == 200
    for ref, org in ((vol["id"], None), ("data", alice.org_id), ("data", vol["org_id"])):
        params = {"org": org} if org else {}
        assert api.get(f"{API}/volumes/{ref}", params=params, headers=mallory.headers).status_code == 404
        r = api.get(f"{API}/volumes/{ref}/files", params={"path": "secret.txt", **params}, headers=mallory.headers)
        assert r.status_code == 404, r.text
        r = api.put(f"{API}/volumes/{ref}/files", params={"path": "x", **params}, content=b"x",
                    headers=mallory.headers)  # fmt: skip
        assert r.status_code == 404
        assert api.delete(f"{API}/volumes/{ref}", params=params, headers=mallory.headers).status_code == 404
    assert api.get(f"{API}/volumes", headers=mallory.headers).json() == []
    assert api.get(f"{API}/volumes", params={"org": alice.org_id}, headers=mallory.headers).status_code == 404
    # Mallory's own volume of the same name is hers alone.
    assert create(api, mallory).status_code == 201
    assert get(api, mallory, "data", "secret.txt").status_code == 422


def test_roles_decide_who_reads_writes_snapshots_and_deletes(api: TestClient) -> None:
    owner, member, viewer = (signup(api, f"{n}@example.com") for n in ("owner", "member", "viewer"))
    team = api.post(f"{API}/orgs", json={"name": "lab"}, headers=owner.headers).json()["id"]
    join(api, owner, team, member, "member")
    join(api, owner, team, viewer, "viewer")
    r = api.post(f"{API}/admin/orgs/{team}/transactions", json={"kind": "topup", "amount": "10"},
                 headers=bearer(admin_token(api)))  # fmt: skip
    assert r.status_code == 201, r.text  # (an org without money allocates no storage)
    q = {"org": "lab"}
    assert create(api, viewer, "shared", org="lab").status_code == 403
    assert create(api, member, "shared", org="lab").status_code == 201
    assert put(api, member, "shared", "a.txt", b"a", **q).status_code == 200
    r = put(api, viewer, "shared", "b.txt", b"b", **q)
    assert r.status_code == 403 and "viewer" in r.json()["detail"]
    r = get(api, viewer, f"shared?org={team}", "a.txt")
    assert api.get(f"{API}/volumes/shared/files", params={"path": "a.txt", **q}, headers=viewer.headers).content == b"a"
    for who, want in ((viewer, 403), (member, 403), (owner, 201)):
        r = api.post(f"{API}/volumes/shared/versions", params=q, json={"message": "m"}, headers=who.headers)
        assert r.status_code == want, r.text
    for who, want in ((viewer, 403), (member, 403), (owner, 204)):
        assert api.delete(f"{API}/volumes/shared", params=q, headers=who.headers).status_code == want


# ---- paths ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["../x", "a/../../x", "/../../etc/passwd", "a\x00b", "a\\..\\b", "", "/",
                                  ".suanli/x", "x/" * 70 + "f", "a" * 300])  # fmt: skip
def test_paths_stay_inside_the_volume(api: TestClient, path: str) -> None:
    t = signup(api, "a@example.com")
    create(api, t)
    r = put(api, t, "data", path, b"x")
    assert r.status_code in (400, 422), r.text
    assert "path" in r.text or "NUL" in r.text


def test_a_link_a_workload_planted_is_never_followed(api: TestClient, tmp_path: Path) -> None:
    t = signup(api, "a@example.com")
    vol = create(api, t).json()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host secret")
    data = live(api, vol)
    os.symlink(outside / "secret", data / "leak")  # what a workload could do inside its sandbox
    os.symlink(outside, data / "dir")
    assert get(api, t, "data", "leak").status_code == 422
    assert get(api, t, "data", "dir/secret").status_code == 422
    r = put(api, t, "data", "dir/planted", b"x")
    assert r.status_code == 422 and not (outside / "planted").exists()
    r = api.get(f"{API}/volumes/data/ls", params={"path": "dir"}, headers=t.headers)
    assert r.status_code == 422
    r = api.get(f"{API}/volumes/data/tree", params={"path": ""}, headers=t.headers)
    with tarfile.open(fileobj=io.BytesIO(r.content)) as got:
        kinds = {m.name: m.issym() for m in got.getmembers()}
    assert kinds == {"leak": True, "dir": True}  # stored as links, never read through
    # A tar that tries to plant a link is refused whole.
    r = api.put(f"{API}/volumes/data/tree", content=tar({"ok": b"1"}, {"evil": "/etc"}), headers=t.headers)
    assert r.status_code == 422 and "link" in r.json()["detail"]


# ---- sizes ------------------------------------------------------------------------------------------------------------
def test_a_volume_refuses_bytes_past_its_size(api: TestClient) -> None:
    t = signup(api, "a@example.com")
    create(api, t, size="1Mi")
    assert put(api, t, "data", "a", b"x" * (600 << 10)).status_code == 200
    r = put(api, t, "data", "b", b"x" * (600 << 10))
    assert r.status_code == 507 and "resize" in r.json()["detail"]
    r = api.put(f"{API}/volumes/data/tree", content=tar({"c": b"y" * (600 << 10)}), headers=t.headers)
    assert r.status_code == 507
    r = api.patch(f"{API}/volumes/data", json={"size": "1Mi"}, headers=t.headers)
    assert r.status_code == 200
    assert api.patch(f"{API}/volumes/data", json={"size": "1Ki"}, headers=t.headers).status_code == 422
    r = api.patch(f"{API}/volumes/data", json={"size": "2Mi"}, headers=t.headers)
    assert r.status_code == 200 and put(api, t, "data", "b", b"x" * (600 << 10)).status_code == 200


def test_an_oversized_body_is_refused_at_the_edge(api: TestClient) -> None:
    t = signup(api, "a@example.com")
    create(api, t, size="64Mi")
    r = put(api, t, "data", "big", b"\0" * (65 * MiB))
    assert r.status_code in (413, 507), r.text


# ---- copying ----------------------------------------------------------------------------------------------------------
def test_a_file_resumes_and_its_checksum_is_checked(api: TestClient) -> None:
    t = signup(api, "a@example.com")
    create(api, t)
    data = os.urandom(300_000)
    sha = hashlib.sha256(data).hexdigest()
    r = put(api, t, "data", "f.bin", data, sha256="0" * 64)
    assert r.status_code == 422 and "sha256" in r.json()["detail"]
    assert get(api, t, "data", "f.bin").status_code == 422  # nothing replaced
    # A first part arrives, the connection breaks (simulated: the part is its own request) …
    w = api.app.state.server.settings  # type: ignore[attr-defined]
    assert w is not None
    from suanli.storage import volume_io as vio
    from suanli.storage import volumes as store

    vol = api.get(f"{API}/volumes/data", headers=t.headers).json()
    p = store.paths(root(api), vol["org_id"], vol["id"], None)
    vio.partial_path(p, "f.bin").write_bytes(data[:100_000])
    r = api.get(f"{API}/volumes/data/partial", params={"path": "f.bin"}, headers=t.headers)
    assert r.json()["offset"] == 100_000
    assert put(api, t, "data", "f.bin", data[200_000:], offset=200_000, sha256=sha).status_code == 422  # a gap
    r = put(api, t, "data", "f.bin", data[100_000:], offset=100_000, sha256=sha)
    assert r.status_code == 200 and r.json()["sha256"] == sha
    assert get(api, t, "data", "f.bin").content == data
    r = get(api, t, "data", "f.bin", Range="bytes=250000-")
    assert r.status_code == 206 and r.content == data[250_000:]
    assert get(api, t, "data", "f.bin", Range="bytes=999999999-").status_code == 416
    r = api.get(f"{API}/volumes/data/stat", params={"path": "f.bin", "sha256": True}, headers=t.headers)
    assert r.json() == {"path": "f.bin", "kind": "file", "size": len(data), "sha256": sha}


def test_a_held_upload_moves_in_only_with_the_hash_it_was_received_with(api: TestClient) -> None:
    """The SDK hashes while it sends: the file waits beside the tree until the commit names the same hash."""
    t = signup(api, "a@example.com")
    vol = create(api, t).json()
    data = os.urandom(200_000)
    sha = hashlib.sha256(data).hexdigest()
    commit = f"{API}/volumes/data/commit"
    r = api.post(commit, params={"path": "f.bin", "sha256": sha}, headers=t.headers)
    assert r.status_code == 422 and "no whole upload" in r.json()["detail"]  # nothing was sent
    r = put(api, t, "data", "f.bin", data, hold="true")
    assert r.status_code == 200 and r.json()["sha256"] == sha
    assert get(api, t, "data", "f.bin").status_code == 422  # held: not in the tree yet
    r = api.post(commit, params={"path": "f.bin", "sha256": "0" * 64}, headers=t.headers)
    assert r.status_code == 422 and sha in r.json()["detail"]  # another hash: dropped, never moved in
    assert get(api, t, "data", "f.bin").status_code == 422
    assert api.post(commit, params={"path": "f.bin", "sha256": sha}, headers=t.headers).status_code == 422
    assert put(api, t, "data", "f.bin", data, hold="true").status_code == 200
    r = api.post(commit, params={"path": "f.bin", "sha256": sha}, headers=t.headers)
    assert r.status_code == 200 and r.json()["bytes"] == len(data)
    assert get(api, t, "data", "f.bin").content == data
    # The hash it came in with is remembered while the file is unchanged; a workload's change is read again.
    stat = {"path": "f.bin", "sha256": True}
    assert api.get(f"{API}/volumes/data/stat", params=stat, headers=t.headers).json()["sha256"] == sha
    (live(api, vol) / "f.bin").write_bytes(b"changed")
    got = api.get(f"{API}/volumes/data/stat", params=stat, headers=t.headers).json()["sha256"]
    assert got == hashlib.sha256(b"changed").hexdigest()


def test_the_file_count_and_usage_are_current_after_each_copy_and_removal(api: TestClient) -> None:
    """Not only after the next sweep: `ls` and `describe` show what the API just did."""
    t = signup(api, "a@example.com")
    create(api, t)

    def shown() -> tuple[int, int]:
        v = api.get(f"{API}/volumes/data", headers=t.headers).json()
        return v["files"], v["used_bytes"]

    assert shown() == (0, 0)
    assert put(api, t, "data", "a.bin", b"a" * 5000).status_code == 200
    assert shown() == (1, 8192)
    assert put(api, t, "data", "x/b.bin", b"b").status_code == 200  # a directory and a file
    assert shown() == (3, 8192 + 4096 + 4096)
    assert put(api, t, "data", "a.bin", b"a").status_code == 200  # replaced, smaller
    assert shown() == (3, 3 * 4096)
    data = b"c" * 10
    assert put(api, t, "data", "c.bin", data, hold="true").status_code == 200
    assert shown() == (3, 3 * 4096)  # held aside: not in the tree yet
    sha = hashlib.sha256(data).hexdigest()
    assert api.post(f"{API}/volumes/data/commit", params={"path": "c.bin", "sha256": sha},
                    headers=t.headers).status_code == 200  # fmt: skip
    assert shown() == (4, 4 * 4096)
    assert api.delete(f"{API}/volumes/data/files", params={"path": "x"}, headers=t.headers).status_code == 204
    assert shown() == (2, 2 * 4096)


def test_a_tree_goes_in_and_out_as_a_checked_tar(api: TestClient) -> None:
    t = signup(api, "a@example.com")
    create(api, t)
    files = {f"d/{i}.txt": f"file {i}".encode() for i in range(50)}
    body = tar(files)
    r = api.put(f"{API}/volumes/data/tree", params={"path": "in", "sha256": "1" * 64}, content=body, headers=t.headers)
    assert r.status_code == 422
    assert api.get(f"{API}/volumes/data/ls", headers=t.headers).json() == []  # nothing moved in
    sha = hashlib.sha256(body).hexdigest()
    r = api.put(f"{API}/volumes/data/tree", params={"path": "in", "sha256": sha}, content=body, headers=t.headers)
    assert r.status_code == 200 and r.json()["sha256"] == sha, r.text
    names = [e["name"] for e in api.get(f"{API}/volumes/data/ls", params={"path": "in/d"}, headers=t.headers).json()]
    assert len(names) == 50
    r = api.get(f"{API}/volumes/data/tree", params={"path": "in"}, headers=t.headers)
    with tarfile.open(fileobj=io.BytesIO(r.content)) as got:
        back = {m.name: got.extractfile(m).read() for m in got.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert back == files
    assert api.get(f"{API}/volumes/data", headers=t.headers).json()["files"] == 52


# ---- versions ---------------------------------------------------------------------------------------------------------
def test_versions_store_unchanged_files_once_and_restore_clone_diff(api: TestClient) -> None:
    t = signup(api, "a@example.com")
    create(api, t)
    big = os.urandom(1 * MiB)
    assert put(api, t, "data", "big.bin", big).status_code == 200
    assert put(api, t, "data", "small.txt", b"v1").status_code == 200
    v1 = api.post(f"{API}/volumes/data/versions", json={"message": "first"}, headers=t.headers).json()
    assert v1["number"] == 1 and v1["added_bytes"] == len(big) + 2
    assert put(api, t, "data", "small.txt", b"v2").status_code == 200
    assert put(api, t, "data", "new.txt", b"new").status_code == 200
    v2 = api.post(f"{API}/volumes/data/versions", json={}, headers=t.headers).json()
    assert v2["number"] == 2 and v2["added_bytes"] == 5  # big.bin is not stored again
    r = api.get(f"{API}/volumes/data/diff", params={"from": 1, "to": 2}, headers=t.headers)
    assert r.json() == {"added": ["new.txt"], "removed": [], "changed": ["small.txt"]}
    assert len(api.get(f"{API}/volumes/data/versions", headers=t.headers).json()) == 2
    r = api.post(f"{API}/volumes/data/clone", json={"version": 1, "name": "exp"}, headers=t.headers)
    assert r.status_code == 201, r.text
    assert get(api, t, "exp", "small.txt").content == b"v1" and get(api, t, "exp", "new.txt").status_code == 422
    assert api.post(f"{API}/volumes/data/restore", json={"version": 1}, headers=t.headers).status_code == 200
    assert get(api, t, "data", "small.txt").content == b"v1" and get(api, t, "data", "big.bin").content == big
    assert api.post(f"{API}/volumes/data/restore", json={"version": 9}, headers=t.headers).status_code == 404
    assert api.post(f"{API}/volumes/data/restore", json={"version": 0}, headers=t.headers).status_code == 422
    # The blob store holds each content once across both volumes' versions.
    vol = api.get(f"{API}/volumes/data", headers=t.headers).json()
    blobs = [p for p in (root(api) / vol["org_id"] / "blobs").rglob("*") if p.is_file() and p.name != ".lock"]
    assert sorted(p.stat().st_size for p in blobs) == sorted([len(big), 2, 2, 3])
    # Removing a volume removes its blobs that no other version names.
    assert api.delete(f"{API}/volumes/exp", headers=t.headers).status_code == 204
    assert api.delete(f"{API}/volumes/data", headers=t.headers).status_code == 204
    assert [p for p in (root(api) / vol["org_id"] / "blobs").rglob("*") if p.is_file() and p.name != ".lock"] == []


# ---- mounting ---------------------------------------------------------------------------------------------------------
def test_a_mounted_volume_is_not_removed_and_the_spec_is_checked(api: TestClient) -> None:
    t, other = signup(api, "a@example.com"), signup(api, "b@example.com")
    create(api, t)
    create(api, other, "theirs")
    job = {"name": "train", "command": "sleep 60", "resources": {"gpus": 0},
           "volumes": [{"name": "data", "path": "/data"}]}  # fmt: skip
    for bad, field in (
        ({"name": "theirs", "path": "/x"}, "volumes.0.name"),
        ({"name": "data@3", "path": "/x"}, "volumes.0.name"),
        ({"name": "data", "path": "/etc"}, "volumes.0.path"),
        ({"name": "data", "path": "/data/../etc"}, "volumes.0.path"),
        ({"name": "data", "path": "relative"}, "volumes.0.path"),
    ):
        r = api.post(f"{API}/workloads", json={"spec": {**job, "volumes": [bad]}}, headers=t.headers)
        assert r.status_code in (404, 422) and field in r.json()["detail"], r.text
    r = api.post(f"{API}/workloads", json={"spec": job}, headers=t.headers)
    assert r.status_code == 201, r.text
    r = api.delete(f"{API}/volumes/data", headers=t.headers)
    assert r.status_code == 409 and "train" in r.json()["detail"]
    assert api.get(f"{API}/volumes/data", headers=t.headers).json()["mounted_by"] == ["train"]

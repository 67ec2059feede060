"""Names that are not UTF-8 and ranges past the end, attacks first: a tar entry whose name is not UTF-8 is refused
(on an s3 volume it made every storage sweep fail, so no volume of anyone was billed); a name a workload wrote that
is not UTF-8 is listed and diffed, shown with its bytes escaped, not a 500; the storage sweep charges volumes even
when a step before it fails; and a range that starts at a file's end is 416, as RFC 9110 says."""

from __future__ import annotations

import io
import os
import tarfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from suanli.db.volumes import Volume
from tests.control_plane import Tenant, admin_token, bearer, signup

API = "/api/v1"
MiB = 1 << 20


@pytest.fixture(name="api")
def volumes_api(db_url: str, tmp_path: Path, cheap_password_hashing: None) -> Iterator[TestClient]:
    """A server whose volumes may be up to 64 MiB, with this host as a cluster."""
    from suanli.api.app import create_app
    from tests.control_plane import settings

    with TestClient(create_app(settings(tmp_path / "home", db_url, volume_max_bytes=64 * MiB))) as client:
        r = client.post(f"{API}/admin/clusters", json={"local": True, "name": "this-host"},
                        headers=bearer(admin_token(client)))  # fmt: skip
        assert r.status_code == 201, r.text
        yield client


def _volume(api: TestClient, who: Tenant, name: str = "data") -> Any:
    r = api.post(f"{API}/volumes", json={"name": name, "size": "8Mi"}, headers=who.headers)
    assert r.status_code == 201, r.text
    return r.json()


def _live(api: TestClient, vol: Any) -> Path:
    return api.app.state.server.settings.volumes_root / vol["org_id"] / "vols" / vol["id"] / "data"  # type: ignore[attr-defined]


def _plant(api: TestClient, vol: Any) -> bytes:
    """What a workload may write: a file whose name is the byte 0xff, then `.bin`."""
    name = os.fsencode(str(_live(api, vol))) + b"/\xff.bin"
    fd = os.open(name, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"x")
    os.close(fd)
    return name


def test_a_tar_entry_whose_name_is_not_utf8_is_refused_naming_it(api: TestClient) -> None:
    t = signup(api, "tar@example.com")
    vol = _volume(api, t)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name in ("ok.txt", "\udcff.bin"):  # ustar keeps the raw byte 0xff
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    r = api.put(f"{API}/volumes/data/tree", params={"path": ""}, content=buf.getvalue(), headers=t.headers)
    assert r.status_code == 422 and "UTF-8" in r.json()["detail"], r.text
    assert os.listdir(_live(api, vol)) == []  # nothing of it lands


def test_a_name_a_workload_wrote_that_is_not_utf8_is_listed_and_diffed(api: TestClient) -> None:
    t = signup(api, "names@example.com")
    vol = _volume(api, t)
    assert api.put(f"{API}/volumes/data/files", params={"path": "ok.txt"}, content=b"fine", headers=t.headers).status_code == 200  # fmt: skip
    planted = _plant(api, vol)
    r = api.get(f"{API}/volumes/data/ls", params={"path": ""}, headers=t.headers)
    assert r.status_code == 200, r.text
    assert sorted(e["name"] for e in r.json()) == ["\\xff.bin", "ok.txt"]  # the byte escaped, as Python shows it
    assert api.post(f"{API}/volumes/data/versions", json={}, headers=t.headers).status_code == 201
    os.unlink(planted)
    assert api.post(f"{API}/volumes/data/versions", json={}, headers=t.headers).status_code == 201
    r = api.get(f"{API}/volumes/data/diff", params={"from": 1, "to": 2}, headers=t.headers)
    assert r.status_code == 200 and r.json()["removed"] == ["\\xff.bin"], r.text


def test_the_sweep_charges_volumes_when_a_step_before_it_fails(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One tenant's tree that the s3 push cannot handle must not stop every volume's billing."""
    from suanli.control import background
    from suanli.control.background import StorageLoop

    srv = api.app.state.server  # type: ignore[attr-defined]
    t = signup(api, "billed@example.com")
    vol = _volume(api, t)
    with srv.db.write() as s, s.begin():
        row = s.get(Volume, vol["id"])
        row.billed_until -= timedelta(hours=3)
        behind = row.billed_until

    def broken(*a: Any, **k: Any) -> int:
        raise UnicodeEncodeError("utf-8", "\udcff", 0, 1, "surrogates not allowed")

    monkeypatch.setattr(background.volume_files, "push_idle", broken)
    monkeypatch.setattr(background.volume_files, "measure_mounted", broken)
    StorageLoop(srv.db, srv.settings, "probe").tick()
    with srv.db.read() as s:
        assert s.get(Volume, vol["id"]).billed_until >= behind + timedelta(hours=3)


@pytest.mark.parametrize(("size", "header"), [(4, "bytes=4-"), (4, "bytes=4-9"), (0, "bytes=0-"), (4, "bytes=5-")])
def test_a_range_from_the_end_of_the_file_is_416(api: TestClient, size: int, header: str) -> None:
    t = signup(api, "ranges@example.com")
    _volume(api, t)
    assert api.put(f"{API}/volumes/data/files", params={"path": "f"}, content=b"a" * size, headers=t.headers).status_code == 200  # fmt: skip
    r = api.get(f"{API}/volumes/data/files", params={"path": "f"}, headers={**t.headers, "Range": header})
    assert r.status_code == 416 and r.headers["content-range"] == f"bytes */{size}", (r.status_code, r.headers)
    r = api.get(f"{API}/volumes/data/files", params={"path": "f"}, headers={**t.headers, "Range": "bytes=1-"})
    if size:
        assert r.status_code == 206 and r.headers["content-range"] == f"bytes 1-{size - 1}/{size}"


def _partial_bytes(api: TestClient, vol: Any) -> int:
    d = _live(api, vol).parent / "partial"
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file())


def test_held_and_broken_uploads_hold_at_most_the_volumes_size_and_expire(api: TestClient) -> None:
    """Uploads held for a commit (or broken off, kept to resume) live beside the tree: they were counted nowhere,
    so eight held 900 KiB uploads sat in a 1 MiB volume, and any number could. Now what waits there stays within the
    volume's size, and the storage sweep removes what has waited a day."""
    from suanli.control.background import StorageLoop

    t = signup(api, "held@example.com")
    r = api.post(f"{API}/volumes", json={"name": "small", "size": "1Mi"}, headers=t.headers)
    vol = r.json()
    codes = [api.put(f"{API}/volumes/small/files", params={"path": f"f{i}", "hold": "true"}, content=b"x" * (900 << 10),
                     headers=t.headers).status_code for i in range(8)]  # fmt: skip
    assert codes[0] == 200 and set(codes[1:]) == {507}, codes
    assert _partial_bytes(api, vol) <= 1 * MiB
    r = api.put(f"{API}/volumes/small/files", params={"path": "f0", "offset": 0, "hold": "true"},
                content=b"y" * (900 << 10), headers=t.headers)  # fmt: skip
    assert r.status_code == 200, r.text  # the same path sent again replaces its own held copy
    old = time.time() - 2 * 86400
    for f in (_live(api, vol).parent / "partial").iterdir():
        os.utime(f, (old, old))
    srv = api.app.state.server  # type: ignore[attr-defined]
    StorageLoop(srv.db, srv.settings, "sweep").tick()
    assert _partial_bytes(api, vol) == 0
    assert api.put(f"{API}/volumes/small/files", params={"path": "g", "hold": "true"}, content=b"z" * (900 << 10),
                   headers=t.headers).status_code == 200  # fmt: skip


def test_a_second_upload_of_a_path_never_empties_the_first_ones_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second upload opened the partial copy for writing, which emptied it, before it found the first one's
    lock: the first then placed an empty file under the hash of what it received."""
    import hashlib

    from suanli.storage import volume_io as vio
    from suanli.storage import volumes as store
    from suanli.storage.volume_room import Claim

    p = store.paths(tmp_path / "vols", "org_1", "vol_1", 1 << 28)
    store.create(p)
    data = os.urandom(1 << 20)
    a = vio.Writer(p, "f.bin", 0, Claim(p, 8 * MiB))
    a.room.measured(0)
    a.write_all([data])
    a.f.flush()
    monkeypatch.setattr(vio, "partial_size", lambda *_: 0)  # as if its size was read before the first bytes landed
    claim = Claim(p, 8 * MiB)
    claim.measured(0)
    with pytest.raises(vio.Busy):
        vio.Writer(p, "f.bin", 0, claim)
    a.finish(hashlib.sha256(data).hexdigest())
    assert (p.data / "f.bin").read_bytes() == data


def test_the_sweep_keeps_what_an_upload_under_way_is_writing(tmp_path: Path) -> None:
    from suanli.storage import volume_io as vio
    from suanli.storage import volumes as store
    from suanli.storage.volume_room import Claim

    p = store.paths(tmp_path / "vols", "org_1", "vol_1", 1 << 28)
    store.create(p)
    old = time.time() - 2 * 86400
    scratch = p.partial / "tar-abc"  # a tar being unpacked: its scratch directory is old, its newest file is not
    (scratch / "t" / "deep").mkdir(parents=True)
    (scratch / "t" / "deep" / "f").write_bytes(b"x")
    os.utime(scratch, (old, old))
    w = vio.Writer(p, "slow.bin", 0, Claim(p, 8 * MiB))  # an upload whose client is slow: it holds the lock
    w.room.measured(0)
    w.write_all([b"y" * 10])
    w.f.flush()
    os.utime(vio.partial_path(p, "slow.bin"), (old, old))
    assert vio.expire_partial(p, time.time()) == 0
    w.abort()
    assert vio.expire_partial(p, time.time()) == 1  # left alone now and a day old: dropped

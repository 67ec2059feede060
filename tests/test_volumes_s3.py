"""The S3 volume backend against a real S3 HTTP server (moto's server mode, as s3fs's own tests use), on both
databases: pushes and pulls keep the bucket and the working copy in step, copies in reach the bucket, a job's
writes reach it after the job, a fresh working copy is pulled before a launch, and the operator's credentials never
reach a tenant."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

from suanli.storage import volumes as store  # noqa: E402
from suanli.storage.s3 import S3Backend, S3Config  # noqa: E402

KEY, SECRET = "operator-key-id", "operator-secret-do-not-leak"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def config(endpoint: str, tmp_path: Path) -> S3Config:
    bucket = f"vols-{os.urandom(4).hex()}"
    cfg = S3Config(bucket, "suanli/", endpoint, KEY, SECRET)
    cfg.filesystem().mkdir(bucket)
    return cfg


def test_push_and_pull_keep_the_bucket_and_the_working_copy_in_step(config: S3Config, tmp_path: Path) -> None:
    b = S3Backend(config)
    p = store.paths(tmp_path / "a", "org_1", "vol_1", 1 << 28)
    store.create(p)
    (p.data / "d").mkdir()
    (p.data / "d" / "x.bin").write_bytes(os.urandom(300_000))
    (p.data / "y.txt").write_text("y")
    os.symlink("/etc/passwd", p.data / "link")  # object storage has no links: not uploaded, never read through
    r = b.push(p, "org_1", "vol_1")
    assert (r.uploaded, r.deleted) == (2, 0)
    assert b.push(p, "org_1", "vol_1").uploaded == 0  # unchanged: nothing sent again
    assert sorted(b._objects(b.remote("org_1", "vol_1"))) == ["d/x.bin", "y.txt"]
    # Another server (a fresh working copy) pulls the bucket's copy.
    q = store.paths(tmp_path / "b", "org_1", "vol_1", 1 << 28)
    store.create(q)
    assert b.pull(q, "org_1", "vol_1").downloaded == 2
    assert (q.data / "d" / "x.bin").read_bytes() == (p.data / "d" / "x.bin").read_bytes()
    # A file removed on one side is removed in the bucket at the next push, and from the other copy at its pull.
    (p.data / "y.txt").unlink()
    assert b.push(p, "org_1", "vol_1").deleted == 1
    assert b.pull(q, "org_1", "vol_1").deleted == 1 and not (q.data / "y.txt").exists()
    b.destroy("org_1", "vol_1")
    assert b._objects(b.remote("org_1", "vol_1")) == {}


@pytest.fixture
def api(db_url: str, tmp_path: Path, config: S3Config, cheap_password_hashing: None) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from suanli.api.app import create_app
    from tests.control_plane import admin_token, bearer, settings

    s = settings(tmp_path / "home", db_url, volume_s3_bucket=config.bucket, volume_s3_prefix=config.prefix,
                 volume_s3_endpoint=config.endpoint, volume_s3_key_id=KEY, volume_s3_secret=SECRET,
                 )  # fmt: skip
    with TestClient(create_app(s)) as client:
        r = client.post("/api/v1/admin/clusters", json={"local": True, "name": "this-host"},
                        headers=bearer(admin_token(client)))  # fmt: skip
        assert r.status_code == 201, r.text
        yield client


def test_copies_in_reach_the_bucket_and_the_credentials_never_reach_a_tenant(api: Any, config: S3Config) -> None:
    from tests.control_plane import signup

    t = signup(api, "s3@example.com")
    r = api.post("/api/v1/volumes", json={"name": "data", "size": "64Mi", "backend": "s3"}, headers=t.headers)
    assert r.status_code == 201 and r.json()["backend"] == "s3", r.text
    vol = r.json()
    assert api.put("/api/v1/volumes/data/files", params={"path": "a/b.txt"}, content=b"hello s3",
                   headers=t.headers).status_code == 200  # fmt: skip
    fs = config.filesystem()
    assert fs.cat(f"{config.bucket}/{config.prefix}{vol['org_id']}/{vol['id']}/a/b.txt") == b"hello s3"
    seen = [api.get(path, headers=t.headers).text for path in
            ("/api/v1/volumes", "/api/v1/volumes/data", "/api/v1/me", "/openapi.json")]  # fmt: skip
    for text in seen:
        assert SECRET not in text and KEY not in text and config.endpoint not in text
    assert api.delete("/api/v1/volumes/data", headers=t.headers).status_code == 204
    assert not fs.exists(f"{config.bucket}/{config.prefix}{vol['org_id']}/{vol['id']}/a/b.txt")


def test_a_job_gets_the_bucket_copy_before_it_starts_and_its_writes_reach_the_bucket(
    db_url: str, tmp_path: Path, config: S3Config
) -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    from suanli.control.storage import volume_files
    from suanli.db.engine import Database
    from tests.control_plane import live_server
    from tests.test_workloads_e2e import FAST, TERMINAL, Api

    env = {**FAST, "SUANLI_VOLUME_S3_BUCKET": config.bucket, "SUANLI_VOLUME_S3_PREFIX": config.prefix,
           "SUANLI_VOLUME_S3_ENDPOINT": str(config.endpoint), "SUANLI_VOLUME_S3_KEY_ID": KEY,
           "SUANLI_VOLUME_S3_SECRET": SECRET}  # fmt: skip
    with live_server(tmp_path / "home", db_url, env=env) as srv:
        api = Api(srv)
        api.setup()
        r = api.http.post("/api/v1/volumes", json={"name": "data", "size": "64Mi", "backend": "s3"},
                          headers=api.tenant.headers)  # fmt: skip
        assert r.status_code == 201, r.text
        vol = r.json()
        remote = f"{config.bucket}/{config.prefix}{vol['org_id']}/{vol['id']}"
        fs = config.filesystem()
        fs.pipe(f"{remote}/in.txt", b"from the bucket")  # put there by another server: this working copy lacks it
        wid = api.submit({"name": "s3job", "command": "cat /data/in.txt > /data/out.txt", "resources": {"gpus": 0},
                          "volumes": [{"name": "data", "path": "/data"}]})  # fmt: skip
        w = api.until(wid, lambda w: w["state"] in TERMINAL, timeout=90)
        assert w["state"] == "succeeded", (w["reason"], api.logs(wid))
        db = Database(db_url)
        try:  # what the storage sweep does every minute, now
            assert volume_files.push_idle(db, srv.home / "volumes", config) == 1
        finally:
            db.dispose()
        assert fs.cat(f"{remote}/out.txt") == b"from the bucket"

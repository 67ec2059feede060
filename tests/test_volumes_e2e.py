"""Volumes mounted into real sandboxed jobs on the local executor of a real server process, on both databases: a
job writes to a volume another job reads at the same time, a read-only mount and a version (`name@N`) refuse
writes inside the sandbox, and what a job wrote comes back out through the API."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.control_plane import live_server
from tests.test_workloads_e2e import FAST, TERMINAL, Api

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

WRITE = """\
import os
print("in:", open("/data/in.txt").read(), flush=True)
open("/data/out.txt", "w").write("written by the job")
for path in ("/v1/x", "/ro/x"):
    try:
        open(path, "w").write("x")
        print(path, "WRITABLE", flush=True)
    except OSError as e:
        print(path, "refused", e.errno, flush=True)
print("v1:", open("/v1/in.txt").read(), flush=True)
"""


def test_jobs_mount_volumes_read_write_read_only_and_versions(tmp_path: Path, db_url: str) -> None:
    with live_server(tmp_path / "home", db_url, env=FAST) as srv:
        api = Api(srv)
        api.setup()
        h, http = api.tenant.headers, api.http
        assert http.post("/api/v1/volumes", json={"name": "data", "size": "64Mi"}, headers=h).status_code == 201
        r = http.put("/api/v1/volumes/data/files", params={"path": "in.txt"}, content=b"version one", headers=h)
        assert r.status_code == 200, r.text
        assert http.post("/api/v1/volumes/data/versions", json={"message": "v1"}, headers=h).status_code == 201
        r = http.put("/api/v1/volumes/data/files", params={"path": "in.txt"}, content=b"live", headers=h)
        assert r.status_code == 200
        job = {"name": "writer", "command": "python3 w.py", "resources": {"gpus": 0},
               "volumes": [{"name": "data", "path": "/data"}, {"name": "data@1", "path": "/v1"},
                           {"name": "data", "path": "/ro", "read_only": True}]}  # fmt: skip
        from tests.test_workloads_api import archive

        wid = api.submit(job, workdir_archive=archive({"w.py": WRITE}))
        reader = api.submit({"name": "reader", "command": "sleep 1; cat /data/in.txt; ls /data",
                             "resources": {"gpus": 0}, "volumes": [{"name": "data", "path": "/data",
                                                                    "read_only": True}]})  # fmt: skip
        w = api.until(wid, lambda w: w["state"] in TERMINAL, timeout=90)
        logs = api.logs(wid)
        assert w["state"] == "succeeded", (w["reason"], logs)
        assert "in: live" in logs and "v1: version one" in logs, logs
        assert "/v1/x refused 30" in logs and "/ro/x refused 30" in logs, logs  # EROFS inside the sandbox
        r = http.get("/api/v1/volumes/data/files", params={"path": "out.txt"}, headers=h)
        assert r.content == b"written by the job"
        rd = api.until(reader, lambda w: w["state"] in TERMINAL, timeout=90)
        assert rd["state"] == "succeeded" and "live" in api.logs(reader)
        # Nothing else of the server's volumes is inside: the sandbox sees this volume only.
        assert http.delete("/api/v1/volumes/data", headers=h).status_code == 204


FILL = """\
import os, time
open("/data/big", "wb").write(b"x" * (2 << 20))
print("filled", flush=True)
for i in range(600):
    try:
        with open(f"/data/more-{i}", "w") as f:
            f.write("y")
    except OSError as e:
        print("refused", e.errno, flush=True)
        raise SystemExit(0)
    time.sleep(0.1)
print("never refused", flush=True)
raise SystemExit(1)
"""


def test_writes_past_the_size_fail_inside_a_running_workload(tmp_path: Path, db_url: str) -> None:
    import os
    import time

    from suanli.control.ids import utcnow
    from suanli.control.storage import volume_files
    from suanli.db.engine import Database
    from tests.test_workloads_api import archive

    if os.geteuid() != 0:
        pytest.skip("turning a live sandbox's mount read-only needs a root server")
    with live_server(tmp_path / "home", db_url, env=FAST) as srv:
        api = Api(srv)
        api.setup()
        h = api.tenant.headers
        assert api.http.post("/api/v1/volumes", json={"name": "small", "size": "1Mi"}, headers=h).status_code == 201
        wid = api.submit({"name": "filler", "command": "python3 fill.py", "resources": {"gpus": 0},
                          "volumes": [{"name": "small", "path": "/data"}]},
                         workdir_archive=archive({"fill.py": FILL}))  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = api.http.get(f"/api/v1/workloads/{wid}/logs", headers=h).json()
            if "filled" in got["data"]:
                break
            time.sleep(0.2)
        db = Database(db_url)
        try:  # what the storage sweep does every minute, now
            assert volume_files.measure_mounted(db, srv.home / "volumes", utcnow(), home=srv.home) == 1
        finally:
            db.dispose()
        w = api.until(wid, lambda w: w["state"] in TERMINAL, timeout=60)
        logs = api.logs(wid)
        assert w["state"] == "succeeded" and "refused 30" in logs, logs  # EROFS inside the sandbox
        v = api.http.get("/api/v1/volumes/small", headers=h).json()
        assert v["state"] == "full" and v["used_bytes"] > 1 << 20

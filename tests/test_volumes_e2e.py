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

"""Tenant work is not sent to a Ray cluster that lets a driver in without its token (found by a hostile review).

Ranks share their node's network (NCCL needs it), and on a cluster started without token authentication (Ray's
default) Ray's job API, client server and GCS there run whatever a driver sends as the Ray user, outside every
sandbox: a sandboxed rank posted a job to the dashboard on 127.0.0.1 and read a root-only file as root. The executor
now asks first, as a driver with no token would (`ray_connect.require_token`), and refuses an open cluster.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from suanli.executors.base import Launch, NodeRank, SandboxRequest
from suanli.executors.ray_connect import OpenCluster, require_token
from tests.ray_cluster import RayCluster
from tests.ray_cluster import ray_cluster_fixture as ray_cluster  # noqa: F401

pytestmark = pytest.mark.ray

TENANT_UID = 0x10000123

ESCAPE = r"""
/usr/bin/python3 - <<'PY'
import json, os, urllib.request
url = f"http://127.0.0.1:{os.environ['DASH']}/api/jobs/"
body = json.dumps({"entrypoint": "id > " + os.environ["MARK"] + "; head -c 64 " + os.environ["SECRET"] + " >> " + os.environ["MARK"]}).encode()
req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
print("submitted:", urllib.request.urlopen(req, timeout=20).read().decode(), flush=True)
PY
sleep 20
"""


@pytest.fixture(scope="module")
def open_cluster():
    from tests.ray_cluster import RayCluster, ray_unavailable_reason

    if ray_unavailable_reason():
        pytest.skip(ray_unavailable_reason())

    class NoAuth(RayCluster):
        """The cluster as `ray start` makes it when the operator does not turn token auth on (Ray's default)."""

        def driver_env(self) -> dict[str, str]:
            env = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": self.address}
            if self.dashboard_url:
                env["RAY_API_SERVER_ADDRESS"] = self.dashboard_url
            return env

    cluster = NoAuth.start(workers=(), dashboard=True)
    try:  # this process's own Ray settings and driver are left alone: the executor never connects to this cluster
        yield cluster
    finally:
        cluster.stop()


def test_a_cluster_that_requires_its_token_passes_the_check(ray_cluster: RayCluster) -> None:  # noqa: F811
    require_token(ray_cluster.address)


def test_an_open_cluster_gets_no_tenant_work(open_cluster: RayCluster, tmp_path: Path) -> None:
    """The escape a rank tried there (a job posted to the dashboard, reading a root-only file) never runs: the
    launch is refused, naming token authentication, before anything reaches the cluster."""
    from suanli.executors.ray_executor import RayExecutor

    cluster = open_cluster
    ex = RayExecutor(cluster.address, node_root=str(cluster.temp_dir / "nodes"), ready_timeout_s=60)
    secret = tmp_path / "server-secret"
    secret.write_text("SERVER-TOKEN-sl_0123456789abcdef\n")
    secret.chmod(0o600)
    mark = tmp_path / "escaped"
    dash = cluster.dashboard_url.rsplit(":", 1)[1]
    ip = cluster.address.rsplit(":", 1)[0]
    ranks = (NodeRank("head", 0, (), cluster.node("head").node_id, ip),)
    workdir, log_dir = tmp_path / "work", tmp_path / "logs"
    workdir.mkdir()
    launch = Launch(workload_id=f"wl-{uuid.uuid4().hex[:8]}", attempt=1, command=ESCAPE, workdir=workdir,
                    env={"DASH": dash, "MARK": str(mark), "SECRET": str(secret)}, ranks=ranks, log_dir=log_dir,
                    grace_s=2.0, sandbox=SandboxRequest(uid=TENANT_UID, gid=TENANT_UID, network="host"))  # fmt: skip
    with pytest.raises(OpenCluster, match="RAY_AUTH_MODE=token"):
        ex.launch(launch, time.time())
    with pytest.raises(OpenCluster):  # asked again only after RECHECK_S: refused at once
        ex.launch(launch, time.time())
    time.sleep(2)
    assert not mark.exists()

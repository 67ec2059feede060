"""suanli on a real Ray cluster, end to end: `suanli server --ray ADDRESS` on the session's one-host cluster of
tests/ray_cluster.py (a head and 3 nodes of 8 fake GPUs, labelled with their leaf). Ray's nodes and labels become
a suanli cluster; a tenant's 2-node torch.distributed job is placed by suanli's scheduler and carried out by one
placement group pinned to the nodes it chose (Ray's own record of where each rank's actor ran is checked); it is
charged by the second; stop ends it; a node killed mid-run sends the job elsewhere within 30 s with the tenant
credited; a server killed with SIGKILL and started again finds its running job by the actors' names.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from tests.control_plane import LiveServer, Tenant, admin_token, bearer, live_server, signup
from tests.engines_e2e import (
    HOLD,
    check_charged_by_the_second,
    check_node_kill,
    check_server_kill,
    engine_nodes,
    gloo_spec,
    logs,
    nodes_of,
    rank_lines,
    submit,
    wait_for,
    workload,
)
from tests.ray_cluster import RayCluster, actor_nodes, ray_cluster_fixture  # noqa: F401  (the session's cluster)

pytestmark = pytest.mark.ray
FAST = {"SUANLI_SCHEDULE_INTERVAL_S": "0.2", "SUANLI_METER_INTERVAL_S": "0.5", "SUANLI_STOP_GRACE_S": "2",
        "SUANLI_ENGINE_SYNC_S": "1"}  # fmt: skip


@dataclass
class World:
    ray: RayCluster
    db: str
    srv: LiveServer
    http: httpx.Client
    admin: dict[str, str]
    tenant: Tenant

    def env(self) -> dict[str, str]:
        return {**FAST, "SUANLI_RAY_ADDRESS": self.ray.address, **self.ray.driver_env()}


@pytest.fixture(scope="module")
def world(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp: Path = tmp_path_factory.mktemp("ray-e2e")
    db = f"sqlite+pysqlite:///{tmp / 'suanli.db'}"
    env = {**FAST, "SUANLI_RAY_ADDRESS": ray_cluster.address, **ray_cluster.driver_env()}
    with live_server(tmp / "home", db, env=env) as srv:
        http = httpx.Client(base_url=srv.url, timeout=30)
        adm = bearer(admin_token(http))
        wait_for("Ray's 3 GPU nodes to join", lambda: len(engine_nodes(http, adm, "ray")) == 3, timeout=90)
        tenant = signup(http, "tenant@example.com")
        r = http.post(f"/api/v1/admin/orgs/{tenant.org_id}/transactions", json={"kind": "topup", "amount": "1000"},
                      headers=adm)  # fmt: skip
        assert r.status_code == 201, r.text
        w = World(ray_cluster, db, srv, http, adm, tenant)
        yield w
        http.close()


def _actor_nodes(cluster: RayCluster, wid: str, attempt: int) -> dict[int, str]:
    """Ray's own record of the node each rank's actor of this attempt ran on: node-rank -> node id."""
    prefix = f"suanli:{wid}:a{attempt}:r"
    return {int(name[len(prefix) :]): node for name, node in actor_nodes(cluster, prefix).items()}


def test_rays_nodes_and_labels_become_a_cluster(world: World) -> None:
    nodes = {n["name"]: n for n in engine_nodes(world.http, world.admin, "ray")}
    assert sorted(nodes) == ["ray.node-1", "ray.node-2", "ray.node-3"]  # the head holds no GPUs
    assert {n["gpu_model"] for n in nodes.values()} == {"H100-SXM"} and all(n["gpu_count"] == 8 for n in nodes.values())
    assert nodes["ray.node-1"]["leaf"] == nodes["ray.node-2"]["leaf"] != nodes["ray.node-3"]["leaf"]  # the labels
    assert all(n["state"] == "ready" and n["kind"] == "ray" for n in nodes.values())
    assert {n["labels"]["engine_host"] for n in nodes.values()} == {
        world.ray.node_ids[name.removeprefix("ray.")] for name in nodes}  # fmt: skip


def test_a_two_node_gloo_job_runs_where_the_scheduler_placed_it(world: World) -> None:
    wid = submit(world, gloo_spec("gloo"))
    doc = wait_for("the job to end", lambda: (d := workload(world.http, world.tenant, wid))["state"]
                   in ("succeeded", "failed", "stopped") and d)  # fmt: skip
    assert doc["state"] == "succeeded", (doc["reason"], logs(world.http, world.tenant, wid, 0))
    placed = nodes_of(doc)
    assert len(placed) == 2
    ids = {n["name"]: n["labels"]["engine_host"] for n in engine_nodes(world.http, world.admin, "ray")}
    ran = _actor_nodes(world.ray, wid, doc["attempt"])
    assert ran == {r: ids[node] for r, node in enumerate(placed)}  # every rank on the node suanli chose, by Ray
    for rank in (0, 1):
        line = rank_lines(logs(world.http, world.tenant, wid, rank))
        assert line.get("sum") == "3" and line.get("world") == "2", line
        assert line["node"] == placed[rank]
        assert line["cuda"] == ",".join(map(str, doc["allocation"]["nodes"][placed[rank]]))  # suanli's, not Ray's
    leaves = {n["name"]: n["leaf"] for n in engine_nodes(world.http, world.admin, "ray")}
    assert len({leaves[n] for n in placed}) == 1  # both in one leaf switch: topology-aware, carried out by Ray
    assert Decimal(doc["cost"]) > 0 and doc["allocation"]["stopped_at"] is not None
    check_charged_by_the_second(world, doc)


def test_stop_ends_the_ranks(world: World) -> None:
    wid = submit(world, gloo_spec("held", command=HOLD))
    wait_for("it to run", lambda: workload(world.http, world.tenant, wid)["state"] == "running")
    r = world.http.post(f"/api/v1/workloads/{wid}/stop", headers=world.tenant.headers)
    assert r.status_code == 200, r.text
    doc = wait_for("it to stop", lambda: (d := workload(world.http, world.tenant, wid))["state"] == "stopped" and d,
                   timeout=60)  # fmt: skip
    assert "stop" in doc["reason"]


def test_a_node_killed_mid_run_sends_the_job_elsewhere_and_credits_the_tenant(world: World) -> None:
    check_node_kill(world, "ray", world.ray.kill_node, world.ray.restart_node, gpus=8)


def test_a_server_killed_mid_run_finds_its_job_again(world: World) -> None:
    world.srv = check_server_kill(world)

"""suanli on a real Slurm cluster, end to end: `suanli server --slurm` on the one-host cluster of tests/slurm_cluster.py
(slurmctld and 4 slurmd, 8 fake GPUs each, two leaf switches). Slurm's nodes and fabric become a suanli cluster; a
tenant's 2-node torch.distributed job is placed by suanli's scheduler and carried out by one `sbatch` on exactly
the nodes it chose; it is charged by the second; a node killed mid-run sends the job elsewhere within 30 s with
the tenant credited; a server killed with SIGKILL and started again finds its running job, charged exactly once.
"""

from __future__ import annotations

import json
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
from tests.slurm_cluster import SlurmCluster, require_slurm, slurm_cluster

pytestmark = pytest.mark.slurm
FAST = {"SUANLI_SCHEDULE_INTERVAL_S": "0.2", "SUANLI_METER_INTERVAL_S": "0.5", "SUANLI_STOP_GRACE_S": "2",
        "SUANLI_ENGINE_SYNC_S": "1"}  # fmt: skip


@dataclass
class World:
    slurm: SlurmCluster
    tmp: Path
    db: str
    srv: LiveServer
    http: httpx.Client
    admin: dict[str, str]
    tenant: Tenant

    def env(self) -> dict[str, str]:
        return {**FAST, "SUANLI_SLURM": "true", "SUANLI_SLURM_CONF": str(self.slurm.conf), "SLURM_CONF": str(self.slurm.conf)}  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    require_slurm()
    tmp = tmp_path_factory.mktemp("slurm-e2e")
    db = f"sqlite+pysqlite:///{tmp / 'suanli.db'}"
    with slurm_cluster() as cluster:
        env = {**FAST, "SUANLI_SLURM": "true", "SUANLI_SLURM_CONF": str(cluster.conf), "SLURM_CONF": str(cluster.conf)}
        with live_server(tmp / "home", db, env=env) as srv:
            http = httpx.Client(base_url=srv.url, timeout=30)
            adm = bearer(admin_token(http))
            wait_for("Slurm's 4 nodes to join", lambda: len(engine_nodes(http, adm, "slurm")) == 4, timeout=60)
            tenant = signup(http, "tenant@example.com")
            r = http.post(f"/api/v1/admin/orgs/{tenant.org_id}/transactions",
                          json={"kind": "topup", "amount": "1000"}, headers=adm)  # fmt: skip
            assert r.status_code == 201, r.text
            w = World(cluster, tmp, db, srv, http, adm, tenant)
            yield w
            http.close()


def test_slurms_nodes_and_fabric_become_a_cluster(world: World) -> None:
    nodes = {n["name"]: n for n in engine_nodes(world.http, world.admin, "slurm")}
    assert sorted(nodes) == [f"slurm.node{i}" for i in range(1, 5)]
    assert {n["gpu_model"] for n in nodes.values()} == {"H100-SXM"} and all(n["gpu_count"] == 8 for n in nodes.values())
    assert nodes["slurm.node1"]["leaf"] == nodes["slurm.node2"]["leaf"] != nodes["slurm.node3"]["leaf"]  # topology.conf
    assert all(n["state"] == "ready" and n["kind"] == "slurm" for n in nodes.values())


def test_a_two_node_gloo_job_runs_where_the_scheduler_placed_it(world: World) -> None:
    wid = submit(world, gloo_spec("gloo"))
    doc = wait_for("the job to end", lambda: (d := workload(world.http, world.tenant, wid))["state"]
                   in ("succeeded", "failed", "stopped") and d)  # fmt: skip
    assert doc["state"] == "succeeded", (doc["reason"], logs(world.http, world.tenant, wid, 0))
    placed = nodes_of(doc)
    assert len(placed) == 2
    ran = []
    attempt = world.srv.home / "workloads" / wid / f"attempt-{doc['attempt']}"
    for rank in (0, 1):
        line = rank_lines(logs(world.http, world.tenant, wid, rank))
        assert line.get("sum") == "3" and line.get("world") == "2", line  # 1 + 2 over both ranks
        assert line["cuda"] == ",".join(map(str, doc["allocation"]["nodes"][line["node"]]))
        # Where Slurm really ran it: slurmd's own SLURMD_NODENAME, recorded by the task srun started there.
        where = json.loads((attempt / f"rank-{rank}.slurm.json").read_text())["node"]
        assert f"slurm.{where}" == line["node"], (where, line)
        ran.append(f"slurm.{where}")
    assert sorted(ran) == sorted(placed)  # every rank on the node suanli chose, none elsewhere
    # Both nodes of one leaf switch: the topology-aware placement, carried out by Slurm.
    leaves = {n["name"]: n["leaf"] for n in engine_nodes(world.http, world.admin, "slurm")}
    assert len({leaves[n] for n in placed}) == 1
    assert Decimal(doc["cost"]) > 0 and doc["allocation"]["stopped_at"] is not None
    check_charged_by_the_second(world, doc)


def test_stop_ends_the_slurm_job(world: World) -> None:
    wid = submit(world, gloo_spec("held", command=HOLD))
    wait_for("it to run", lambda: workload(world.http, world.tenant, wid)["state"] == "running")
    job = wait_for("its Slurm job", lambda: _slurm_jobs(world.slurm, wid))
    r = world.http.post(f"/api/v1/workloads/{wid}/stop", headers=world.tenant.headers)
    assert r.status_code == 200, r.text
    doc = wait_for("it to stop", lambda: (d := workload(world.http, world.tenant, wid))["state"] == "stopped" and d,
                   timeout=60)  # fmt: skip
    assert "stop" in doc["reason"]
    wait_for("Slurm to end its job", lambda: not _slurm_jobs(world.slurm, wid, running=True), timeout=30)
    assert job


def _slurm_jobs(cluster: SlurmCluster, wid: str, running: bool = False) -> list[str]:
    states = "R,CG" if running else "PD,R,CG"
    out = cluster.run("squeue", "-h", "-t", states, "-o", "%i %j").stdout
    return [line for line in out.splitlines() if wid in line]


def test_a_node_killed_mid_run_sends_the_job_elsewhere_and_credits_the_tenant(world: World) -> None:
    check_node_kill(world, "slurm", world.slurm.kill_node, world.slurm.restart_node, gpus=16)


def test_a_server_killed_mid_run_finds_its_job_again(world: World) -> None:
    world.srv = check_server_kill(world)

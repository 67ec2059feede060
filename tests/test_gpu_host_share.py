"""GPU work that asks for no host CPU or memory is still bounded on its node: by default each rank may use its GPUs'
share of the node's cores and memory (a 2-of-4-GPU rank: half), as a cloud's GPU instance sizes do. Before, such a
rank had no CPU or memory limit at all (seen on a GPU host: `memory.max` was `max`), so one tenant's GPU job could
take a shared node's memory from its neighbours. The default only limits: nothing more is billed or reserved."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from suanli.control.ids import utcnow
from suanli.control.money import metering
from suanli.db.models import Allocation, Node
from suanli.storage import workdirs
from tests.test_resize_local import until
from tests.test_resize_virtual import API, Cluster, make_cluster

CORES, MEMORY_MIB = 16, 64 * 1024  # each node: 4 GPUs


@pytest.fixture
def local(api: TestClient) -> Cluster:
    """Two nodes of 4 fake H20s that the local executor runs on (GPUs are indices here: no device nodes)."""
    c = make_cluster(api, preset="2x4:H20")
    with c.db.write() as s, s.begin():
        s.execute(update(Node).values(kind="local"))
    return c


def _limits(c: Cluster, wid: str) -> dict[str, int]:
    """The limits rank 0's supervisor applied (its sandbox record), then the workload stopped."""
    record = workdirs.log_dir(c.sup.home, wid, 1) / "rank-0.sandbox.json"
    deadline = time.monotonic() + 30
    while not record.exists():
        assert time.monotonic() < deadline, "the sandbox did not start"
        time.sleep(0.05)
    box = json.loads(record.read_text())
    assert c.api.post(f"{API}/workloads/{wid}/stop", headers=c.tenant.headers).status_code == 200
    until(c, wid, lambda w: w["state"] == "stopped")
    return {"cpu_milli": box["cpu_milli"], "memory_mib": box["memory_mib"]}


def _run(c: Cluster, resources: dict[str, object]) -> str:
    r = c.api.post(f"{API}/workloads", headers=c.tenant.headers, json={
        "spec": {"name": "g", "command": "sleep 60", "resources": {"gpu": "H20", **resources}}})  # fmt: skip
    assert r.status_code == 201, r.text
    wid = r.json()["id"]
    until(c, wid, lambda w: w["state"] == "running")
    return wid


def test_gpu_work_without_host_asks_gets_its_gpus_share_of_the_node_and_pays_nothing_more(local: Cluster) -> None:
    c = local
    with c.db.write() as s, s.begin():
        s.execute(update(Node).values(cpu_count=CORES, memory_mib=MEMORY_MIB))
    wid = _run(c, {"gpus": 2})
    assert _limits(c, wid) == {"cpu_milli": 8000, "memory_mib": 32 * 1024}  # 2 of the node's 4 GPUs: half
    metering.meter(c.db, "test", utcnow(), window_s=60)
    with c.db.read() as s:
        alloc = s.scalars(select(Allocation).where(Allocation.workload == wid)).one()
    assert (alloc.cpu_milli, alloc.memory_mib, alloc.host_rate_per_hour) == (0, 0, Decimal(0))  # nothing billed

    asked = _run(c, {"gpus": 2, "cpus": 2, "memory": "4Gi"})  # what it asks (and pays for) is its limit
    assert _limits(c, asked) == {"cpu_milli": 2000, "memory_mib": 4096}
    half = _run(c, {"gpus": 1, "memory": "1Gi"})  # an ask of one kind leaves the other at the share
    assert _limits(c, half) == {"cpu_milli": 4000, "memory_mib": 1024}


def test_a_node_that_states_no_cores_or_memory_gives_no_default(local: Cluster) -> None:
    c = local
    with c.db.write() as s, s.begin():
        s.execute(update(Node).values(cpu_count=0, memory_mib=0))
    assert _limits(c, _run(c, {"gpus": 2})) == {"cpu_milli": 0, "memory_mib": 0}


def test_the_share_is_a_limit_only_ray_and_slurm_are_not_asked_for_it(tmp_path: Path) -> None:
    # Ray's bundles and Slurm's jobs reserve what the workload asked: asking an engine for the share as well would
    # hold a GPU job back wherever CPU-only work has taken cores the scheduler never counted for it.
    from suanli.executors.base import Launch, NodeRank, SandboxRequest
    from suanli.executors.ray_gang import bundle_for
    from suanli.executors.slurm_executor import SlurmExecutor

    rank = NodeRank("n0", 0, (0, 1))
    req = SandboxRequest(gpus_asked=2, share_cpu_milli=8000, share_memory_mib=32768)
    launch = Launch(workload_id="wl", attempt=1, command="true", workdir=tmp_path, env={}, ranks=(rank,),
                    log_dir=tmp_path, sandbox=req)  # fmt: skip
    assert bundle_for(launch, rank, 1.0) == {"CPU": 1.0, "GPU": 2.0}
    assert SlurmExecutor._needs(launch, rank) == (2, 0, 0)


def test_a_node_that_misstates_its_gpus_gives_no_share_rather_than_a_wrong_one() -> None:
    # A malformed inventory row (no GPUs, or none of one kind stated) must not turn into a limit of 0 cores (which
    # cgroups read as "no limit") or a division by zero: that node gives no default, and the least of the rest rules.
    from suanli.control.workloads.sandboxes import gpu_share_limits
    from suanli.executors.base import SandboxRequest

    req = SandboxRequest(gpus_asked=2)
    assert gpu_share_limits(req, [(16, 65536, 0)]) == req  # a node that says it has no GPUs
    both = gpu_share_limits(req, [(16, 65536, 4), (8, 65536, 4)])  # the smaller node's share, per GPU
    assert (both.share_cpu_milli, both.share_memory_mib) == (4000, 32768)
    half = gpu_share_limits(req, [(16, 0, 4)])
    assert (half.share_cpu_milli, half.share_memory_mib) == (8000, 0)
    asked = gpu_share_limits(SandboxRequest(gpus_asked=2, cpu_milli=1000, memory_mib=512), [(16, 65536, 4)])
    assert (asked.share_cpu_milli, asked.share_memory_mib) == (0, 0)  # the ask is the limit
    assert gpu_share_limits(SandboxRequest(), [(16, 65536, 4)]) == SandboxRequest()  # CPU-only work: its own default

"""Host CPU and memory on the server: a cluster spec states each node group's cores and memory, a workload asks for
`resources.cpus` and `resources.memory`, and the scheduling pass places it only where they are free."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from suanli.workloads import SpecError, parse_spec
from tests.test_workloads_api import Platform, make_platform

SPEC = {
    "name": "cpu-box",
    "node_groups": [{"name": "l40s", "count": 2, "gpu": "L40S", "gpus_per_node": 8, "cpus": 32, "memory_gib": 256}],
    "fabric": "roce-400",
}


@pytest.fixture
def platform(api: TestClient) -> Platform:
    return make_platform(api)


def boxes(platform: Platform) -> None:
    r = platform.api.post("/api/v1/admin/clusters", json={"spec": SPEC}, headers=platform.admin)
    assert r.status_code == 201, r.text


def nodes_of(w: dict[str, Any]) -> list[str]:
    return sorted(w["allocation"]["nodes"])


def job(name: str, gpus: int, **host: object) -> dict[str, Any]:
    return {"name": name, "command": "x", "duration": 600, "resources": {"gpu": "L40S", "gpus": gpus, **host}}


def test_nodes_register_the_cores_and_memory_their_group_states(platform: Platform) -> None:
    boxes(platform)
    nodes = platform.api.get("/api/v1/admin/nodes", headers=platform.admin).json()
    mine = [n for n in nodes if n["gpu_model"] == "L40S"]
    assert len(mine) == 2 and all((n["cpu_count"], n["memory_mib"]) == (32, 256 * 1024) for n in mine), mine


def test_work_goes_only_where_its_cores_and_memory_are_free(platform: Platform) -> None:
    """Two nodes of 8 GPUs and 32 cores: two 2-GPU jobs asking 24 cores each cannot share a node although its GPUs
    would fit both; a third finds no node with 24 free cores and waits, saying why, while GPUs sit free."""
    boxes(platform)
    first = platform.submit(job("first", 2, cpus=24, memory="64Gi"))
    second = platform.submit(job("second", 2, cpus=24))
    a = platform.until(first["id"], lambda w: w["state"] == "running")
    b = platform.until(second["id"], lambda w: w["state"] == "running")
    assert len(set(nodes_of(a) + nodes_of(b))) == 2
    third = platform.submit(job("third", 2, cpus=24))
    platform.tick()
    waiting = platform.get(third["id"])
    assert waiting["state"] == "pending"
    assert "24 CPUs" in waiting["pending"]["reason"] and "CPU and memory free" in waiting["pending"]["reason"]
    small = platform.submit(job("small", 2, cpus=8, memory="16Gi"))  # fits beside either
    assert platform.until(small["id"], lambda w: w["state"] == "running")["state"] == "running"


def test_what_no_node_could_ever_carry_is_refused_at_submission(platform: Platform) -> None:
    """Like more GPUs than a model has: a 422 naming the field, rather than a workload that waits forever."""
    boxes(platform)
    for extra, field, most in (({"memory": "300Gi"}, "resources.memory", 0), ({"cpus": 40}, "resources.cpus", 0),
                               ({"cpus": 100}, "resources.cpus", 4),
                               ({"cpus": 1, "memory": "300Gi"}, "resources.memory", 0)):  # fmt: skip
        gpus = 8 if extra.get("cpus") == 100 else 1  # 100 cores for 8 GPUs: 12.5 a GPU, 2 GPUs a 32-core node
        r = platform.api.post("/api/v1/workloads", headers=platform.tenant.headers,
                              json={"spec": job("never", gpus, **extra)})  # fmt: skip
        assert r.status_code == 422 and r.json()["detail"].startswith(f"{field}: the nodes with L40S"), r.text
        assert f"at most {most} of its {gpus} GPUs" in r.json()["detail"], r.text
    fits = platform.submit(job("fits", 4, cpus=50))  # 12.5 cores a GPU: 2 GPUs on each node
    assert platform.until(fits["id"], lambda w: w["state"] == "running")["allocation"]["gpus"] == 4


def test_cpu_only_work_asks_for_cpus_and_memory_or_gets_one_core_and_2_gib() -> None:
    """Once refused; now CPU-only work is charged for its cores and memory, so it says how many (or gets the
    default, written into its spec); hostile values are still refused by name."""
    asked = parse_spec({"name": "x", "command": "c", "resources": {"gpus": 0, "cpus": 4, "memory": "8Gi"}})
    assert asked.host_request() == (4000, 8192)
    default = parse_spec({"name": "x", "command": "c", "resources": {"gpus": 0, "memory": "512Mi"}})
    assert default.host_request() == (1000, 512)
    for extra, field in (({"cpus": 0}, "resources.cpus"), ({"memory": "0Gi"}, "resources.memory")):
        with pytest.raises(SpecError, match=f"{field}: "):
            parse_spec({"name": "x", "command": "c", "resources": {"gpus": 0, **extra}})


def test_grown_elastic_work_keeps_its_cores_per_gpu_across_a_new_pass(platform: Platform) -> None:
    """Elastic work asking 4 cores for its 1 GPU and grown to more takes 4 cores a GPU; a new server's pass rebuilds
    that from the open allocation, so a 24-core job does not land beside it on a 32-core node."""
    from suanli.control.scheduling.scheduling import SchedulingPass

    boxes(platform)
    grown = platform.submit({"name": "grown", "command": "x", "duration": 600, "model": {"preset": "llama3.1-8b"},
                             "resources": {"gpu": "L40S", "gpus": {"min": 1, "max": 4}, "cpus": 4}})  # fmt: skip
    g = platform.until(grown["id"], lambda w: w["state"] == "running")
    size = g["allocation"]["gpus"]
    assert size > 2, g["allocation"]  # it grew (the cluster is idle): 4 cores a GPU leave under 24 on its node
    platform.sched = SchedulingPass()
    other = platform.submit(job("other", 2, cpus=24))
    o = platform.until(other["id"], lambda w: w["state"] == "running")
    assert nodes_of(o) != nodes_of(g)


def test_running_work_keeps_its_cores_across_a_new_scheduling_pass(platform: Platform) -> None:
    """A restarted server rebuilds its snapshot from open allocations: their cores count as taken."""
    from suanli.control.scheduling.scheduling import SchedulingPass

    boxes(platform)
    held = [platform.submit(job(f"held{i}", 1, cpus=30)) for i in range(2)]
    for w in held:
        platform.until(w["id"], lambda x: x["state"] == "running")
    platform.sched = SchedulingPass()  # a new server's pass: nothing cached
    late = platform.submit(job("late", 1, cpus=4))
    platform.tick()
    assert platform.get(late["id"])["state"] == "pending"


@pytest.mark.parametrize(
    ("resources", "field", "why"),
    [
        ({"cpus": 0}, "resources.cpus", "more than 0"),
        ({"cpus": True}, "resources.cpus", "number of CPU cores"),
        ({"cpus": 5000}, "resources.cpus", "at most 4096"),
        ({"memory": "64"}, "resources.memory", "with a unit"),
        ({"memory": 64}, "resources.memory", "with a unit"),
        ({"memory": "0Gi"}, "resources.memory", "more than 0"),
        ({"memory": "2Pi"}, "resources.memory", "with a unit"),
        ({"memory": "9" * 400 + "Gi"}, "resources.memory", "with a unit"),
        ({"memory": "4194304Ti"}, "resources.memory", "at most 1Pi"),
    ],
)
def test_bad_cpus_or_memory_name_the_field(resources: dict[str, object], field: str, why: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_spec({"name": "x", "command": "c", "resources": {"gpus": 1, **resources}})
    assert field in str(e.value) and why in str(e.value)


@pytest.mark.parametrize(
    ("memory", "canonical", "mib"),
    [("64Gi", "64Gi", 65536), ("512Mi", "512Mi", 512), ("1.5Ti", "1536Gi", 1572864), ("1GB", "954Mi", 954),
     ("2048MiB", "2Gi", 2048), ("1Ki", "1Mi", 1), ("1100T", "1049041749Mi", 1049041749), ("1024Ti", "1048576Gi", 1 << 30)],
)  # fmt: skip
def test_memory_sizes_are_read_with_their_units(memory: str, canonical: str, mib: int) -> None:
    spec = parse_spec({"name": "x", "command": "c", "resources": {"gpus": 1, "memory": memory, "cpus": 0.5}})
    assert (spec.resources.memory, spec.resources.memory_mib()) == (canonical, mib)
    assert type(spec).model_validate(spec.model_dump(mode="json")) == spec  # the stored form parses back
    req = spec.to_request("w", 0.0, "org")
    assert (req.cpu_milli, req.memory_mib) == (500, mib)


def test_a_model_whose_hosts_nobody_described_carries_every_gpu() -> None:
    from suanli.control.caches import ModelCapacity

    assert ModelCapacity(16, 8, 8, 16).carries(8, 64_000, 1 << 20) == 16
    described = ModelCapacity(16, 8, 8, 16, hosts=((8, 32, 0, 2),))  # two 8-GPU nodes of 32 cores, memory unstated
    assert described.carries(8, 64_000, 1 << 20) == 8  # 8 cores a GPU: 4 GPUs on each node

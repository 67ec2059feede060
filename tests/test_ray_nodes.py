"""The Ray executor's pure parts, without Ray: `ray.nodes()` entries to EngineNodes (names, models, dead nodes, busy
GPUs), the gang's rules over rank reports, bundles and names, the job environment an actor hands on, and that
importing the executor does not import Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from suanli.executors.base import Launch, NodeRank, SandboxRequest, Status
from suanli.executors.ray_actor import env_fixes
from suanli.executors.ray_gang import actor_name, bundle_for, final_record, first_failure, group_name, status_of
from suanli.executors.ray_nodes import engine_nodes, gpu_model, own_gpus


def raw(node_id: str, host: str = "gpu-a", alive: bool = True, port: int = 1000, **kw: Any) -> dict[str, Any]:
    return {
        "NodeID": node_id,
        "Alive": alive,
        "NodeManagerAddress": kw.pop("ip", "10.0.0.1"),
        "NodeManagerHostname": host,
        "NodeManagerPort": port,
        "Resources": kw.pop("resources", {"CPU": 64.0, "GPU": 8.0, "memory": 512.0 * 2**30}),
        "Labels": {"ray.io/node-id": node_id, **kw.pop("labels", {})},
        "DeathReason": kw.pop("death", 0),
        "DeathReasonMessage": kw.pop("message", ""),
    }


# -- discovery -----------------------------------------------------------------------------------------------------


def test_a_node_maps_to_an_engine_node_with_its_suanli_labels_only() -> None:
    labels = {"suanli.io/gpu": "h100", "suanli.io/leaf": "leaf-3", "suanli.io/spine": "s0", "team": "x"}
    (node,) = engine_nodes([raw("n1", labels=labels)])
    assert (node.name, node.host, node.address) == ("gpu-a", "n1", "10.0.0.1")
    assert (node.gpu_count, node.gpu_model, node.cpu_count, node.memory_mib) == (8, "H100-SXM", 64, 512 * 1024)
    assert node.alive and node.reason == "" and node.busy_gpus == 0
    assert node.labels == {"suanli.io/gpu": "h100", "suanli.io/leaf": "leaf-3", "suanli.io/spine": "s0"}


def test_names_are_the_label_else_the_hostname_else_hostname_and_port() -> None:
    nodes = engine_nodes([
        raw("a", host="box", port=7001, labels={"suanli.io/name": "gpu-07"}),
        raw("b", host="box", port=7002),
        raw("c", host="box", port=7003),
        raw("d", host="solo"),
    ])  # fmt: skip
    assert [n.name for n in nodes] == ["box-7002", "box-7003", "gpu-07", "solo"]


def test_the_gpu_model_comes_from_the_label_or_rays_accelerator_type() -> None:
    assert gpu_model({"suanli.io/gpu": "A100-80G"}, {}) == "A100-SXM-80G"
    assert gpu_model({}, {"accelerator_type:H100": 1.0, "GPU": 8}) == "H100-SXM"
    assert gpu_model({"suanli.io/gpu": "no-such-gpu"}, {"accelerator_type:H100": 1.0}) is None  # the label wins
    assert gpu_model({}, {"GPU": 8}) is None
    (cpu_only,) = engine_nodes([raw("h", resources={"CPU": 4.0, "memory": 2.0**30}, labels={"suanli.io/gpu": "T4"})])
    assert (cpu_only.gpu_count, cpu_only.gpu_model) == (0, None)


def test_a_dead_node_shows_with_its_reason_until_a_live_one_takes_its_name() -> None:
    dead = raw("old", host="gpu-b", alive=False, death=1, message="health check failed")
    (node,) = engine_nodes([dead])
    assert not node.alive and node.reason == "health check failed" and node.host == "old"
    (silent,) = engine_nodes([raw("old", alive=False, death=1)])
    assert silent.reason.startswith("unexpected termination")
    (back,) = engine_nodes([dead, raw("new", host="gpu-b")])
    assert back.alive and back.host == "new"


def test_busy_gpus_are_those_neither_free_nor_ours() -> None:
    pgs = {
        "p1": {"name": "suanli:wl-1:a1", "state": "CREATED", "bundles": {0: {"GPU": 2.0}, 1: {"GPU": 1.0, "CPU": 1.0}},
               "bundles_to_node_id": {0: "n1", 1: "n2"}},
        "p2": {"name": "someone-else", "state": "CREATED", "bundles": {0: {"GPU": 4.0}}, "bundles_to_node_id": {0: "n1"}},
        "p3": {"name": "suanli:wl-2:a1", "state": "REMOVED", "bundles": {0: {"GPU": 8.0}}, "bundles_to_node_id": {}},
    }  # fmt: skip
    ours = own_gpus(pgs)
    assert ours == {"n1": 2.0, "n2": 1.0}
    nodes = engine_nodes([raw("n1", host="a"), raw("n2", host="b")], {"n1": {"GPU": 2.0}, "n2": {"GPU": 7.0}}, ours)
    assert [n.busy_gpus for n in nodes] == [4, 0]


# -- the gang ------------------------------------------------------------------------------------------------------


def ended(code: int, at: float, reason: str | None = None) -> dict[str, Any]:
    why = reason or ("exit code 0" if code == 0 else f"exit code {code}")
    return {"state": "exited", "exit_code": code, "reason": why, "ended_at": at, "drained": True}


RUNNING = {"state": "running", "reason": "", "drained": False}


def test_the_earliest_failure_is_the_gangs_and_it_names_the_rank() -> None:
    reports = {0: ended(-15, 20.0, "killed by SIGTERM"), 1: ended(3, 10.0), 2: ended(0, 5.0)}
    failure = first_failure(reports, 3, now=30.0)
    assert failure == {"state": "exited", "exit_code": 3, "reason": "exit code 3 (rank 1)", "node_rank": 1}
    assert first_failure({0: ended(0, 1.0), 1: RUNNING}, 2, now=2.0) is None
    assert first_failure({0: ended(2, 1.0)}, 1, now=2.0)["reason"] == "exit code 2"  # type: ignore[index]


def test_a_lost_rank_fails_the_gang_at_the_time_it_was_seen() -> None:
    lost = {"state": "lost", "exit_code": None, "reason": "node n2 died: health check failed", "drained": True}
    failure = first_failure({0: ended(1, 50.0), 1: lost}, 2, now=40.0)
    assert failure is not None and failure["state"] == "lost" and failure["node_rank"] == 1


def test_the_attempt_ends_when_no_rank_runs_and_every_log_is_in() -> None:
    assert final_record({0: ended(0, 1.0), 1: RUNNING}, None, None) is None
    assert final_record({0: {**ended(0, 1.0), "drained": False}}, None, None) is None
    record = final_record({0: ended(0, 1.0), 1: ended(0, 4.0)}, None, None)
    assert record is not None and status_of(record) == Status("exited", 0, "exit code 0", 4.0)
    assert status_of(record).ended_at == 4.0
    failure = {"state": "exited", "exit_code": -15, "reason": "killed by SIGTERM (rank 0)"}
    stopped = final_record({0: ended(-15, 2.0)}, failure, {"at": 1.0, "by": "user"})
    assert stopped is not None and stopped["reason"] == "killed by SIGTERM (rank 0) (stop requested)"
    lost = final_record({0: ended(-15, 2.0)}, {"state": "lost", "reason": "node n died: x"}, {"by": "gang"})
    assert lost == {"state": "lost", "exit_code": None, "reason": "node n died: x", "ended_at": None}


# -- launch pieces -------------------------------------------------------------------------------------------------


def launch(ranks: tuple[NodeRank, ...], sandbox: SandboxRequest | None = None) -> Launch:
    return Launch(workload_id="wl-9", attempt=2, command="true", workdir=Path("/w"), env={}, ranks=ranks,
                  log_dir=Path("/l"), sandbox=sandbox)  # fmt: skip


def test_names_and_bundles() -> None:
    assert group_name("wl-9", 2) == "suanli:wl-9:a2" and actor_name("wl-9", 2, 1) == "suanli:wl-9:a2:r1"
    gpu_rank, cpu_rank = NodeRank("a", 0, (5, 6), "id-a"), NodeRank("b", 1, (), "id-b")
    assert bundle_for(launch((gpu_rank, cpu_rank)), gpu_rank, 1.0) == {"CPU": 1.0, "GPU": 2.0}
    assert bundle_for(launch((gpu_rank, cpu_rank)), cpu_rank, 0.5) == {"CPU": 0.5}
    # 24 CPUs for 4 GPUs: a rank with 2 of them reserves 12; a CPU-only workload's rank reserves all it asked.
    asked = launch((gpu_rank,), SandboxRequest(cpu_milli=24000, gpus_asked=4))
    assert bundle_for(asked, gpu_rank, 1.0) == {"CPU": 12.0, "GPU": 2.0}
    assert bundle_for(launch((cpu_rank,), SandboxRequest(cpu_milli=1250)), cpu_rank, 1.0) == {"CPU": 1.3}


def test_a_job_gets_the_nodes_environment_not_the_ray_workers() -> None:
    worker = {"PATH": "/venv/bin:/usr/bin", "RAY_AUTH_TOKEN_PATH": "/t", "RAYLET_PID": "7", "OMP_NUM_THREADS": "1",
              "PYTHONBREAKPOINT": "ray.util.rpdb.set_trace", "CUDA_VISIBLE_DEVICES": "0,1", "HOME": "/root",
              "RAY_KEEP": "spec"}  # fmt: skip
    node = {"PATH": "/venv/bin:/usr/bin", "RAY_AUTH_TOKEN_PATH": "/t", "HOME": "/root"}
    fixes = env_fixes(worker, node, keep={"RAY_KEEP"})
    assert fixes == {"RAY_AUTH_TOKEN_PATH": None, "RAYLET_PID": None, "OMP_NUM_THREADS": None,
                     "PYTHONBREAKPOINT": None, "CUDA_VISIBLE_DEVICES": None}  # fmt: skip
    # Without the raylet's environment to compare with: Ray's own variables and its debugger hook still go.
    assert env_fixes(worker, None, keep=set()) == {"RAY_AUTH_TOKEN_PATH": None, "RAYLET_PID": None,
                                                   "PYTHONBREAKPOINT": None, "RAY_KEEP": None}  # fmt: skip


def test_the_executor_module_does_not_import_ray() -> None:
    code = "import sys, suanli.executors.ray_executor, suanli.executors.ray_nodes; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

"""Engine clusters over the database (both backends): the nodes Ray or Slurm reports become a cluster whose spec
follows its fabric labels; nodes that join are registered, nodes that die go down through the health path (their
work stops as a node failure) and come back ready, unless the operator put them down; GPUs held by work outside
suanli are not placed on. And the spec built from discovered hosts, as a property: every host once, in fabric
order, leaves and spines of the sizes found."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suanli.control.ids import utcnow
from suanli.control.scheduling import engines, inventory
from suanli.control.scheduling.snapshot import external_gpus
from suanli.control.telemetry import health
from suanli.db.models import Allocation, ClusterRow, Gpu, Node, Workload
from suanli.executors.base import EngineNode
from suanli.topology.discovered import Host, discovered_spec
from suanli.topology.spec import parse


def _node(i: int, leaf: str = "leaf-0", alive: bool = True, gpus: int = 8, busy: int = 0, **labels: str) -> EngineNode:
    return EngineNode(name=f"node-{i}", host=f"id-{i}", address=f"10.0.0.{i}", gpu_count=gpus, gpu_model="H100",
                      cpu_count=32, memory_mib=65536, alive=alive, busy_gpus=busy,
                      labels={"suanli.io/leaf": leaf, "suanli.io/spine": "spine-0", **labels},
                      reason="" if alive else "raylet died")  # fmt: skip


def _sync(db: Any, nodes: list[EngineNode], kind: str = "ray", now: Any = None) -> engines.SyncReport:
    with db.write() as s, s.begin():
        return engines.sync(s, "gpus", kind, nodes, "roce-400", now or utcnow())


def _nodes(db: Any) -> list[Node]:
    with db.read() as s:
        return sorted(s.query(Node).all(), key=lambda n: n.index)


def test_discovered_nodes_become_a_cluster_on_their_fabric(db: Any) -> None:
    r = _sync(db, [_node(3, "leaf-1"), _node(1), _node(2), _node(9, gpus=0)])  # a CPU-only head is not a GPU node
    assert sorted(r.added) == ["gpus.node-1", "gpus.node-2", "gpus.node-3"] and r.replaced
    rows = _nodes(db)
    assert [(n.name, n.leaf, n.kind, n.gpu_count) for n in rows] == [
        ("gpus.node-1", 0, "ray", 8), ("gpus.node-2", 0, "ray", 8), ("gpus.node-3", 1, "ray", 8)]  # fmt: skip
    assert rows[0].labels["engine_host"] == "id-1" and rows[0].labels["address"] == "10.0.0.1"
    with db.read() as s:
        row = s.query(ClusterRow).one()
        topo = inventory.cluster_topology(row)
        assert row.source == "ray" and topo is not None and topo.n_gpus == 24 and topo.n_leaves == 2
        assert s.query(Gpu).count() == 24
    again = _sync(db, [_node(3, "leaf-1"), _node(1), _node(2)])
    assert not again.replaced and not again.added  # nothing changed: the spec is not rewritten


def test_a_node_that_joins_is_placed_in_its_leaf(db: Any) -> None:
    _sync(db, [_node(1), _node(3, "leaf-1")])
    r = _sync(db, [_node(1), _node(3, "leaf-1"), _node(2)])
    assert r.added == ["gpus.node-2"] and r.replaced
    assert [(n.name, n.index, n.leaf) for n in _nodes(db)] == [
        ("gpus.node-1", 0, 0), ("gpus.node-2", 1, 0), ("gpus.node-3", 2, 1)]  # fmt: skip


def _holding(db: Any, node: str) -> str:
    now = utcnow()
    with db.write() as s, s.begin():
        from suanli.control.accounts import accounts

        user, org = accounts.create_user(s, f"u{now.timestamp()}@example.com", "password-123", now)
        s.add(Workload(id="wl_on_node", org_id=org.id, user_id=user.id, name="train", kind="job",
                       spec={"name": "train", "command": "x"}, state="running", executor="ray",
                       created_at=now, submitted_at=now, queued_at=now, allocation_id="al_1"))  # fmt: skip
        s.add(Allocation(id="al_1", org_id=org.id, user_id=user.id, workload="wl_on_node", gpus=2, gpu_model="H100-SXM",
                         rate_per_hour=0, placement={node: [0, 1]}, started_at=now))  # fmt: skip
    return "wl_on_node"


def test_a_dead_node_goes_down_and_its_work_stops_as_a_node_failure(db: Any) -> None:
    _sync(db, [_node(1), _node(2)])
    wid = _holding(db, "gpus.node-2")
    r = _sync(db, [_node(1), _node(2, alive=False)])
    assert r.down == ["gpus.node-2"]
    with db.read() as s:
        node = s.query(Node).filter_by(name="gpus.node-2").one()
        w = s.get(Workload, wid)
        assert node.state == "down" and node.state_reason == "ray: raylet died"
        assert w is not None and w.stop_requested and w.stop_requested.startswith(health.NODE_FAILURE)
    r = _sync(db, [_node(1), _node(2)])  # back
    assert r.up == ["gpus.node-2"] and _nodes(db)[1].state == "ready"


def test_a_node_the_operator_put_down_stays_down(db: Any) -> None:
    _sync(db, [_node(1), _node(2)])
    with db.write() as s, s.begin():
        health.set_state(s, "gpus.node-2", "down", "fan failure", utcnow())
    assert _sync(db, [_node(1), _node(2)]).up == []
    assert _nodes(db)[1].state == "down"


def test_a_node_that_vanishes_stays_down_in_its_place(db: Any) -> None:
    _sync(db, [_node(1), _node(2)])
    r = _sync(db, [_node(1)], now=utcnow() + timedelta(seconds=5))
    assert r.down == ["gpus.node-2"] and not r.replaced
    assert [(n.name, n.state) for n in _nodes(db)] == [("gpus.node-1", "ready"), ("gpus.node-2", "down")]


def test_gpus_busy_outside_suanli_are_not_placed_on(db: Any) -> None:
    _sync(db, [_node(1), _node(2, busy=3)], kind="slurm")
    with db.read() as s:
        busy = external_gpus(s)
    (cid,) = busy
    assert sorted(busy[cid]) == [("gpus.node-2", 5), ("gpus.node-2", 6), ("gpus.node-2", 7)]
    _holding(db, "gpus.node-2")  # suanli's own job on GPUs 5-6: the outside work's GPUs are others
    with db.write() as s, s.begin():
        s.query(Allocation).filter_by(id="al_1").update({"placement": {"gpus.node-2": [5, 6]}})
    with db.read() as s:
        assert sorted(external_gpus(s)[cid]) == [("gpus.node-2", 3), ("gpus.node-2", 4), ("gpus.node-2", 7)]
    _sync(db, [_node(1), _node(2, busy=1)], kind="slurm")  # one outside job ended
    with db.read() as s:
        assert external_gpus(s)[cid] == [("gpus.node-2", 7)]


def test_engine_kinds_do_not_share_a_cluster_name(db: Any) -> None:
    _sync(db, [_node(1)], kind="ray")
    with pytest.raises(Exception, match="needs its own name"):
        _sync(db, [_node(1)], kind="slurm")


hosts = st.lists(
    st.builds(Host, name=st.integers(0, 10_000).map(lambda i: f"h{i}"), gpu=st.sampled_from(["H100-SXM", "H20"]),
              gpus=st.sampled_from([4, 8]), leaf=st.sampled_from(["", "a", "b", "c"]),
              spine=st.sampled_from(["", "s1", "s2"])),
    min_size=1, max_size=40, unique_by=lambda h: h.name,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(hosts)
def test_the_discovered_spec_holds_every_host_once_in_fabric_order(found: list[Host]) -> None:
    spec, order = discovered_spec("c", found, "roce-400")
    cluster = parse(spec)
    assert sorted(order) == sorted(h.name for h in found) and cluster.n_nodes == len(found)
    by = {h.name: h for h in found}
    leaf, spine = cluster.node_leaf.tolist(), cluster.node_spine.tolist()
    for i, name in enumerate(order):
        h = by[name]
        assert cluster.group_of(i).gpus_per_node == h.gpus and cluster.group_of(i).gpu.name == h.gpu
        for j in range(i):  # two hosts share a leaf (spine) exactly when their labels do
            other = by[order[j]]
            assert (leaf[i] == leaf[j]) == ((h.spine, h.leaf) == (other.spine, other.leaf))
            assert (spine[i] == spine[j]) == (h.spine == other.spine)
    assert cluster.n_gpus == sum(h.gpus for h in found)

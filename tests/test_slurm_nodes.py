"""Slurm's text as suanli reads it, without Slurm: `scontrol -o` records, hostlists, gres, node states, topology.conf
and `scontrol show topology`, suanli's own GPUs in `squeue`, whole inventories, and a job's combined state."""

from __future__ import annotations

import pytest

from suanli.executors.slurm_nodes import (
    FEATURES,
    GPU,
    LEAF,
    PARTITIONS,
    SPINE,
    expand_hostlist,
    fields,
    gres_gpus,
    job_view,
    own_gpus,
    own_jobs_gpus,
    parse_nodes,
    parse_topology,
    records,
    state_dead,
)

# `scontrol -d -o show node` of Slurm 22.05 (one line each, wrapped here for reading).
NODES = "\n".join(
    " ".join(line.split())
    for line in (
        """NodeName=gpu-a01 Arch=x86_64 CoresPerSocket=32 CPUAlloc=16 CPUEfctv=64 CPUTot=64 CPULoad=3.10
        AvailableFeatures=ib,suanli.io/nvlink-domain=rack1 ActiveFeatures=ib,suanli.io/nvlink-domain=rack1
        Gres=gpu:h100:8(S:0-1) GresDrain=N/A GresUsed=gpu:h100:5(IDX:0-4) NodeAddr=10.0.0.11 NodeHostName=gpu-a01
        Version=22.05.8 OS=Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01) RealMemory=1031000
        AllocMem=0 FreeMem=1000000 Sockets=2 Boards=1 State=MIXED ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A
        MCS_label=N/A Partitions=gpu,long BootTime=2024-03-01T10:00:00 SlurmdStartTime=2024-03-01T10:01:00
        LastBusyTime=2024-03-02T09:00:00 CfgTRES=cpu=64,mem=1031000M,billing=64,gres/gpu=8 AllocTRES=cpu=16
        CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s""",
        """NodeName=gpu-a02 Arch=x86_64 CoresPerSocket=32 CPUAlloc=0 CPUEfctv=64 CPUTot=64 CPULoad=0.00
        AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:nvidia_h100_80gb_hbm3:8 GresDrain=N/A
        GresUsed=gpu:nvidia_h100_80gb_hbm3:0(IDX:N/A) NodeAddr=10.0.0.12 NodeHostName=gpu-a02 Version=22.05.8
        OS=Linux 6.1.0-18-amd64 #1 SMP RealMemory=1031000 AllocMem=0 FreeMem=1000000 Sockets=2 Boards=1
        State=DOWN+NOT_RESPONDING ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu
        BootTime=None SlurmdStartTime=None LastBusyTime=2024-03-02T09:00:00 CfgTRES=cpu=64 AllocTRES=
        CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
        Reason=Xid 79 GPU=3 fell off the bus [root@2024-03-02T08:55:12]""",
        """NodeName=gpu-b01 Arch=x86_64 CoresPerSocket=16 CPUAlloc=0 CPUEfctv=30 CPUTot=32 CPULoad=0.00
        AvailableFeatures=suanli.io/gpu=A100-PCIe-40G ActiveFeatures=suanli.io/gpu=A100-PCIe-40G Gres=gpu:tesla:4
        GresDrain=N/A GresUsed=gpu:tesla:0(IDX:N/A) NodeAddr=10.0.1.21 NodeHostName=gpu-b01 Version=22.05.8
        RealMemory=515000 AllocMem=0 State=IDLE+DRAIN ThreadsPerCore=1 Partitions=debug
        Reason=maintenance [admin@2024-03-02T07:00:00]""",
        """NodeName=cpu01 Arch=x86_64 CPUAlloc=0 CPUTot=128 AvailableFeatures=(null) Gres=(null) GresUsed=
        NodeAddr=cpu01 RealMemory=256000 State=IDLE Partitions=cpu""",
    )
)


def test_a_oneliner_field_runs_to_the_next_key_and_a_node_reason_to_its_user_and_time() -> None:
    rec = records(NODES)[1]
    assert rec["OS"] == "Linux 6.1.0-18-amd64 #1 SMP"
    assert rec["Reason"] == "Xid 79 GPU=3 fell off the bus [root@2024-03-02T08:55:12]"
    assert rec["State"] == "DOWN+NOT_RESPONDING" and rec["AllocTRES"] == ""
    job = fields("JobId=7 JobName=suanli-wl-a1 JobState=PENDING Reason=Resources Dependency=(null) "
                 "AllocNode:Sid=login1:4292 ReqB:S:C:T=0:0:*:* CPUs/Task=1 TresPerNode=gres:gpu:2")  # fmt: skip
    assert job["Reason"] == "Resources" and job["Dependency"] == "(null)"
    assert job["AllocNode:Sid"] == "login1:4292" and job["CPUs/Task"] == "1" and job["TresPerNode"] == "gres:gpu:2"


@pytest.mark.parametrize(
    ("expr", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[1-4,7]", ["node1", "node2", "node3", "node4", "node7"]),
        ("gpu-a[01-03]", ["gpu-a01", "gpu-a02", "gpu-a03"]),
        ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
        ("", []),
    ],
)
def test_hostlists_expand_as_slurm_does(expr: str, hosts: list[str]) -> None:
    assert expand_hostlist(expr) == hosts


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [
        ("gpu:h100:8(S:0-1)", (8, "h100")),
        ("gpu:8", (8, None)),
        ("gpu", (1, None)),
        ("gpu:h100:3(IDX:0-2),mps:100", (3, "h100")),
        ("gpu:a100:2(S:0),gpu:h100:2(S:1)", (4, None)),
        ("gpu:h100:0(IDX:N/A)", (0, "h100")),
        ("shard:h100:32,mps:400", (0, None)),
        ("(null)", (0, None)),
        ("", (0, None)),
    ],
)
def test_gres_fields_give_the_gpu_count_and_type(gres: str, gpus: tuple[int, str | None]) -> None:
    assert gres_gpus(gres) == gpus


@pytest.mark.parametrize(
    ("state", "dead"),
    [
        ("IDLE", False),
        ("MIXED", False),
        ("ALLOCATED+COMPLETING", False),
        ("IDLE+RESERVED", False),
        ("MIXED+DRAIN", True),
        ("IDLE+DRAIN", True),
        ("DOWN+NOT_RESPONDING", True),
        ("IDLE+NOT_RESPONDING", True),
        ("FAIL", True),
        ("IDLE+CLOUD+POWERED_DOWN", True),
        ("idle*", True),
        ("down~", True),
    ],
)
def test_node_states_that_take_no_work(state: str, dead: bool) -> None:
    assert state_dead(state) is dead


TOPOLOGY_CONF = """\
# topology.conf: two leaf switches under one spine
SwitchName=leaf1 Nodes=gpu-a[01-02]   # rack A
SwitchName=leaf2 Nodes=gpu-b01,gpu-b02 LinkSpeed=400
SwitchName=spine Switches=leaf[1-2]
"""

SHOW_TOPOLOGY = """\
SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=node[1-2]
SwitchName=leaf2 Level=0 LinkSpeed=1 Nodes=node[3-4]
SwitchName=leaf3 Level=0 LinkSpeed=1 Nodes=node5
SwitchName=spine1 Level=1 LinkSpeed=1 Nodes=node[1-4] Switches=leaf[1-2]
SwitchName=spine2 Level=1 LinkSpeed=1 Nodes=node5 Switches=leaf3
SwitchName=core Level=2 LinkSpeed=1 Nodes=node[1-5] Switches=spine[1-2]
"""


TREE_2 = {"gpu-a01": ("leaf1", "spine"), "gpu-a02": ("leaf1", "spine"), "gpu-b01": ("leaf2", "spine")}
TREE_3 = {"node1": ("leaf1", "spine1"), "node4": ("leaf2", "spine1"), "node5": ("leaf3", "spine2")}
BLOCKS = "BlockName=b1 Nodes=n[1-2]\nBlockName=b2 Nodes=n3\nBlockSizes=2,4\n"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (TOPOLOGY_CONF, TREE_2),
        (SHOW_TOPOLOGY, TREE_3),  # a core above the spines: a leaf's spine is its parent
        ("SwitchName=s1 Nodes=n[1-2]\n", {"n1": ("s1", None), "n2": ("s1", None)}),
        (BLOCKS, {"n2": ("b1", None), "n3": ("b2", None)}),
        ("No topology information available\n", {}),
    ],
)
def test_topology_gives_each_node_its_leaf_and_spine(text: str, want: dict[str, tuple[str, str | None]]) -> None:
    got = parse_topology(text)
    for node, (leaf, spine) in want.items():
        assert got[node].get(LEAF) == leaf and got[node].get(SPINE) == spine, (node, got[node])
    assert set(want) <= set(got) and (want or not got)


def test_topology_expands_with_the_given_hostlist_function() -> None:
    calls: list[str] = []

    def expand(expr: str) -> list[str]:
        calls.append(expr)
        return expand_hostlist(expr)

    parse_topology(TOPOLOGY_CONF, expand)
    assert "gpu-a[01-02]" in calls and "leaf[1-2]" in calls


def test_suanlis_own_gpus_are_its_users_jobs_with_its_prefix() -> None:
    squeue = "\n".join([
        "svc|gpu-a[01-02]|gres:gpu:2|suanli-wl1-a1",
        "svc|gpu-a01|gres/gpu:h100:1|suanli-wl2-a3",
        "alice|gpu-a01|gres:gpu:4|suanli-fake",  # not the server's user
        "svc|gpu-a01|gres:gpu:1|train",  # not suanli's name
        "svc||gres:gpu:1|suanli-wl3-a1",  # pending: no nodes yet
        "svc|gpu-b01|N/A|suanli-wl4-a1",
        "svc|gpu-b01|gres:gpu:1|suanli-a|b|c",  # a `|` in a name changes nothing: the name comes last
    ])  # fmt: skip
    assert own_gpus(squeue, "svc", "suanli-") == {"gpu-a01": 3, "gpu-a02": 2, "gpu-b01": 1}


SPOOF = "x\nsvc|gpu-a01|gres:gpu:8|suanli-spoof\ny"  # a line of suanli's own, smuggled in a job name


def test_a_strangers_job_name_cannot_make_its_gpus_suanlis_own_over_slurmrestd() -> None:
    """Found by a hostile review: jobs of GET /jobs were rebuilt into squeue's text, so any user of the Slurm site
    who named a job with a newline made discovery count GPUs that job held as suanli's own (busy_gpus fell, and
    suanli placed tenants on taken GPUs)."""
    from suanli.executors.slurm_rest import job_of

    jobs = [{"user_name": "mallory", "name": SPOOF, "nodes": "gpu-a01", "tres_per_node": "gres:gpu:1"},
            {"user_name": "svc", "name": "suanli-wl1-a1\nsvc", "nodes": "gpu-a01", "tres_per_node": "gres:gpu:8"},
            {"user_name": "svc", "name": "suanli-wl2-a1", "nodes": "gpu-b01", "tres_per_node": "gres:gpu:2"}]  # fmt: skip
    assert own_jobs_gpus([job_of(j) for j in jobs], "svc", "suanli-") == {"gpu-b01": 2}


def test_discovery_over_the_tools_asks_squeue_for_the_servers_own_jobs_only() -> None:
    """squeue's text cannot keep a stranger's job name from making lines of its own, so only the server user's jobs
    are listed (their names are the server's): a real squeue answers this in test_slurm_executor's discovery."""
    import os
    import pwd

    from suanli.executors import slurm_cli

    class Tools:
        hostnames = staticmethod(expand_hostlist)

        def __init__(self) -> None:
            self.calls: list[list[str]] = []

        def run(self, tool: str, args: list[str], check: bool = True) -> str:
            self.calls.append([tool, *args])
            return ""

    tools = Tools()
    slurm_cli.discover(tools)  # type: ignore[arg-type]
    (squeue,) = [c for c in tools.calls if c[0] == "squeue"]
    user = pwd.getpwuid(os.getuid()).pw_name
    assert squeue[squeue.index("-u") + 1] == user
    assert squeue[squeue.index("-o") + 1].endswith("|%j")  # the name last


def test_an_inventory_becomes_engine_nodes() -> None:
    topo = parse_topology(TOPOLOGY_CONF)
    a01, a02, b01, cpu = parse_nodes(NODES, topo, own={"gpu-a01": 2})
    assert (a01.name, a01.host, a01.address) == ("gpu-a01", "gpu-a01", "10.0.0.11")
    assert (a01.gpu_count, a01.gpu_model, a01.cpu_count, a01.memory_mib) == (8, "H100-SXM", 64, 1031000)
    assert a01.busy_gpus == 3  # 5 in use, 2 of them suanli's own
    assert a01.alive and a01.reason == ""
    assert a01.labels == {GPU: "H100-SXM", LEAF: "leaf1", SPINE: "spine", PARTITIONS: "gpu,long",
                          "suanli.io/nvlink-domain": "rack1", FEATURES: "ib"}  # fmt: skip
    assert a02.gpu_model == "H100-SXM"  # the type NVML autodetection writes, resolved by the catalog's aliases
    assert not a02.alive
    assert a02.reason == "Slurm state DOWN+NOT_RESPONDING: Xid 79 GPU=3 fell off the bus [root@2024-03-02T08:55:12]"
    assert (b01.gpu_count, b01.gpu_model, b01.cpu_count) == (4, "A100-PCIe-40G", 30)  # the feature names the model
    assert not b01.alive and "maintenance" in b01.reason
    assert (cpu.gpu_count, cpu.gpu_model, cpu.busy_gpus, cpu.address) == (0, None, 0, "cpu01")
    assert LEAF not in cpu.labels


def test_a_partition_selects_its_nodes() -> None:
    assert [n.name for n in parse_nodes(NODES, partition="gpu")] == ["gpu-a01", "gpu-a02"]
    assert [n.name for n in parse_nodes(NODES, partition="nope")] == []


@pytest.mark.parametrize(
    ("states", "want"),
    [
        (["RUNNING"], "RUNNING"),
        (["RUNNING", "PENDING"], "PENDING"),
        (["COMPLETED", "NODE_FAIL"], "NODE_FAIL"),
        (["COMPLETED", "CANCELLED"], "CANCELLED"),
        (["COMPLETED", "COMPLETED"], "COMPLETED"),
        (["COMPLETING", "COMPLETED"], "COMPLETING"),
    ],
)
def test_a_heterogeneous_jobs_state_is_its_most_telling_components(states: list[str], want: str) -> None:
    assert job_view([{"JobState": s, "Reason": "None"} for s in states]).state == want

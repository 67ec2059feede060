"""Slurm's inventory and job states as suanli sees them: pure parsers of `scontrol`/`squeue` text, no I/O.

Slurm 22.05's `scontrol` has no `--json` (it came in 23.02), so this reads the `--oneliner` form: one record a
line, `Key=Value` fields. Values may hold spaces (`OS=Linux 6.1 #1 SMP`, a node's `Reason=disk full [root@…]`),
so a field runs until the next token that starts like a key; a node's Reason runs to its `[user@time]` suffix.

A job's records (one per heterogeneous component) reduce to one `JobView`: the state that matters most, and
whether Slurm lost the job (NODE_FAIL, or reason NodeDown while it still completes on the nodes left).

Hostlist expressions (`node[1-4,07]`, `rack[1-2]-gpu[1-8]`) are expanded by `expand_hostlist`, which follows
Slurm's syntax (ranges, zero padding, several bracket groups); `slurm_cli` passes `scontrol show hostnames`
instead when it talks to a real cluster, so Slurm's own expansion is the one that counts there.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from suanli.executors.base import EngineNode

Expand = Callable[[str], list[str]]

LEAF, SPINE, GPU = "suanli.io/leaf", "suanli.io/spine", "suanli.io/gpu"
PARTITIONS, FEATURES = "suanli.io/slurm-partitions", "suanli.io/slurm-features"
# A node in any of these states takes no new work; Slurm spells NOT_RESPONDING as a trailing '*' in sinfo.
DEAD_FLAGS = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING", "FUTURE",
                        "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "INVALID_REG", "REBOOT_ISSUED", "UNKNOWN"})  # fmt: skip
_KEY = re.compile(r"[A-Z][A-Za-z0-9_:/]*=")
_NODE_REASON = re.compile(r"(?:^|\s)Reason=(.*?\[[^\]\s]*@[^\]\s]*\])(?=\s|$)")


def fields(line: str) -> dict[str, str]:
    """One `--oneliner` record → {key: value}; a repeated key keeps its first value."""
    out: dict[str, str] = {}
    m = _NODE_REASON.search(line)
    if m:  # free text up to its `[user@time]`: it may hold anything, `=` included
        out["Reason"] = m.group(1)
        line = line[: m.start()] + " " + line[m.end() :]
    key: str | None = None
    parts: list[str] = []
    for token in line.split():
        k = _KEY.match(token)
        if k:
            if key is not None:
                out.setdefault(key, " ".join(parts))
            key, parts = k.group()[:-1], [token[k.end() :]]
        elif key is not None:
            parts.append(token)
    if key is not None:
        out.setdefault(key, " ".join(parts))
    return out


def records(text: str) -> list[dict[str, str]]:
    """Every non-empty line of `scontrol -o show …` output as a record."""
    return [fields(line) for line in text.splitlines() if "=" in line]


def expand_hostlist(expr: str) -> list[str]:
    """`node[1-3,07],gpu-a` → ['node1', 'node2', 'node3', 'node07', 'gpu-a'] (Slurm's hostlist syntax)."""
    out: list[str] = []
    for item in _split_top(expr.strip()):
        pieces: list[list[str]] = []
        for literal, ranges in re.findall(r"([^\[\]]*)(?:\[([^\]]*)\])?", item):
            pieces.append([literal])
            if ranges:
                pieces.append(_expand_ranges(ranges))
        out += ["".join(p) for p in itertools.product(*pieces)]
    return [h for h in out if h]


def _split_top(expr: str) -> list[str]:
    """Split at the commas outside brackets (and parentheses, as in `gpu:8(S:0,1)`)."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(expr[start:i])
            start = i + 1
    items.append(expr[start:])
    return [x for x in items if x]


def _expand_ranges(ranges: str) -> list[str]:
    out: list[str] = []
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        if not hi:
            out.append(lo)
            continue
        width = len(lo) if lo.startswith("0") else 0
        out += [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
    return out


def gres_gpus(gres: str) -> tuple[int, str | None]:
    """GPUs in a Gres/GresUsed field and their type: `gpu:h100:8(S:0-1),gpu:h100:0,mps:100` → (8, 'h100').

    The type is None when there is none or there are several; `(null)` and `N/A` hold no GPUs."""
    count, types = 0, set()
    for item in _split_top(gres):
        parts = item.split("(", 1)[0].split(":")
        if parts[0] != "gpu":
            continue
        n = 1
        if len(parts) >= 2 and re.fullmatch(r"\d+[KMG]?", parts[-1]):
            n = _count(parts[-1])
            parts = parts[:-1]
        count += n
        if len(parts) >= 2:
            types.add(parts[1])
    return count, (types.pop() if len(types) == 1 else None)


def _count(text: str) -> int:
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
    return int(text.rstrip("KMG")) * scale


def catalog_gpu(name: str) -> str | None:
    """The catalog's canonical name for a GPU type or model name (`h100`, `nvidia_h100_80gb_hbm3`); None if unknown."""
    from suanli import catalog

    try:
        return catalog.gpu(name).name
    except catalog.CatalogError:
        return None


def state_dead(state: str) -> bool:
    """Whether a node in this Slurm state (`IDLE`, `MIXED+DRAIN`, `DOWN+NOT_RESPONDING`, `idle*`) takes no work."""
    flags = set(state.upper().rstrip("*~#!%$@^-").split("+"))
    return bool(flags & DEAD_FLAGS) or state.endswith("*")


def parse_topology(text: str, expand: Expand = expand_hostlist) -> dict[str, dict[str, str]]:
    """topology.conf or `scontrol show topology` → {node: {suanli.io/leaf: …, suanli.io/spine: …}}.

    Tree plugin: a node's leaf is the lowest switch listing it in `Nodes=` (one with no `Switches=`), its spine the
    switch whose `Switches=` hold that leaf (none when the leaf is the top). Block plugin (23.11+): a block is its
    nodes' leaf, with no spine. Comments and other lines are ignored."""
    switches: list[dict[str, str]] = []
    blocks: list[dict[str, str]] = []
    for line in text.splitlines():
        rec = fields(line.split("#", 1)[0])
        if "SwitchName" in rec:
            switches.append(rec)
        elif "BlockName" in rec:
            blocks.append(rec)
    parent: dict[str, str] = {}
    for sw in switches:
        for child in expand(sw.get("Switches", "")) if sw.get("Switches") else []:
            parent.setdefault(child, sw["SwitchName"])
    out: dict[str, dict[str, str]] = {}
    for sw in switches:
        if sw.get("Switches") or not sw.get("Nodes"):
            continue  # not a leaf
        for node in expand(sw["Nodes"]):
            labels = out.setdefault(node, {LEAF: sw["SwitchName"]})
            if sw["SwitchName"] in parent and labels[LEAF] == sw["SwitchName"]:
                labels[SPINE] = parent[sw["SwitchName"]]
    for block in blocks:
        for node in expand(block.get("Nodes", "")) if block.get("Nodes") else []:
            out.setdefault(node, {LEAF: block["BlockName"]})
    return out


Job = tuple[str, str, str, str]  # (user, name, nodes, per-node TRES like `gres:gpu:2` or `gres/gpu:h100:2`)


def own_gpus(squeue: str, user: str, prefix: str, expand: Expand = expand_hostlist) -> dict[str, int]:
    """GPUs per node held by suanli's own jobs, from `squeue -h -u USER -o '%u|%N|%b|%j'` lines (see `own_jobs_gpus`).
    A job's name is free text (a newline in it makes lines of its own), so squeue must list only `user`'s jobs,
    whose names the server chose; the name comes last, where a `|` in it changes nothing."""
    jobs = [(u, j, n, b) for u, n, b, j in (ln.split("|", 3) for ln in squeue.splitlines() if ln.count("|") >= 3)]
    return own_jobs_gpus(jobs, user, prefix, expand)


def own_jobs_gpus(jobs: Iterable[Job], user: str, prefix: str, expand: Expand = expand_hostlist) -> dict[str, int]:
    """GPUs per node held by suanli's own jobs: those named `prefix…` that run as `user`."""
    out: dict[str, int] = {}
    for who, name, nodes, tres in jobs:
        if who.strip() != user or not name.startswith(prefix) or "\n" in name or not nodes.strip():
            continue
        per_node, _ = gres_gpus(",".join(re.sub(r"^gres[:/]", "", x) for x in _split_top(tres.strip())))
        for node in expand(nodes.strip()):
            out[node] = out.get(node, 0) + per_node
    return out


def parse_nodes(
    text: str,
    topology: dict[str, dict[str, str]] | None = None,
    own: dict[str, int] | None = None,
    partition: str | None = None,
) -> list[EngineNode]:
    """`scontrol -d -o show node` → EngineNodes (only those in `partition`, when given).

    `-d` adds GresUsed: the GPUs Slurm has handed out. Less `own` (suanli's jobs, see `own_gpus`) they are
    `busy_gpus`, the capacity others' jobs hold. The GPU model is a `suanli.io/gpu=MODEL` feature when the catalog
    knows it, else the gres type when it is a catalog name. Features of the form `suanli.io/…=…` become labels
    (an operator states an NVLink domain that way); topology labels (see `parse_topology`) win over them."""
    return parse_node_records(records(text), topology, own, partition)


def parse_node_records(
    recs: list[dict[str, str]],
    topology: dict[str, dict[str, str]] | None = None,
    own: dict[str, int] | None = None,
    partition: str | None = None,
) -> list[EngineNode]:
    """`parse_nodes` of records already split into fields (as slurmrestd's JSON is mapped into them)."""
    out: list[EngineNode] = []
    for rec in recs:
        name = rec.get("NodeName")
        if not name:
            continue
        parts = [p for p in rec.get("Partitions", "").split(",") if p]
        if partition is not None and partition not in parts:
            continue
        gpus, gtype = gres_gpus(rec.get("Gres", ""))
        used, _ = gres_gpus(rec.get("GresUsed", ""))
        labels: dict[str, str] = {}
        features = [f for f in _nullable(rec.get("AvailableFeatures", "")).split(",") if f]
        plain = []
        for feat in features:
            key, eq, value = feat.partition("=")
            if eq and key.startswith("suanli.io/"):
                labels[key] = value
            else:
                plain.append(feat)
        model = (catalog_gpu(labels[GPU]) if GPU in labels else None) or (catalog_gpu(gtype) if gtype else None)
        labels.pop(GPU, None)
        if model:
            labels[GPU] = model
        if parts:
            labels[PARTITIONS] = ",".join(parts)
        if plain:
            labels[FEATURES] = ",".join(plain)
        labels.update((topology or {}).get(name, {}))
        state = rec.get("State", "UNKNOWN")
        dead = state_dead(state)
        reason = _nullable(rec.get("Reason", ""))
        out.append(EngineNode(
            name=name, host=name, address=_nullable(rec.get("NodeAddr", "")) or name, gpu_count=gpus,
            gpu_model=model, cpu_count=_int(rec.get("CPUEfctv") or rec.get("CPUTot")),
            memory_mib=_int(rec.get("RealMemory")), alive=not dead, labels=labels,
            busy_gpus=max(0, used - (own or {}).get(name, 0)),
            reason=f"Slurm state {state}" + (f": {reason}" if reason else "") if dead else "",
        ))  # fmt: skip
    return out


def _nullable(value: str) -> str:
    return "" if value in ("(null)", "N/A", "None") else value


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


# -- jobs: the states `scontrol -o show job` reports ----------------------------------------------------

PENDING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT", "RESV_DEL_HOLD"}
ACTIVE = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "RESIZING", "SIGNALING", "STAGE_OUT",
          "POWER_UP_NODE"}  # fmt: skip
LOST_STATES = {"NODE_FAIL": "node failure", "BOOT_FAIL": "node boot failure", "PREEMPTED": "preempted"}
LOST_REASONS = {"NodeDown": "node failure", "BootFail": "node boot failure"}


@dataclass(frozen=True)
class JobView:
    """A job's state over all its components: the one that matters most (lost > pending > active > ended)."""

    state: str
    reason: str

    @property
    def lost(self) -> str:
        """Why Slurm lost the job, in words ("" when it did not): a state, or a node-down reason while completing."""
        if self.state in LOST_STATES:
            return f"{LOST_STATES[self.state]} ({self.state})"
        if self.reason in LOST_REASONS and self.state not in PENDING:
            return f"{LOST_REASONS[self.reason]} (reason {self.reason})"
        return ""


def job_view(recs: list[dict[str, str]]) -> JobView:
    """Combine the records `scontrol show job` gives for a (heterogeneous) job into one state."""
    views = [JobView(r.get("JobState", "UNKNOWN"), r.get("Reason", "None").replace(",_", ", ")) for r in recs]
    for first in (lambda v: v.lost, lambda v: v.state in PENDING, lambda v: v.state in ACTIVE,
                  lambda v: v.state != "COMPLETED"):  # fmt: skip
        for view in views:
            if first(view):
                return view
    return JobView("COMPLETED", "None")

"""Published nccl-tests all_reduce_perf outputs kept in the repository (benchmarks/data/nccl_tests_published.yaml).

They cover fabrics and systems the calibration set beside the repository lacks (GCP A3 Mega GPUDirect-TCPXO,
a B200 NVLink 5 node), so this table runs in a plain clone too. Each system is described by its hardware
only (GPU, nodes, NICs, fabric); the model never sees the measured value. Sizes below 1 MiB are skipped
(latency-bound; the targets are for busbw).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from suanli.perf import estimate
from suanli.topology import parse

DATA = Path(__file__).resolve().parent / "data" / "nccl_tests_published.yaml"
MiB = 1 << 20


def _bytes(label: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG])", label)
    if m is None:
        raise ValueError(f"size label {label!r} is not like 8M")
    return int(m[1]) << {"K": 10, "M": 20, "G": 30}[m[2]]


def published_rows(row_type: type, path: Path = DATA) -> list:
    """One `row_type(table, what, measured, predicted, unit, detail)` per published size >= 1 MiB."""
    doc = yaml.safe_load(path.read_text())
    rows = []
    for t in doc["tables"]:
        group = {
            "name": "n",
            "count": t["nodes"],
            "gpu": t["gpu"],
            "gpus_per_node": t["gpus_per_node"],
            "nics": t["nics"],
        }
        spec = {"name": t["id"], "node_groups": [group]}
        if t.get("fabric"):
            spec["fabric"] = t["fabric"]
        c = parse(spec)
        g = c.comm_group(c.compact_gpus(c.n_gpus))
        for label, bus in t["busbw_GBps"].items():
            size = _bytes(label)
            if size < MiB:
                continue
            e = estimate("all_reduce", size, g)
            rows.append(
                row_type(t["id"], f"all_reduce {label}", bus, e.busbw_GBps, "GB/s", f"{e.algorithm}/{e.protocol}")
            )
    return rows

"""Helpers shared by the CLI commands: errors, JSON output, unit parsing and formatting, system resolution."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import numpy as np
import typer
from numpy.typing import NDArray
from rich.console import Console

from suanli import catalog, topology
from suanli.catalog import CatalogError, GPUSpec
from suanli.cli.terminal import SafeConsole, visible
from suanli.perf import (
    Placement,
)
from suanli.topology import Cluster
from suanli.topology.spec import default_intra


def _console() -> Console:
    """Rich output on stdout; when that is not a terminal (a pipe, a file, a test), 120 columns instead of 80.
    Control and invisible characters of what it renders are shown as escapes (`cli/terminal.py`)."""
    out = SafeConsole()
    return out if out.is_terminal or "COLUMNS" in os.environ else SafeConsole(width=120)


console = _console()

EXIT_BAD_INPUT = 2
DEFAULT_GPU = "H100-SXM"
DEFAULT_FABRIC_KIND = "infiniband"
DEFAULT_NIC_GBPS = 400.0
NVL72_GPUS = 72

# ---- options shared by several commands --------------------------------------------------------------
_S = "System (a --cluster, or a homogeneous system built from the flags)"
_CLUSTER = "Cluster preset name, NxG[:MODEL] shorthand (e.g. 16x8:H100) or a cluster YAML file."
_NICS = "Scale-out NICs per node (default: one per GPU on NVLink boards, else 1)."
_FABRIC = f"Scale-out fabric kind: infiniband|ib|roce|ethernet|efa|tcpx|tcpxo (default: {DEFAULT_FABRIC_KIND})."

JsonOpt = Annotated[bool, typer.Option("--json", help="Print exactly one JSON document on stdout.")]
ClusterOpt = Annotated[
    str | None, typer.Option("--cluster", "-c", metavar="NAME|FILE", help=_CLUSTER, rich_help_panel=_S)
]
GpuOpt = Annotated[str | None, typer.Option("--gpu", help=f"GPU model (default: {DEFAULT_GPU}).", rich_help_panel=_S)]
NodesOpt = Annotated[int | None, typer.Option("--nodes", help="Number of nodes.", rich_help_panel=_S)]
GpusOpt = Annotated[
    int | None, typer.Option("--gpus", help="Number of GPUs (default: all of them).", rich_help_panel=_S)
]
GpnOpt = Annotated[
    int | None, typer.Option("--gpus-per-node", help="GPUs per node (default: 8; GB200/GB300: 4).", rich_help_panel=_S)
]
IntraOpt = Annotated[
    str | None, typer.Option("--intra", help="nvlink4, nvl72, pcie5 … (default: from the GPU)", rich_help_panel=_S)
]
NicsOpt = Annotated[int | None, typer.Option("--nics", help=_NICS, rich_help_panel=_S)]
NicGbpsOpt = Annotated[
    float | None, typer.Option("--nic-gbps", help="NIC port rate, Gbit/s (default: 400).", rich_help_panel=_S)
]
FabricOpt = Annotated[str | None, typer.Option("--fabric", help=_FABRIC, rich_help_panel=_S)]


# ---- errors and output ----------------------------------------------------------------------------------
def one_line(message: object) -> str:
    """A message as one line fit for a terminal: whitespace folded, control and invisible characters escaped (a
    server's words reach it here, and an escape sequence in them would act on the terminal)."""
    return visible(" ".join(str(message).split()), keep="")


def fail(message: str) -> NoReturn:
    """Report bad input as one line on stderr and exit with code 2."""
    typer.echo(f"error: {one_line(message)}", err=True)
    raise typer.Exit(EXIT_BAD_INPUT)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the core's input errors (unknown names, bad specs, impossible plans, unreadable files) into `fail`."""
    try:
        yield
    except CatalogError as e:
        fail(str(e))
    except OSError as e:
        fail(f"{e.strerror or e}: {e.filename}" if e.filename else str(e))
    except ValueError as e:  # SpecError, PlanError, model and precision errors
        fail(str(e))


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, np.generic):
        return _finite(value.item())
    return value


def emit_json(doc: Any) -> None:
    typer.echo(json.dumps(_finite(doc), indent=2, allow_nan=False))


def check_choice(value: str, choices: tuple[str, ...] | list[str], option: str) -> str:
    norm = value.strip().lower().replace("-", "_") if option == "--op" else value.strip().lower()
    if norm not in choices:
        fail(f"invalid {option} {value!r}; choose one of: {', '.join(choices)}")
    return norm


def check_positive(value: int | float | None, option: str) -> None:
    if value is not None and value <= 0:
        fail(f"{option} must be positive (got {value:g})")


# ---- units -------------------------------------------------------------------------------------------------
_SIZE = re.compile(r"^(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[kmgtp]?)(?P<i>i?)(?P<b>b?)$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_size(text: str) -> int:
    """Bytes from `8`, `8B`, `1K`/`1KiB` (1024), `1KB` (1000), `1MiB`, `8GiB` … (K, M, G alone are binary)."""
    m = _SIZE.match(text.strip())
    if not m or (m["i"] and not m["unit"]):
        raise ValueError(
            f"invalid size {text!r}: give bytes or a K/M/G/T suffix, e.g. 8, 4096, 1KiB, 1MiB, 8GiB (KB/MB/GB = 1000-based)"
        )
    power = _POWERS[m["unit"].lower()]
    decimal = bool(m["b"]) and not m["i"] and power > 0
    value = float(m["num"]) * (1000 if decimal else 1024) ** power
    if abs(value - round(value)) > 1e-6:
        raise ValueError(f"invalid size {text!r}: not a whole number of bytes")
    return round(value)


_COUNT = re.compile(r"^(?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)\s*(?P<unit>[kmbgt]?)$", re.IGNORECASE)
_COUNT_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str, option: str = "--tokens") -> float:
    """A positive count such as `1e9`, `300B`, `15T`, `2.5M` or `1_000_000` (decimal suffixes)."""
    m = _COUNT.match(text.strip().replace("_", ""))
    if not m:
        fail(f"invalid {option} {text!r}: give a number such as 1e9, 300B or 15T")
    value = float(m["num"]) * _COUNT_UNITS[m["unit"].lower()]
    if value <= 0:
        fail(f"{option} must be positive")
    return value


def default_sizes() -> list[int]:
    """8 B to 8 GiB in x8 steps (the shape of an nccl-tests sweep)."""
    return [8**k for k in range(1, 12)]


def human_size(n: int) -> str:
    for unit, power in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << power:
            v = n / (1 << power)
            return f"{v:g} {unit}" if v == int(v) else f"{v:.2f} {unit}"
    return f"{n} B"


def human_time_us(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.3g} s"
    if us >= 1e3:
        return f"{us / 1e3:.3g} ms"
    return f"{us:.3g} us"


def human_duration(seconds: float) -> str:
    for unit, span in (("d", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0)):
        if seconds >= span:
            v = seconds / span
            return f"{v:,.0f} {unit}" if v >= 100 else f"{v:.3g} {unit}"
    return f"{seconds:.3g} s"


def human_count(n: float) -> str:
    for unit, span in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= span:
            return f"{n / span:.3g}{unit}"
    return f"{n:.3g}"


# ---- systems -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class System:
    """A cluster and the GPUs (rank order) a command runs on."""

    cluster: Cluster
    gpus: NDArray[np.int64]

    @property
    def n_gpus(self) -> int:
        return int(self.gpus.size)

    @property
    def n_nodes(self) -> int:
        return int(np.unique(self.cluster.gpu_node[self.gpus]).size)

    @property
    def n_domains(self) -> int:
        return int(np.unique(self.cluster.node_domain[self.cluster.gpu_node[self.gpus]]).size)

    @property
    def gpu(self) -> GPUSpec:
        return self.cluster.group_of(int(self.cluster.gpu_node[self.gpus[0]])).gpu

    @property
    def placement(self) -> Placement:
        return Placement(self.cluster, self.gpus)

    def describe(self) -> str:
        c = self.cluster
        used = sorted({int(g) for g in c.node_group[np.unique(c.gpu_node[self.gpus])]})
        parts = []
        for i in used:
            g = c.groups[i]
            nic = f", {g.nics}x {g.nic_Gbps:g}G NICs" if g.nics and c.n_nodes > 1 else ""
            parts.append(f"{g.gpus_per_node}x {g.gpu.name}/node ({g.intra.name}{nic})")
        fabric = f", {c.fabric.name}" if c.fabric is not None and self.n_nodes > 1 else ""
        nodes = f"{self.n_nodes:,} node{'s' if self.n_nodes != 1 else ''}"
        return f"{c.name}: {self.n_gpus:,} GPUs on {nodes}, {'; '.join(parts)}{fabric}"


def load_cluster(ref: str) -> Cluster:
    """A preset name, the `NxG[:MODEL]` shorthand, or a path to a cluster YAML file."""
    path = Path(ref).expanduser()
    if ref not in topology.PRESETS and path.is_file():
        return topology.resolve(ref, lambda _: path.read_text(encoding="utf-8"))
    if ref.endswith((".yaml", ".yml", ".json")) or "/" in ref or "\\" in ref:
        fail(f"cluster file {ref!r} not found (and not a preset: {', '.join(topology.preset_names())})")
    return topology.resolve(ref)


def default_gpus_per_node(gpu: GPUSpec) -> int:
    return 4 if gpu.nvlink_domain_size >= NVL72_GPUS else 8


def homogeneous_cluster(
    gpu: str,
    nodes: int,
    gpus_per_node: int | None = None,
    intra: str | None = None,
    nics: int | None = None,
    nic_gbps: float | None = None,
    fabric: str | None = None,
) -> Cluster:
    """`nodes` identical nodes under one fabric, via `topology.parse` (NVL72 links get 72-GPU domains)."""
    spec = catalog.gpu(gpu)
    gpn = gpus_per_node or default_gpus_per_node(spec)
    link = catalog.link(intra) if intra else default_intra(spec, gpn)
    domain_nodes = max(1, NVL72_GPUS // gpn) if link.name == "nvl72" else 1
    nic_rate = DEFAULT_NIC_GBPS if nic_gbps is None else nic_gbps
    group = {
        "name": spec.name.lower(),
        "count": nodes,
        "gpu": spec.name,
        "gpus_per_node": gpn,
        "intra": link.name,
        "nics": (gpn if spec.nvlink is not None else 1) if nics is None else nics,
        "nic_gbps": nic_rate,
        "nvlink_domain_nodes": domain_nodes,
    }
    return topology.parse(
        {
            "name": f"{nodes}x{gpn}:{spec.name}",
            "node_groups": [group],
            "fabric": {"kind": fabric or DEFAULT_FABRIC_KIND, "nic_gbps": nic_rate},
            "nodes_per_leaf": 32,
        }
    )


def resolve_system(
    *,
    cluster: str | None,
    gpu: str | None = None,
    nodes: int | None = None,
    gpus: int | None = None,
    gpus_per_node: int | None = None,
    intra: str | None = None,
    nics: int | None = None,
    nic_gbps: float | None = None,
    fabric: str | None = None,
) -> System:
    """The system a command runs on: a cluster (most compact placement) or a homogeneous one from flags."""
    for value, option in (
        (nodes, "--nodes"),
        (gpus, "--gpus"),
        (gpus_per_node, "--gpus-per-node"),
        (nic_gbps, "--nic-gbps"),
    ):
        check_positive(value, option)
    if nics is not None and nics < 0:
        fail("--nics must be >= 0")
    if cluster is not None:
        flags = {"--gpu": gpu, "--intra": intra, "--nics": nics, "--nic-gbps": nic_gbps, "--fabric": fabric}
        given = [k for k, v in flags.items() if v is not None]
        if given:
            fail(
                f"{', '.join(given)} {'describes' if len(given) == 1 else 'describe'} a homogeneous system; not allowed with --cluster"
            )
        c = load_cluster(cluster)
        if gpus is not None:
            count = gpus
        elif nodes is not None:
            count = nodes * (gpus_per_node or c.groups[0].gpus_per_node)
        else:
            count = c.n_gpus
        return System(c, c.compact_gpus(count))
    spec = catalog.gpu(gpu or DEFAULT_GPU)
    gpn = gpus_per_node or default_gpus_per_node(spec)
    if nodes is None:
        nodes = -(-gpus // gpn) if gpus else 1
    if gpus is not None and gpus > nodes * gpn:
        fail(f"--gpus {gpus} does not fit on {nodes} nodes x {gpn} GPUs")
    c = homogeneous_cluster(spec.name, nodes, gpn, intra, nics, nic_gbps, fabric)
    return System(c, c.compact_gpus(gpus or c.n_gpus))


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"

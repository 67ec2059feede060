"""Name resolution over the packaged catalog files.

The files ship inside the package and never change at run time, so they are parsed once and cached;
that is the only state this module keeps.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import TypeVar

import yaml

from suanli.catalog.models import FabricSpec, GPUSpec, IntraNodeLinkSpec


class CatalogError(LookupError):
    """An unknown hardware name; the message lists the known ones."""


T = TypeVar("T", GPUSpec, FabricSpec, IntraNodeLinkSpec)


def _normalise(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


@cache
def _load(filename: str) -> dict:
    text = resources.files("suanli.catalog").joinpath("data", filename).read_text(encoding="utf-8")
    return yaml.safe_load(text)


@cache
def sources() -> dict[str, str]:
    """Source key → citation (URL or reference) for every figure in the catalog."""
    return dict(_load("sources.yaml")["sources"])


def _index(items: tuple[T, ...]) -> dict[str, T]:
    out: dict[str, T] = {}
    for item in items:
        for key in (item.name, *item.aliases):
            norm = _normalise(key)
            if norm in out and out[norm] is not item:
                raise ValueError(f"catalog alias {key!r} names both {out[norm].name} and {item.name}")
            out[norm] = item
    return out


@cache
def all_gpus() -> tuple[GPUSpec, ...]:
    return tuple(GPUSpec.model_validate(g) for g in _load("gpus.yaml")["gpus"])


@cache
def all_fabrics() -> tuple[FabricSpec, ...]:
    return tuple(FabricSpec.model_validate(f) for f in _load("fabrics.yaml")["fabrics"])


@cache
def all_links() -> tuple[IntraNodeLinkSpec, ...]:
    return tuple(IntraNodeLinkSpec.model_validate(x) for x in _load("links.yaml")["links"])


@cache
def _gpu_index() -> dict[str, GPUSpec]:
    return _index(all_gpus())


@cache
def _fabric_index() -> dict[str, FabricSpec]:
    return _index(all_fabrics())


@cache
def _link_index() -> dict[str, IntraNodeLinkSpec]:
    return _index(all_links())


def _resolve(kind: str, name: str, index: dict[str, T], items: tuple[T, ...]) -> T:
    found = index.get(_normalise(name))
    if found is None:
        known = ", ".join(i.name for i in items)
        raise CatalogError(f"unknown {kind} {name!r}; known {kind}s: {known}")
    return found


def gpu(name: str) -> GPUSpec:
    """Look up a GPU model by name or alias (case-insensitive): `h100`, `H100-80G`, `4090` …"""
    return _resolve("GPU", name, _gpu_index(), all_gpus())


def fabric(name: str) -> FabricSpec:
    """Look up a scale-out fabric by name or alias: `ib-ndr`, `roce-800`, `eth-25` …"""
    return _resolve("fabric", name, _fabric_index(), all_fabrics())


def link(name: str) -> IntraNodeLinkSpec:
    """Look up an intra-node link by name or alias: `nvlink4`, `pcie4`, `nvl72` …"""
    return _resolve("intra-node link", name, _link_index(), all_links())


FABRIC_KIND_ALIASES = {
    "ib": "infiniband",
    "infiniband": "infiniband",
    "roce": "roce",
    "rocev2": "roce",
    "roce-v2": "roce",
    "ethernet": "ethernet",
    "eth": "ethernet",
    "tcp": "ethernet",
    "efa": "efa",
    "tcpx": "tcpx",
    "tcpxo": "tcpxo",
    "gpudirect-tcpx": "tcpx",
    "gpudirect-tcpxo": "tcpxo",
}


def fabric_for(kind: str, port_Gbps: float) -> FabricSpec:
    """The catalog fabric of a technology (`infiniband`, `roce`, `ethernet`, `efa`, `tcpx`, `tcpxo`) at a port rate.

    Falls back to the closest rate of the same technology, scaled to the requested rate, so an operator's
    `--nic-gbps 200 --fabric efa` still gets EFA's latencies and efficiency.
    """
    norm = FABRIC_KIND_ALIASES.get(_normalise(kind))
    if norm is None:
        raise CatalogError(
            f"unknown fabric kind {kind!r}; known kinds: {', '.join(sorted(set(FABRIC_KIND_ALIASES.values())))}"
        )
    same = [f for f in all_fabrics() if f.kind == norm]
    if not same:
        raise CatalogError(f"no {norm} fabric in the catalog")
    best = min(same, key=lambda f: (abs(f.port_Gbps - port_Gbps), -f.port_Gbps))
    if best.port_Gbps == port_Gbps:
        return best
    return best.model_copy(update={"name": f"{norm}-{port_Gbps:g}g", "port_Gbps": float(port_Gbps), "aliases": ()})

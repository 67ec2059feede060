"""Hardware facts as data: GPU models, scale-out fabrics and intra-node links, each figure with a source.

The YAML files under `data/` are the single place these numbers live; this package parses them once into
frozen Pydantic records and resolves user-facing names and aliases.
"""

from suanli.catalog.lookup import (
    CatalogError,
    all_fabrics,
    all_gpus,
    all_links,
    fabric,
    fabric_for,
    gpu,
    link,
    sources,
)
from suanli.catalog.models import PRECISIONS, FabricSpec, GPUSpec, IntraNodeLinkSpec, Precision

__all__ = [
    "PRECISIONS",
    "CatalogError",
    "FabricSpec",
    "GPUSpec",
    "IntraNodeLinkSpec",
    "Precision",
    "all_fabrics",
    "all_gpus",
    "all_links",
    "fabric",
    "fabric_for",
    "gpu",
    "link",
    "sources",
]

"""suanli (算力): a self-hosted GPU compute-leasing platform with a topology-aware scheduler."""

__version__ = "0.1.0"

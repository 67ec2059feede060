"""suanli (算力): a self-hosted GPU compute-leasing platform with a topology-aware scheduler."""

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """`suanli.Client` and `suanli.ApiError`, imported on first use so `import suanli` stays cheap."""
    if name in ("Client", "ApiError"):
        from suanli import client

        return getattr(client, name)
    raise AttributeError(f"module 'suanli' has no attribute {name!r}")

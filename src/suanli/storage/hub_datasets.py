"""A hub dataset prepared the way `datasets` reads it offline.

With `HF_HUB_OFFLINE=1`, `datasets.load_dataset("ORG/NAME")` does not look at the repository in `HF_HUB_CACHE`: it
reads a dataset prepared before, from `HF_DATASETS_CACHE/ORG___NAME/<config>/<version>/<hash>/` (Arrow files and
`dataset_info.json`), through its `cache` builder. So the hub prepares every configuration of a dataset once, when
the operator adds it, with the builder `datasets` itself picks for the repository's files (Parquet, CSV, JSON, …),
and tenants' sandboxes bind that folder read-only. The Arrow copy is the second copy of a dataset's data on the
hub's disk: the price of loading it with no network.

Imported only when a dataset is added (needs `datasets`: `pip install 'suanli[hub]'`).
"""

from __future__ import annotations

from pathlib import Path


def prepared_name(repo_id: str) -> str:
    """The folder `datasets` looks for: ORG___name, the name in its snake case (`datasets.naming`)."""
    from datasets.naming import camelcase_to_snakecase

    org, name = repo_id.split("/")
    return f"{org}___{camelcase_to_snakecase(name)}"


def prepare(snapshot: Path, repo_id: str, out: Path) -> tuple[Path, str]:
    """Prepare every configuration of the dataset in `snapshot` under `out`; returns (the built folder, its name in
    HF_DATASETS_CACHE). Raises HubError when `datasets` is missing or cannot read the files."""
    from suanli.storage.hub import HubError

    try:
        from datasets.load import dataset_module_factory, get_dataset_builder_class
        from datasets.naming import camelcase_to_snakecase
    except ImportError:
        raise HubError("adding a dataset needs the datasets package on the server: pip install 'suanli[hub]'") from None
    name = repo_id.split("/")[1]
    try:
        module = dataset_module_factory(str(snapshot))
        kwargs = dict(module.builder_kwargs)
        kwargs.pop("dataset_name", None)
        builder_cls = get_dataset_builder_class(module, dataset_name=name)
        configs = module.builder_configs_parameters.builder_configs or []
        for config in [c.name for c in configs] or [None]:
            builder = builder_cls(cache_dir=str(out), dataset_name=name, config_name=config, hash=module.hash,
                                  **kwargs)  # fmt: skip
            builder.download_and_prepare()
    except Exception as e:  # the files are not a dataset `datasets` can read
        why = " ".join(str(e).split())[:300]
        raise HubError(f"datasets cannot prepare {repo_id} from its files ({type(e).__name__}: {why})") from None
    built = out / camelcase_to_snakecase(name)
    for lock in built.rglob("*.lock"):  # left by the builder; a reader makes its own where it can write
        lock.unlink()
    return built, prepared_name(repo_id)

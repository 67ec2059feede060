"""Serving runtimes as adapters: each builds a replica's command line, its environment, the health probe that says
it is ready, and the `model` name its API expects. The runtimes themselves (vLLM, Hugging Face `transformers
serve`) are real programs run in the replica's sandbox; nothing here serves a model.

Adding a runtime is one small class here and its name in `RUNTIMES`. Pure: no I/O.
"""

from __future__ import annotations

import shlex
from abc import ABC, abstractmethod
from dataclasses import dataclass

from suanli.serving import replica_guard


@dataclass(frozen=True)
class Replica:
    """What a runtime needs to know about the replica it runs: the model (its repository id, loaded from the hub's
    cache offline), the name it is served as (the endpoint's), its port on the sandbox's loopback, its GPUs, and the
    secret every request but the probe must carry (`replica_guard`; none: unguarded, as before secrets existed)."""

    repo_id: str
    served_name: str
    port: int
    gpus: int
    max_model_len: int | None = None
    key: str = ""


class Runtime(ABC):
    """The adapter interface."""

    name = ""
    probe_path = "/v1/models"  # GET; a 200 means the model is loaded and requests are served

    @abstractmethod
    def argv(self, r: Replica) -> list[str]:
        """The runtime's own command line for one replica."""

    def command(self, r: Replica) -> str:
        """What the replica runs: the runtime's command line, under the guard when the replica has a secret."""
        argv = self.argv(r)
        return replica_guard.command(argv) if r.key else "exec " + shlex.join(argv)

    def own_env(self, r: Replica) -> dict[str, str]:
        return {}

    def env(self, r: Replica) -> dict[str, str]:
        return {**self.own_env(r), **(replica_guard.env(r.key, self.probe_path) if r.key else {})}

    def upstream_model(self, r: Replica) -> str:
        """What the request's `model` becomes on its way to the replica (clients name the endpoint)."""
        return r.served_name

    def serves(self, route: str) -> bool:
        """Whether the runtime answers this OpenAI route (`chat/completions`, `completions`, `embeddings`)."""
        return True


class Vllm(Runtime):
    """`vllm serve`: on GPUs, tensor-parallel over the replica's GPUs, listening on loopback only, the model named
    as the endpoint so its answers carry that name."""

    name = "vllm"
    probe_path = "/health"

    def argv(self, r: Replica) -> list[str]:
        argv = ["vllm", "serve", r.repo_id, "--host", "127.0.0.1", "--port", str(r.port),
                "--served-model-name", r.served_name, "--tensor-parallel-size", str(max(1, r.gpus))]  # fmt: skip
        if r.max_model_len is not None:
            argv += ["--max-model-len", str(r.max_model_len)]
        return argv

    def own_env(self, r: Replica) -> dict[str, str]:
        return {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


class Transformers(Runtime):
    """Hugging Face `transformers serve`, the model preloaded (`FORCE_MODEL`): small models, CPU replicas, tests. It
    knows the model by its repository id, and has no embeddings route."""

    name = "transformers"
    probe_path = "/health"

    def argv(self, r: Replica) -> list[str]:
        device = "auto" if r.gpus > 0 else "cpu"
        return ["transformers", "serve", r.repo_id, "--host", "127.0.0.1", "--port", str(r.port),
                "--device", device, "--log-level", "warning"]  # fmt: skip

    def own_env(self, r: Replica) -> dict[str, str]:
        return {"HF_HUB_DISABLE_TELEMETRY": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}

    def upstream_model(self, r: Replica) -> str:
        return r.repo_id

    def serves(self, route: str) -> bool:
        return route != "embeddings"


RUNTIMES: dict[str, Runtime] = {rt.name: rt for rt in (Vllm(), Transformers())}


def runtime(name: str) -> Runtime:
    try:
        return RUNTIMES[name]
    except KeyError:
        raise ValueError(f"runtime: unknown {name!r}; known: {', '.join(RUNTIMES)}") from None

"""Who runs sandboxed, in what: the sandbox a workload's ranks get from the server's settings and the spec.

Tenant work always runs in a sandbox; the operator's own work (an admin's) runs unsandboxed only when the operator
opted in with `sandbox: off`. `image: NAME` binds a published environment read-only; without one, the default
environment (the server's own Python unless the operator says otherwise) is bound, so `python` works inside.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from suanli.control.errors import Invalid
from suanli.control.settings import Settings
from suanli.executors.base import SandboxRequest
from suanli.sandbox.bwrap import bwrap_path, require_bwrap
from suanli.workloads.spec import WorkloadSpec

SYSTEM_PREFIXES = ("/usr/", "/opt/")  # already in every sandbox (read-only)


def server_python() -> tuple[str, ...]:
    """The prefixes of the Python the server runs on (a venv and the interpreter it was made from), outside /usr."""
    paths = {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
    return tuple(sorted(p for p in paths if not (p + "/").startswith(SYSTEM_PREFIXES)))


@dataclass(frozen=True)
class SandboxPolicy:
    """The server's sandbox settings (`control.settings.Settings`), as the supervisor applies them."""

    mode: str = "on"  # off: admins' work unsandboxed
    environments: dict[str, str] = field(default_factory=dict)
    default_environment: str = "server"
    gpu_dev_root: str = "/dev"
    cgroup_parent: str | None = None
    hub_dir: Path | None = None  # None: hub/ in the data directory
    network: str = "host"  # what `network: auto` gets on one node without ports (`resolve_network`)

    def sandboxed(self, is_admin: bool) -> bool:
        return not (is_admin and self.mode == "off")

    def check_image(self, spec: WorkloadSpec) -> None:
        """Refuse an `image:` nobody published (at submission: a 422 naming the field)."""
        if spec.image is not None and spec.image not in self.environments:
            known = ", ".join(sorted(self.environments)) or "none are published"
            raise Invalid(f"image: no environment called {spec.image!r} ({known})")

    def check_jupyter(self, spec: WorkloadSpec) -> None:
        """Refuse `jupyter: true` when the instance's environment has no `jupyter` to run (a 422 naming the field)."""
        if not spec.jupyter:
            return
        env, _ = self._prefixes(spec)
        if env is None or env.startswith("oci:"):
            return  # the host's system directories, or an image: nothing to look into from here
        bins = [os.path.join(env, "bin"), os.path.join(env, "usr", "bin"), os.path.join(env, "usr", "local", "bin")]
        if spec.image is None and self.default_environment == "server":
            bins += ["/usr/local/bin", "/usr/bin"]
        if not any(os.access(os.path.join(b, "jupyter"), os.X_OK) for b in bins):
            where = f"environment {spec.image!r}" if spec.image else f"the default environment ({env})"
            raise Invalid(f"jupyter: JupyterLab is not installed in {where}; install jupyterlab there "
                          "(pip install 'suanli[jupyter]' for the server's own), or publish an environment that has it")  # fmt: skip

    def _prefixes(self, spec: WorkloadSpec) -> tuple[str | None, tuple[str, ...]]:
        """(the environment on PATH, more prefixes to bind read-only)."""
        if spec.image is not None:
            self.check_image(spec)
            return self.environments[spec.image], ()
        if self.default_environment == "none":
            return None, ()
        if self.default_environment == "server":
            prefixes = server_python()
            venv = os.path.realpath(sys.prefix)
            env = venv if sys.prefix != sys.base_prefix else None
            return env, tuple(p for p in prefixes if p != env)
        return self.default_environment, ()

    def request(self, spec: WorkloadSpec, uid: int, is_admin: bool) -> SandboxRequest | None:
        """The sandbox of the workload's node-ranks, run (by a root server) as `uid`, its org's
        (`control.accounts.sandbox_uids`); None: unsandboxed.

        Raises SandboxError when tenant work would have to run unsandboxed (no bubblewrap on this node)."""
        if not self.sandboxed(is_admin):
            return None
        require_bwrap()
        cpu, mem = spec.host_request()  # the workload's; each rank gets its share per GPU (`host_request(n)`)
        ask = spec.gpu_count()
        env, extra = self._prefixes(spec)
        return SandboxRequest(
            cpu_milli=cpu, memory_mib=mem, gpus_asked=ask, network=spec.network, environment=env,
            mounts=tuple((p, p, False) for p in extra), uid=uid, gid=uid, dev_root=self.gpu_dev_root,
            cgroup_parent=self.cgroup_parent,
        )  # fmt: skip

    def startup_note(self) -> str:
        """What `suanli up` / `suanli server` say about sandboxing at start."""
        if bwrap_path() is None:
            return ("WARNING: bubblewrap is not installed (apt install bubblewrap): tenant workloads cannot run on "
                    "this host" + ("; the operator's own run unsandboxed (sandbox: off)" if self.mode == "off" else ""))  # fmt: skip
        if self.mode == "off":
            note = "sandbox: off — the operator's own workloads run unsandboxed, as the server's user; tenants' are sandboxed"
        else:
            note = "every workload runs in a bubblewrap sandbox"
        if self.network == "private":
            from suanli.sandbox.netns import pasta_path

            if pasta_path() is None:
                return note + ("\nWARNING: network: private is the default, but pasta is not installed (apt install "
                               "passt): single-node work that names no network cannot start on this host")  # fmt: skip
            return note + "; single-node work that names no network gets its own (network: private)"
        return note


def sandbox_policy(settings: Settings) -> SandboxPolicy:
    return SandboxPolicy(
        mode=settings.sandbox, environments=dict(settings.environments),
        default_environment=settings.default_environment, gpu_dev_root=settings.gpu_dev_root,
        cgroup_parent=settings.cgroup_parent, hub_dir=settings.hub_dir, network=settings.network,
    )  # fmt: skip


def resolve_network(
    network: str, nodes: int, ports: tuple[int, ...], default: str, ports_reachable: bool = False
) -> str:
    """The network a rank's sandbox gets: what the spec names, or for `auto` the operator's default where the work
    can have it (placed on at most one node; its `ports:`, if any, reachable by the proxy in a namespace of its
    own: a root server's local executor), else the host's."""
    if network != "auto":
        return network
    return default if nodes <= 1 and (not ports or ports_reachable) else "host"


def gpu_share_limits(req: SandboxRequest, nodes: list[tuple[int, int, int]]) -> SandboxRequest:
    """GPU work that asks for no host cores (or memory) is still bounded: by its GPUs' share of its nodes' (per GPU,
    the least any of its nodes has: cores or MiB over GPUs; times the GPUs asked, so each rank gets its share per GPU),
    as a cloud's GPU instance sizes are. A limit, not an ask: nothing more is reserved, billed or asked of Ray or Slurm. `nodes`: (cores,
    MiB, GPUs) of each node it runs on; one that states none of a kind gives no default of that kind."""
    if req.gpus_asked <= 0 or not nodes:
        return req

    def share(per_node: list[int]) -> int:
        return min(per_node) * req.gpus_asked if all(v > 0 for v in per_node) else 0

    cpu = 0 if req.cpu_milli else share([c * 1000 // g if g > 0 else 0 for c, _, g in nodes])
    mem = 0 if req.memory_mib else share([m // g if g > 0 else 0 for _, m, g in nodes])
    return replace(req, share_cpu_milli=cpu, share_memory_mib=mem)

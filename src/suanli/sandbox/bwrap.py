"""The bubblewrap command line of one node-rank's sandbox.

bubblewrap (`bwrap`, the tool Flatpak builds on) gives the rank new user, mount, PID, IPC and UTS namespaces, a
root filesystem of read-only host system directories plus what the rank may write (its workdir at /workspace, a
private /tmp and /dev/shm, the spec's mounts), only the GPU device nodes it was given, and the host's network, a private one or none.
Nothing else of the host is mounted: the server's data directory, other workloads' files and logs do not exist
inside. Capabilities are dropped and `no_new_privs` is set by bwrap itself, so nothing inside regains root.

This module only builds argument lists; `suanli.executors.rankrun` runs them.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

WORKSPACE = "/workspace"
RUN_BYTES = 16 << 20  # /run holds the env file and sockets
CGROUP_DIR = "/sys/fs/cgroup"
CGROUP_DIR_BYTES = 64 << 10  # an empty directory with the rank's own cgroup(s) bound in
# Device nodes every CUDA process needs besides its own /dev/nvidiaN (and MIG capability nodes when present).
GPU_CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
# Host directories a process needs to run programs; mounted read-only. /etc is kept whole (resolv.conf, passwd,
# certificates), so an operator must keep secrets out of world-readable files there (docs/isolation.md).
SYSTEM_DIRS = ("/usr", "/etc", "/sys", "/opt")
MERGED_USR_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Where the sandbox's uids start when the server runs as root: one uid per org above every system and login user.
SANDBOX_UID_BASE = 0x10000000
SANDBOX_UID_SPAN = 1 << 24


class SandboxError(RuntimeError):
    """The sandbox cannot be built on this node (bubblewrap missing, a mount source gone)."""


@dataclass(frozen=True)
class Mount:
    """A host path bound into the sandbox at `dest` (read-only unless `writable`)."""

    source: str
    dest: str
    writable: bool = False


@dataclass(frozen=True)
class SandboxSpec:
    """What one node-rank's sandbox holds. Paths are the host's."""

    workdir: str
    hostname: str = "suanli"
    gpus: tuple[int, ...] = ()
    dev_root: str = "/dev"
    network: str = "host"  # host | private (own namespace, pasta for the way out) | none (loopback only)
    environment: str | None = None  # a published prefix (venv, conda), bound read-only at its own path
    rootfs: str | None = None  # a published root filesystem (a directory, or a mounted OCI image): `/`, read-only
    mounts: tuple[Mount, ...] = ()
    tmp_bytes: int | None = None  # size of the private /tmp and /dev/shm (tmpfs pages are memory)
    extra_ro: tuple[str, ...] = field(default_factory=tuple)  # more host paths read-only at their own place
    # The rank's own cgroup(s) as (host path, path under /sys/fs/cgroup): all the sandbox sees of the host's tree.
    cgroup_view: tuple[tuple[str, str], ...] = ()


def bwrap_path() -> str | None:
    """The bwrap binary, or None when bubblewrap is not installed."""
    return shutil.which("bwrap")


def require_bwrap() -> str:
    path = bwrap_path()
    if path is None:
        raise SandboxError(
            "bubblewrap is not installed on this node (Debian/Ubuntu: apt install bubblewrap); "
            "tenant work does not run unsandboxed"
        )
    return path


def _system_args() -> list[str]:
    args: list[str] = []
    for link in MERGED_USR_LINKS:
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    for d in SYSTEM_DIRS:
        args += ["--ro-bind-try", d, d]
    # resolv.conf is often a link into /run (systemd-resolved, NetworkManager).
    args += ["--ro-bind-try", "/run/systemd/resolve", "/run/systemd/resolve"]
    return args


ROOTFS_SKIP = frozenset({"proc", "dev", "tmp", "run", "var", "sys", "workspace"})  # the sandbox makes its own


def _rootfs_args(rootfs: str) -> list[str]:
    """A published root filesystem, entry by entry into bwrap's root (it has no mount points for /proc, /tmp …
    and is read-only), plus the host's /sys (GPU tools read it)."""
    args: list[str] = []
    for name in sorted(os.listdir(rootfs)):
        if name in ROOTFS_SKIP:
            continue
        path = os.path.join(rootfs, name)
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), f"/{name}"]
        else:
            args += ["--ro-bind", path, f"/{name}"]
    return [*args, "--ro-bind-try", "/sys", "/sys"]


def _cgroup_args(spec: SandboxSpec) -> list[str]:
    """/sys is the host's (GPU tools read it), but its cgroup tree names every rank on the host and shows each one's
    usage: the sandbox gets an empty read-only directory there with only its own cgroup(s) bound in. `-try`: a rank
    whose cgroup could not be made (rlimits instead) sees the directory empty."""
    args = ["--size", str(CGROUP_DIR_BYTES), "--tmpfs", CGROUP_DIR]
    for source, dest in spec.cgroup_view:
        args += ["--ro-bind-try", source, dest]
    return [*args, "--remount-ro", CGROUP_DIR]


def _device_args(spec: SandboxSpec) -> list[str]:
    root = Path(spec.dev_root)
    args = ["--dev", "/dev"]
    if not spec.gpus:
        return args
    for gpu in spec.gpus:
        args += ["--dev-bind-try", str(root / f"nvidia{gpu}"), f"/dev/nvidia{gpu}"]
    for name in GPU_CONTROL_DEVICES:
        args += ["--dev-bind-try", str(root / name), f"/dev/{name}"]
    args += ["--dev-bind-try", str(root / "nvidia-caps"), "/dev/nvidia-caps"]
    return args


def _tmpfs(dest: str, size: int | None) -> list[str]:
    return (["--size", str(size)] if size else []) + ["--tmpfs", dest]


def bwrap_args(spec: SandboxSpec, bwrap: str | None = None) -> list[str]:
    """The bwrap command line up to (not including) `--`: the caller appends `--info-fd`, `--` and the command."""
    argv = [bwrap or require_bwrap()]
    # --disable-userns: no nested user namespace, the kernel surface most container escapes went through.
    argv += ["--unshare-user", "--disable-userns", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
             "--unshare-cgroup-try"]  # fmt: skip
    if spec.network in ("none", "private"):  # private: the supervisor connects it (`suanli.sandbox.netns`)
        argv.append("--unshare-net")
    argv += ["--die-with-parent", "--new-session", "--hostname", spec.hostname]
    argv += _rootfs_args(spec.rootfs) if spec.rootfs else _system_args()
    argv += _cgroup_args(spec)
    argv += ["--proc", "/proc"]
    argv += _device_args(spec)
    # Every tmpfs is sized: its pages are memory, and unsized it would take half the host's RAM.
    argv += _tmpfs("/dev/shm", spec.tmp_bytes) + _tmpfs("/tmp", spec.tmp_bytes) + _tmpfs("/run", RUN_BYTES)
    argv += ["--dir", "/var", *_tmpfs("/var/tmp", spec.tmp_bytes)]
    for path in (None if spec.rootfs else spec.environment, *spec.extra_ro):  # after the tmpfs mounts
        if path:
            argv += ["--ro-bind", path, path]
    argv += ["--bind", spec.workdir, WORKSPACE]
    for m in spec.mounts:
        argv += ["--bind" if m.writable else "--ro-bind", m.source, m.dest]
    argv += ["--remount-ro", "/", "--chdir", WORKSPACE]  # bwrap's root tmpfs: nothing to write there
    return argv


def sandbox_env(env: dict[str, str], spec: SandboxSpec) -> dict[str, str]:
    """The job's environment adjusted to the sandbox's view: HOME is the workspace, the environment's bin first
    on PATH, no host paths that do not exist inside."""
    out = {k: v for k, v in env.items() if k != "SUANLI_LOG_DIR"}
    out["HOME"] = WORKSPACE
    out["PWD"] = WORKSPACE
    out.setdefault("TMPDIR", "/tmp")
    path = out.get("PATH") or "/usr/local/bin:/usr/bin:/bin"
    if spec.environment and not spec.rootfs:
        path = f"{spec.environment}/bin:{path}"
        out["VIRTUAL_ENV"] = spec.environment
    out["PATH"] = path
    return out


def is_rootfs(path: str) -> bool:
    """A published environment that is a whole root filesystem (it has /usr/bin and /etc), not a prefix."""
    return os.path.isdir(os.path.join(path, "usr", "bin")) and os.path.isdir(os.path.join(path, "etc"))


def oci_rootfs(image: str) -> str:
    """The root filesystem of an OCI image already loaded into the node's podman (`podman image mount`, as root)."""
    import subprocess

    podman = shutil.which("podman")
    if podman is None:
        raise SandboxError(f"image {image}: podman is not installed on this node (apt install podman)")
    try:
        out = subprocess.run([podman, "image", "mount", image], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxError(f"image {image}: podman image mount failed: {e}") from e
    path = out.stdout.strip()
    if out.returncode != 0 or not path or not os.path.isdir(path):
        raise SandboxError(f"image {image}: podman image mount failed: {out.stderr.strip()[-300:]}")
    return path

"""Volumes as a spec and the API name them: names, `name@N` references, sizes, paths inside a volume, where a
volume may be mounted in a sandbox, and the difference between two versions' manifests.

Every rule is here so the API, the CLI and the spec refuse the same things with the same words. Pure: no I/O.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, StrictBool, field_validator

NAME = re.compile(r"[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?")  # like a workload's name: safe in paths and URLs
MIN_BYTES = 1 << 20  # 1 MiB
MAX_BYTES = 1 << 50  # 1 PiB: a bound, not a promise; the operator's `volume_max_bytes` is the real one
MAX_VERSION = 1_000_000
MAX_PATH = 1024  # characters of a path inside a volume
MAX_COMPONENT = 255
MAX_DEPTH = 64
MAX_MOUNTS = 16
BACKENDS = ("local", "s3")
# Where a volume may not be mounted: the sandbox's own system directories, its workdir, and its private tmpfs.
RESERVED_TOP = frozenset(
    {
        "proc",
        "dev",
        "sys",
        "usr",
        "etc",
        "bin",
        "sbin",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "opt",
        "run",
        "tmp",
        "var",
        "workspace",
        "root",
        "boot",
        "home",
        "srv",
        "snap",
        "hub",
    }
)  # fmt: skip  (hub: where the hub's models and datasets are mounted)
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
          "tb": 10**12, "p": 10**15, "pb": 10**15, "ki": 1 << 10, "kib": 1 << 10, "mi": 1 << 20, "mib": 1 << 20,
          "gi": 1 << 30, "gib": 1 << 30, "ti": 1 << 40, "tib": 1 << 40, "pi": 1 << 50, "pib": 1 << 50}  # fmt: skip
_SIZE = re.compile(r"\s*([0-9]{1,16})\s*([A-Za-z]{0,3})\s*")


class VolumeRuleError(ValueError):
    """A name, reference, size or path that breaks a rule; the message says which."""


def check_name(name: object) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise VolumeRuleError(
            "must be 1-63 characters of lower-case letters, digits and '-', starting with a letter and not ending "
            f"with '-' (got {_brief(name)})"
        )
    return name


@dataclass(frozen=True)
class Ref:
    """`name` (the live volume) or `name@N` (its read-only version N)."""

    name: str
    version: int | None = None

    def __str__(self) -> str:
        return self.name if self.version is None else f"{self.name}@{self.version}"


def parse_ref(text: object) -> Ref:
    if not isinstance(text, str):
        raise VolumeRuleError(f"must be a volume name or NAME@VERSION (got {_brief(text)})")
    name, at, version = text.partition("@")
    check_name(name)
    if not at:
        return Ref(name)
    if not version.isdigit() or not 1 <= len(version) <= 7 or not 1 <= int(version) <= MAX_VERSION:
        raise VolumeRuleError(
            f"the version after '@' must be a whole number from 1 to {MAX_VERSION} (got {_brief(text)})"
        )
    return Ref(name, int(version))


def parse_size(value: object) -> int:
    """Bytes from `200Gi`, `500G`, `1Ti`, `1048576` (binary suffixes are powers of 1024, others of 1000)."""
    if isinstance(value, bool):
        raise VolumeRuleError(f"must be a size such as 200Gi (got {_brief(value)})")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and (m := _SIZE.fullmatch(value)) and m.group(2).lower() in _UNITS:
        n = int(m.group(1)) * _UNITS[m.group(2).lower()]
    else:
        raise VolumeRuleError(f"must be a size such as 200Gi, 500G or a number of bytes (got {_brief(value)})")
    if not MIN_BYTES <= n <= MAX_BYTES:
        raise VolumeRuleError(f"must be from 1Mi to 1Pi (got {n} bytes)")
    return n


def format_size(n: int) -> str:
    for unit, scale in (("Pi", 1 << 50), ("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n}B"


def clean_path(path: object, *, allow_root: bool = True) -> str:
    """A path inside a volume as components joined by '/' ("" is the root): relative, no `..`, no NUL, no
    component that is `.` only, bounded. Leading and repeated slashes are dropped (`/data//x` is `data/x`)."""
    if not isinstance(path, str):
        raise VolumeRuleError(f"must be a path inside the volume (got {_brief(path)})")
    if len(path) > MAX_PATH:
        raise VolumeRuleError(f"must be at most {MAX_PATH} characters")
    if "\0" in path or "\\" in path:
        raise VolumeRuleError("must not contain NUL or backslash characters")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise VolumeRuleError("must be UTF-8 text") from None
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise VolumeRuleError("must not contain '..': a path stays inside its volume")
    if any(len(p.encode()) > MAX_COMPONENT for p in parts):
        raise VolumeRuleError(f"each name in it must be at most {MAX_COMPONENT} bytes")
    if len(parts) > MAX_DEPTH:
        raise VolumeRuleError(f"must be at most {MAX_DEPTH} directories deep")
    if any(p.startswith(".suanli") for p in parts):
        raise VolumeRuleError("names starting with '.suanli' are the platform's")
    if not parts and not allow_root:
        raise VolumeRuleError("must name a file inside the volume, not its root")
    return "/".join(parts)


def check_mount_path(path: object) -> str:
    """Where a volume appears in the sandbox: an absolute, normalised path outside its system directories."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise VolumeRuleError(f"must be an absolute path such as /data (got {_brief(path)})")
    if len(path) > 255 or "\0" in path or "\\" in path or "//" in path or ":" in path:
        raise VolumeRuleError("must be at most 255 characters, without NUL, backslash, ':' or '//'")
    parts = PurePosixPath(path).parts[1:]
    if not parts or any(p in (".", "..") for p in path.split("/")[1:]) or path.endswith("/"):
        raise VolumeRuleError(f"must be a normalised path below / such as /data (got {_brief(path)})")
    if parts[0] in RESERVED_TOP:
        raise VolumeRuleError(f"/{parts[0]} is the sandbox's own; use e.g. /data, /ckpt or /mnt/NAME")
    return path


class VolumeMount(BaseModel):
    """One entry of a spec's `volumes:`: which volume (or `name@N`, a read-only version), where, and whether the
    workload may write to it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    path: str
    read_only: StrictBool = False

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        parse_ref(v)
        return v

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return check_mount_path(v)

    @property
    def ref(self) -> Ref:
        return parse_ref(self.name)

    @property
    def writable(self) -> bool:
        return not self.read_only and self.ref.version is None


def check_mounts(mounts: tuple[VolumeMount, ...]) -> None:
    """Across a spec's mounts: bounded, no path given twice or inside another."""
    if len(mounts) > MAX_MOUNTS:
        raise VolumeRuleError(f"at most {MAX_MOUNTS} volumes (got {len(mounts)})")
    paths = sorted(m.path for m in mounts)
    for a, b in itertools.pairwise(paths):
        if a == b or b.startswith(a + "/"):
            raise VolumeRuleError(
                f"{b} is {'given twice' if a == b else 'inside ' + a}; each volume needs a path of its own"
            )


# ---- versions' manifests ------------------------------------------------------------------------------------------
Manifest = Mapping[str, tuple[str, int]]  # path → (sha256, size): a version's regular files


@dataclass(frozen=True)
class Diff:
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]


def diff(old: Manifest, new: Manifest) -> Diff:
    """Files added, removed and changed (by content) from `old` to `new`."""
    added = tuple(sorted(p for p in new if p not in old))
    removed = tuple(sorted(p for p in old if p not in new))
    changed = tuple(sorted(p for p in new if p in old and new[p][0] != old[p][0]))
    return Diff(added, removed, changed)


def _brief(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

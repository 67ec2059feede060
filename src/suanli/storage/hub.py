"""The hub's files: public models and datasets, stored once and read-only in the Hugging Face cache layout.

Under the operator's hub directory:

    hub/models--ORG--NAME/{blobs/<sha256>, snapshots/<revision>/<path> -> ../../blobs/<sha256>, refs/main}
    hub/datasets--ORG--NAME/…                      the same for a dataset repository
    datasets/ORG___NAME/<config>/<version>/<hash>/ a dataset prepared by `datasets` (`hub_datasets`)

`hub/` is what `HF_HUB_CACHE` names (huggingface_hub's own layout: folder names from its `repo_folder_name`,
downloads by its `snapshot_download`), so `from_pretrained("ORG/NAME")` finds a model there with no network;
`datasets/` is what `HF_DATASETS_CACHE` names, because `load_dataset("ORG/NAME")` offline reads only that.
Blobs are named by their SHA-256, which is also the checksum the hub lists. Snapshot links are relative, so a
folder bound into a sandbox at another path still resolves. Everything is written under `.staging/`, made
read-only (files 0444, directories 0555), then renamed into place: a reader never sees half an entry.

huggingface_hub and datasets are imported when used (`pip install 'suanli[hub]'`).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

import yaml

KINDS = ("model", "dataset")
HUB = "hub"  # HF_HUB_CACHE
DATASETS = "datasets"  # HF_DATASETS_CACHE (prepared datasets)
STAGING = ".staging"
SKIP_DIRS = frozenset({".git", ".cache"})  # git metadata; huggingface_hub's local_dir bookkeeping
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
REPO_ID = re.compile(rf"{_PART}/{_PART}")
GIT_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")
CHUNK = 1 << 20
_LICENSE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")


class HubError(ValueError):
    """An entry that cannot be stored or read, in words an operator can act on."""


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the snapshot, '/'-separated
    size: int
    sha256: str


@dataclass(frozen=True)
class Stored:
    """What one entry holds on disk: its files, where they are (relative to the hub directory), its revision."""

    kind: str
    repo_id: str
    revision: str
    files: tuple[FileEntry, ...]
    folder: str  # hub/models--ORG--NAME
    prepared: str | None = None  # datasets/ORG___NAME (a dataset)
    license: str | None = None

    @property
    def size_bytes(self) -> int:
        return sum(f.size for f in self.files)


def check_repo_id(repo_id: str) -> str:
    """ORG/NAME as the Hugging Face Hub allows it: letters, digits, '.', '_', '-', no '--' or '..' (which the cache
    layout uses as its separator), at most 96 characters a part."""
    if not isinstance(repo_id, str) or not REPO_ID.fullmatch(repo_id) or "--" in repo_id or ".." in repo_id:
        raise HubError(
            f"repo id {repo_id!r} must be ORG/NAME: letters, digits, '.', '_', '-' (no '--' or '..'), as on the Hub"
        )
    return repo_id


def check_license(license: str | None) -> str | None:
    if license is None or license == "":
        return None
    if not _LICENSE.fullmatch(license):
        raise HubError(f"license {license!r} must be an SPDX-like identifier (apache-2.0, mit, other), 1-64 chars")
    return license.lower()


def folder_name(kind: str, repo_id: str) -> str:
    """huggingface_hub's own name for a repository's cache folder (models--ORG--NAME)."""
    from huggingface_hub.file_download import repo_folder_name

    if kind not in KINDS:
        raise HubError(f"kind must be one of {', '.join(KINDS)}")
    return str(repo_folder_name(repo_id=repo_id, repo_type=kind))


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _source_files(src: Path) -> list[tuple[str, Path]]:
    """(relative path, file) of a source directory, sorted by path. Links to files are followed only when they stay
    inside it, or, for a snapshot of another Hugging Face cache, inside that repository's `blobs/`: a link out (an
    untrusted checkout's `key -> ~/.ssh/id_rsa`) would publish a host file to every tenant, so it is refused,
    as are links to directories and anything but regular files."""
    root = src.resolve()
    allowed = [root]
    if root.parent.name == "snapshots":
        allowed.append(root.parent.parent / "blobs")
    return sorted(_walk(src, allowed))


def _walk(src: Path, allowed: list[Path]) -> Iterator[tuple[str, Path]]:
    for root, dirs, files in os.walk(src):
        for name in dirs:
            if os.path.islink(os.path.join(root, name)):
                rel = Path(root, name).relative_to(src).as_posix()
                raise HubError(f"{rel}: a link to a directory; copy the files in instead")
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            path = Path(root, name)
            rel = path.relative_to(src).as_posix()
            if path.is_symlink():
                target = path.resolve()
                if not any(target.is_relative_to(a) for a in allowed):
                    raise HubError(f"{rel}: a link out of the directory (to {target}); only files inside are taken")
            try:
                st = path.stat()
            except OSError as e:
                raise HubError(f"{rel}: {e.strerror}") from None
            if not stat.S_ISREG(st.st_mode):
                raise HubError(f"{rel}: not a regular file")
            yield rel, path


def digest_revision(files: tuple[FileEntry, ...]) -> str:
    """A revision for an entry made from a directory: 40 hex digits (a commit's length) of its content's digest,
    so the same files always make the same revision."""
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.path}\0{f.sha256}\n".encode())
    return h.hexdigest()[:40]


def read_only(path: Path) -> None:
    """Files 0444, directories 0555 (links are left alone): the server's own user cannot change an entry by
    accident, and tenants only ever see it through a read-only bind."""
    for root, dirs, files in os.walk(path):
        for name in files:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                os.chmod(p, 0o444)
        for name in dirs:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                os.chmod(p, 0o555)
    os.chmod(path, 0o555)


def remove_entry_tree(path: Path) -> None:
    """Remove a read-only tree: directories made writable first."""
    if not path.exists() and not path.is_symlink():
        return
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                os.chmod(p, 0o755)
    os.chmod(path, 0o755)
    shutil.rmtree(path)


def card_license(snapshot: Path) -> str | None:
    """The `license:` of a repository card's YAML header (README.md), when it has one."""
    try:
        text = (snapshot / "README.md").read_text(encoding="utf-8", errors="replace")[:65536]
    except OSError:
        return None
    if not text.startswith("---"):
        return None
    head = text[3:].split("\n---", 1)[0]
    try:
        meta = yaml.safe_load(head)
    except yaml.YAMLError:
        return None
    value = meta.get("license") if isinstance(meta, dict) else None
    try:
        return check_license(value) if isinstance(value, str) else None
    except HubError:
        return None


@dataclass(frozen=True)
class HubStore:
    """The operator's hub directory."""

    root: Path

    def path(self, relative: str) -> Path:
        """A stored folder (`Stored.folder`, `.prepared`) as a host path; never outside the hub directory."""
        parts = PurePosixPath(relative).parts
        if not parts or parts[0] not in (HUB, DATASETS) or any(p in ("..", ".", "") for p in parts) or len(parts) != 2:
            raise HubError(f"not a hub folder: {relative!r}")
        return self.root.joinpath(*parts)

    def _stage(self) -> Path:
        stage = self.root / STAGING / secrets.token_hex(8)
        stage.mkdir(parents=True)
        return stage

    def _place(self, built: Path, relative: str) -> None:
        target = self.path(relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            raise HubError(f"{relative} is already in the hub; remove it first")
        read_only(built)
        os.rename(built, target)

    def add_dir(self, kind: str, repo_id: str, src: Path, license: str | None = None) -> Stored:
        """Copy a local directory in as ORG/NAME; its revision is the digest of its content."""
        check_repo_id(repo_id)
        if not src.is_dir():
            raise HubError(f"{src} is not a directory")
        folder = f"{HUB}/{folder_name(kind, repo_id)}"
        if self.path(folder).exists():
            raise HubError(f"{repo_id} ({kind}) is already in the hub; remove it first")
        stage = self._stage()
        try:
            repo = stage / "repo"
            blobs = repo / "blobs"
            blobs.mkdir(parents=True)
            entries: list[tuple[FileEntry, Path]] = []
            for rel, path in _source_files(src):
                tmp = blobs / f".in-{len(entries)}"
                digest = hashlib.sha256()
                with open(path, "rb") as fin, open(tmp, "wb") as fout:
                    while chunk := fin.read(CHUNK):
                        digest.update(chunk)
                        fout.write(chunk)
                size, sha = tmp.stat().st_size, digest.hexdigest()
                blob = blobs / sha
                if blob.exists():
                    tmp.unlink()  # the same content twice: stored once
                else:
                    os.rename(tmp, blob)
                entries.append((FileEntry(rel, size, sha), blob))
            if not entries:
                raise HubError(f"{src} holds no files")
            files = tuple(e for e, _ in entries)
            revision = digest_revision(files)
            snap = repo / "snapshots" / revision
            for entry, blob in entries:
                link = snap / entry.path
                link.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(os.path.relpath(blob, link.parent), link)
            (repo / "refs").mkdir()
            (repo / "refs" / "main").write_text(revision)
            stored = Stored(
                kind, repo_id, revision, files, folder, license=check_license(license) or card_license(snap)
            )
            return self._finish(stored, repo, snap, stage)
        finally:
            remove_entry_tree(stage)

    def add_hf(
        self, kind: str, repo_id: str, revision: str = "main", license: str | None = None, endpoint: str | None = None
    ) -> Stored:
        """Download ORG/NAME@revision from the Hugging Face Hub with huggingface_hub's `snapshot_download` (its own
        cache layout, written under staging), check every file's SHA-256, and place it."""
        from huggingface_hub import snapshot_download

        check_repo_id(repo_id)
        if not GIT_REF.fullmatch(revision) or ".." in revision:
            raise HubError(f"revision {revision!r} must be a branch, tag or commit (letters, digits, '._/-')")
        folder = f"{HUB}/{folder_name(kind, repo_id)}"
        if self.path(folder).exists():
            raise HubError(f"{repo_id} ({kind}) is already in the hub; remove it first")
        stage = self._stage()
        try:
            try:
                snap = Path(snapshot_download(repo_id, repo_type=kind, revision=revision, cache_dir=stage,
                                              endpoint=endpoint, etag_timeout=10))  # fmt: skip
            except Exception as e:  # no route, offline mode, unknown repo or revision, gated: all said as one
                why = " ".join(str(e).split())[:300] or type(e).__name__
                raise HubError(
                    f"cannot fetch hf://{repo_id}@{revision} from the Hugging Face Hub ({type(e).__name__}: {why}); "
                    f"on a server without access, download it elsewhere and add it with --from DIR"
                ) from None
            repo = snap.parent.parent
            commit = snap.name
            (repo / "refs").mkdir(exist_ok=True)
            (repo / "refs" / "main").write_text(commit)  # from_pretrained("ORG/NAME") asks for main
            files = tuple(FileEntry(rel, p.stat().st_size, sha256_of(p)) for rel, p in _source_files(snap))
            stored = Stored(kind, repo_id, commit, files, folder, license=check_license(license) or card_license(snap))
            return self._finish(stored, repo, snap, stage)
        finally:
            remove_entry_tree(stage)

    def _finish(self, stored: Stored, repo: Path, snap: Path, stage: Path) -> Stored:
        """Place the repository; a dataset is also prepared for `load_dataset("ORG/NAME")` offline
        (`hub_datasets`) and placed beside it (both or neither)."""
        built = None
        if stored.kind == "dataset":
            from suanli.storage import hub_datasets

            built, name = hub_datasets.prepare(snap, stored.repo_id, stage / "prepared")
            stored = replace(stored, prepared=f"{DATASETS}/{name}")
        self._place(repo, stored.folder)
        if built is not None and stored.prepared is not None:
            try:
                self._place(built, stored.prepared)
            except BaseException:
                remove_entry_tree(self.path(stored.folder))
                raise
        return stored

    def remove(self, stored_folder: str, prepared: str | None = None) -> None:
        """Remove an entry's folders (a running workload's bind keeps what it has open)."""
        for rel in (stored_folder, prepared):
            if rel:
                remove_entry_tree(self.path(rel))

    def verify(self, folder: str, revision: str, files: tuple[FileEntry, ...]) -> list[str]:
        """The files of a stored snapshot whose size or SHA-256 differs from the record (empty: intact)."""
        snap = self.path(folder) / "snapshots" / revision
        bad = []
        for f in files:
            p = snap / f.path
            try:
                if p.stat().st_size != f.size or sha256_of(p) != f.sha256:
                    bad.append(f.path)
            except OSError:
                bad.append(f.path)
        return bad

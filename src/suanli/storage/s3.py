"""The S3 volume backend: a volume's files kept in S3-compatible object storage (through fsspec/s3fs), with a
working copy on the server's disk that sandboxes mount.

The working copy is the local backend's tree (`storage.volumes`), so copies, versions and mounts work the same. What
this adds is the durable copy in the bucket, at `s3://BUCKET/PREFIX<org>/<volume>/<path>`, kept in step:

- `push`: what changed in the working copy since the last push (by size and mtime) is uploaded, and objects whose
  file this copy had and no longer has are deleted: after every copy in, and by the storage sweep once no live
  workload mounts the volume writable (within a minute of a workload's stop);
- `pull`: objects the working copy lacks or holds at another size are downloaded, and files the bucket no longer
  has are removed: when a workload that mounts the volume starts.

Links in the working copy are not uploaded (object storage has none). The bucket's credentials are the operator's
settings; they reach only this module, never a tenant (not the API, not the sandbox).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suanli.storage import volumes as local
from suanli.storage.archive import utf8

PUSHED = "s3-pushed.json"  # path -> [size, mtime_ns] as last uploaded
BATCH = 256  # files uploaded at once (s3fs sends them concurrently)


@dataclass(frozen=True)
class S3Config:
    bucket: str
    prefix: str = ""
    endpoint: str | None = None
    key_id: str | None = None
    secret: str | None = None
    region: str | None = None

    def filesystem(self) -> Any:
        import s3fs  # optional: pip install 'suanli[s3]'

        client: dict[str, Any] = {}
        if self.endpoint:
            client["endpoint_url"] = self.endpoint
        if self.region:
            client["region_name"] = self.region
        return s3fs.S3FileSystem(key=self.key_id, secret=self.secret, client_kwargs=client, use_listings_cache=False)


@dataclass
class SyncReport:
    uploaded: int = 0
    downloaded: int = 0
    deleted: int = 0
    bytes: int = 0


class S3Backend:
    def __init__(self, config: S3Config, fs: Any | None = None) -> None:
        self.config = config
        self.fs = fs if fs is not None else config.filesystem()

    def remote(self, org_id: str, volume_id: str) -> str:
        return f"{self.config.bucket}/{self.config.prefix}{org_id}/{volume_id}"

    def _files(self, data: Path) -> dict[str, os.stat_result]:
        out: dict[str, os.stat_result] = {}
        for dirpath, _, files, dfd in local.fwalk(data):
            rel = os.path.relpath(dirpath, data)
            base = "" if rel == "." else rel + "/"
            for name in files:
                if not utf8(base + name):  # an object key is UTF-8: a workload's other names stay on this host
                    continue
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    out[base + name] = st
        return out

    def _objects(self, remote: str) -> dict[str, int]:
        try:
            found = self.fs.find(remote, detail=True)
        except FileNotFoundError:
            return {}
        return {k[len(remote) + 1 :]: int(v.get("size") or 0) for k, v in found.items() if v.get("type") != "directory"}

    def push(self, p: local.Paths, org_id: str, volume_id: str) -> SyncReport:
        remote = self.remote(org_id, volume_id)
        report = SyncReport()
        done = _load(p.root / PUSHED)
        files = self._files(p.data)
        changed = [rel for rel, st in files.items() if done.get(rel) != [st.st_size, st.st_mtime_ns]]
        for i in range(0, len(changed), BATCH):
            batch = changed[i : i + BATCH]
            fds = []
            try:
                for rel in batch:  # opened here without following links; s3fs reads them through /proc/self/fd
                    fd, st = local.open_file(p.data, rel)
                    fds.append(fd)
                    done[rel] = [st.st_size, st.st_mtime_ns]
                    report.bytes += st.st_size
                self.fs.put([f"/proc/self/fd/{fd}" for fd in fds], [f"{remote}/{rel}" for rel in batch])
            finally:
                for fd in fds:
                    os.close(fd)
            report.uploaded += len(batch)
        # Only what this working copy had (pushed or pulled) and no longer has: a fresh copy deletes nothing.
        gone = [rel for rel in self._objects(remote) if rel not in files and rel in done]
        if gone:
            self.fs.rm([f"{remote}/{rel}" for rel in gone])
            report.deleted += len(gone)
        _save(p.root / PUSHED, {k: v for k, v in done.items() if k in files})
        return report

    def pull(self, p: local.Paths, org_id: str, volume_id: str) -> SyncReport:
        remote = self.remote(org_id, volume_id)
        report = SyncReport()
        objects = self._objects(remote)
        files = self._files(p.data)
        done = _load(p.root / PUSHED)
        for rel, size in objects.items():
            st = files.get(rel)
            if st is not None and st.st_size == size:
                continue
            parts = rel.split("/")
            with local.open_dir(p.data, parts[:-1], create=True, owner=p.owner) as dfd:
                tmp = f".suanli-pull-{os.getpid()}"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                             dir_fd=dfd)  # fmt: skip
                with os.fdopen(fd, "wb") as out, self.fs.open(f"{remote}/{rel}", "rb") as src:
                    while chunk := src.read(local.CHUNK):
                        out.write(chunk)
                if p.owner is not None:
                    os.chown(tmp, *p.owner, dir_fd=dfd, follow_symlinks=False)
                os.replace(tmp, parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)
                got = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
            done[rel] = [got.st_size, got.st_mtime_ns]
            report.downloaded += 1
            report.bytes += size
        for rel in files:
            if rel not in objects and rel in done:  # pushed once, since deleted in the bucket
                local.remove(p.data, rel)
                done.pop(rel, None)
                report.deleted += 1
        _save(p.root / PUSHED, done)
        return report

    def destroy(self, org_id: str, volume_id: str) -> None:
        remote = self.remote(org_id, volume_id)
        if self._objects(remote):
            self.fs.rm(remote, recursive=True)


def _load(path: Path) -> dict[str, list[int]]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _save(path: Path, doc: dict[str, list[int]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc), encoding="utf-8")
    os.replace(tmp, path)

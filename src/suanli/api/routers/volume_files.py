"""A volume's files over HTTP, streamed both ways (never held whole in memory).

- `PUT /volumes/{volume}/files?path=P&offset=N&sha256=H`: the body is the file from byte N on (resumable: after a
  break, `GET …/partial?path=P` says where to go on); with `sha256` the whole file's hash is checked before it
  replaces P (422 otherwise, and the copy is dropped); with `hold=true` instead, the whole file waits beside the
  tree, its hash returned, until `POST …/commit?path=P&sha256=H` names the same hash (a client hashing while it
  sends knows its hash only at the end).
- `GET /volumes/{volume}/files?path=P` (with `Range: bytes=N-` to resume), `GET …/stat?path=P` (size and sha256).
- `PUT /volumes/{volume}/tree?path=D&sha256=H`: a plain tar stream merged into directory D (its hash checked before
  anything is moved in); `GET …/tree?path=D` streams D as a plain tar. `GET …/ls?path=D`, `DELETE …/files?path=P`.
- `GET /storage/local-copy`: where a client on the server's own host passes open files instead (`api.local_copy`).
"""

from __future__ import annotations

import asyncio
import queue
import re
import threading
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from pydantic import Field
from starlette.requests import ClientDisconnect

from suanli.api.deps import Auth, client_address
from suanli.api.routers.volumes import OrgQ, Ref
from suanli.api.schemas import Out
from suanli.control.errors import Conflict, Invalid, NotFound
from suanli.control.storage import volume_files as files
from suanli.control.storage import volumes
from suanli.storage import volume_io as vio
from suanli.storage import volumes as store
from suanli.storage.archive import ArchiveError, shown
from suanli.storage.fd_channel import loopback_host

router = APIRouter(tags=["volumes"])
PathQ = Annotated[str, Query(max_length=1024, description="a path inside the volume ('' or '/': its root)")]
Sha = Annotated[str | None, Query(pattern=r"^[0-9a-f]{64}$", description="sha256 of the whole file or stream")]
BUFFER = 4 << 20  # body bytes gathered before a hop to the writing thread
BINARY = {"required": True, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}
_RANGE = re.compile(r"bytes=([0-9]{1,19})-([0-9]{0,19})")


class PutOut(Out):
    path: str
    bytes: int = Field(description="the file's size (or the tree's, in whole 4 KiB blocks)")
    files: int = 1
    sha256: str


class StatOut(Out):
    path: str
    kind: str
    size: int
    sha256: str | None = None


class PartialOut(Out):
    path: str
    offset: int = Field(description="bytes of an interrupted upload already received: resume from here")


class EntryOut(Out):
    name: str
    kind: str
    size: int
    mtime_ns: int


class LocalCopyOut(Out):
    socket: str = Field(description="the Unix socket (abstract namespace: '@' then its name)")
    pid: int = Field(description="the server process behind it: a client checks the socket's peer is this one")
    uid: int


@router.get("/storage/local-copy", responses={404: {"description": "this server copies over HTTP only"}})
async def local_copy(request: Request, ctx: Auth) -> LocalCopyOut:
    """Where a client on this server's own host can pass open files instead of streaming them (`suanli volumes
    cp` uses it by itself when the server's address is a loopback one); 404 where the operator turned it off."""
    del ctx  # announced to authenticated callers only
    lc = getattr(request.app.state, "local_copy", None)
    if lc is None:
        raise NotFound("this server copies over HTTP only (local_copy is off)")
    if not loopback_host(client_address(request)):  # no same-host copy from there: the pid and uid are not its business
        raise NotFound("same-host copies are for clients on the server's own host")
    return LocalCopyOut(**lc.info())


def _lim(ctx: Auth) -> volumes.Limits:
    return volumes.Limits.of(ctx.srv.settings)


def _file_error(e: store.VolumeFileError) -> Invalid | Conflict:
    return Conflict(f"path: {e}") if isinstance(e, vio.Busy) else Invalid(f"path: {e}")


@router.put("/volumes/{volume}/files", openapi_extra={"requestBody": BINARY})
async def put_file(
    ref: Ref, request: Request, ctx: Auth, path: PathQ, org: OrgQ = None,
    offset: Annotated[int, Query(ge=0, le=1 << 50)] = 0, sha256: Sha = None,
    hold: Annotated[bool, Query(description="keep the whole file aside, its hash returned, until …/commit")] = False,
) -> PutOut:  # fmt: skip
    rel = files.clean(path, allow_root=False)
    t = await run_in_threadpool(files.for_write, ctx.db, ctx.who, ref, org, _lim(ctx), ctx.now)
    w: vio.Writer | None = None
    try:
        try:
            w = await run_in_threadpool(vio.Writer, t.paths, rel, offset, t.claim)
        except vio.Busy as e:
            raise Conflict(f"path: {e}") from None
        except store.VolumeFileError as e:
            raise Invalid(f"offset: {e}") from None
        chunks: list[bytes] = []
        held = 0
        try:
            async for chunk in request.stream():  # gathered without copying, written a few MiB a hop to the thread
                chunks.append(chunk)
                held += len(chunk)
                if held >= BUFFER:
                    await run_in_threadpool(w.write_all, chunks)
                    chunks, held = [], 0
            await run_in_threadpool(w.write_all, chunks)
        except store.OverSize as e:
            w.abort()
            raise files.room_error(t, e) from None
        except ClientDisconnect:
            w.abort()  # what arrived is kept: resume from `partial`
            raise Invalid("body: the upload broke off; resume from GET …/partial") from None
        try:
            digest, size, _ = await run_in_threadpool(w.finish, sha256, hold)
        except store.VolumeFileError as e:
            raise _file_error(e) from None
        if not hold:
            await run_in_threadpool(files.wrote, ctx.db, t, ctx.now)
        return PutOut(path=rel, bytes=size, sha256=digest)
    finally:
        if w is not None:
            w.abort()  # (closed already when it finished) its partial copy's lock goes however the upload ended
        await run_in_threadpool(files.done, t)  # its claim on the room ends


@router.post("/volumes/{volume}/commit")
async def commit_file(ref: Ref, ctx: Auth, path: PathQ, sha256: Annotated[str, Query(pattern=r"^[0-9a-f]{64}$")],
                      org: OrgQ = None) -> PutOut:  # fmt: skip
    """Move a file sent with `hold=true` into place if it was received with this sha256 (422 otherwise, and the
    copy is dropped)."""
    rel = files.clean(path, allow_root=False)
    t = await run_in_threadpool(files.for_write, ctx.db, ctx.who, ref, org, _lim(ctx), ctx.now)
    try:
        assert t.claim is not None
        try:
            digest, size, _ = await run_in_threadpool(vio.commit, t.paths, rel, sha256, t.claim)
        except store.OverSize as e:
            raise files.room_error(t, e) from None
        except store.VolumeFileError as e:
            raise _file_error(e) from None
        await run_in_threadpool(files.wrote, ctx.db, t, ctx.now)
        return PutOut(path=rel, bytes=size, sha256=digest)
    finally:
        await run_in_threadpool(files.done, t)


@router.get("/volumes/{volume}/partial")
async def partial(ref: Ref, ctx: Auth, path: PathQ, org: OrgQ = None) -> PartialOut:
    rel = files.clean(path, allow_root=False)
    t = await run_in_threadpool(files.for_read, ctx.db, ctx.who, ref, org, _lim(ctx))
    return PartialOut(path=rel, offset=vio.partial_size(t.paths, rel))


@router.get("/volumes/{volume}/files", response_class=StreamingResponse,
            responses={200: {"content": {"application/octet-stream": {}}}, 206: {"description": "a range"}})  # fmt: skip
async def get_file(
    ref: Ref, ctx: Auth, path: PathQ, org: OrgQ = None, range: Annotated[str | None, Header(max_length=64)] = None
) -> StreamingResponse:
    rel = files.clean(path, allow_root=False)
    t = await run_in_threadpool(files.for_read, ctx.db, ctx.who, ref, org, _lim(ctx))
    try:
        fd, st = await run_in_threadpool(store.open_file, t.paths.data, rel)
    except store.VolumeFileError as e:
        raise _file_error(e) from None
    start, end, status = 0, st.st_size, 200
    headers = {"Accept-Ranges": "bytes"}
    if range is not None:
        m = _RANGE.fullmatch(range.strip())
        if m is None or int(m.group(1)) >= st.st_size or (m.group(2) and int(m.group(2)) < int(m.group(1))):
            store.os.close(fd)
            return Response(status_code=416, headers={"Content-Range": f"bytes */{st.st_size}"})  # type: ignore[return-value]
        start = int(m.group(1))
        end = min(st.st_size, int(m.group(2)) + 1) if m.group(2) else st.st_size
        status = 206
        headers["Content-Range"] = f"bytes {start}-{max(start, end - 1)}/{st.st_size}"
    headers["Content-Length"] = str(end - start)
    return StreamingResponse(vio.read_range(fd, start, end - start), status_code=status, headers=headers,
                             media_type="application/octet-stream")  # fmt: skip


@router.get("/volumes/{volume}/stat")
async def stat_path(ref: Ref, ctx: Auth, path: PathQ, org: OrgQ = None, sha256: bool = False) -> StatOut:
    """What is at `path`; with `sha256=true`, a file's hash (read again unless unchanged since the last snapshot)."""
    rel = files.clean(path)
    t = await run_in_threadpool(files.for_read, ctx.db, ctx.who, ref, org, _lim(ctx))
    kind = await run_in_threadpool(store.kind, t.paths.data, rel)
    if kind == "missing":
        raise Invalid(f"path: {rel}: no such file or directory")
    if kind != "file":
        return StatOut(path=rel, kind=kind, size=0)
    try:
        digest, size = await run_in_threadpool(vio.file_sha256, t.paths, rel) if sha256 else (None, 0)
        if not sha256:
            fd, st = await run_in_threadpool(store.open_file, t.paths.data, rel)
            store.os.close(fd)
            size = st.st_size
    except store.VolumeFileError as e:
        raise _file_error(e) from None
    return StatOut(path=rel, kind=kind, size=size, sha256=digest)


@router.get("/volumes/{volume}/ls")
async def ls(
    ref: Ref, ctx: Auth, path: PathQ = "", org: OrgQ = None,
    after: Annotated[str, Query(max_length=255)] = "", limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> list[EntryOut]:  # fmt: skip
    """A directory's entries by name (page with `after`, the last name seen); links are shown, not followed."""
    rel = files.clean(path)
    t = await run_in_threadpool(files.for_read, ctx.db, ctx.who, ref, org, _lim(ctx))
    try:
        got = await run_in_threadpool(store.listdir, t.paths.data, rel, limit, after)
    except store.VolumeFileError as e:
        raise _file_error(e) from None
    return [EntryOut(name=shown(e.name), kind=e.kind, size=e.size, mtime_ns=e.mtime_ns) for e in got]


@router.delete("/volumes/{volume}/files", status_code=204)
async def remove_path(ref: Ref, ctx: Auth, path: PathQ, org: OrgQ = None) -> Response:
    rel = files.clean(path, allow_root=False)
    t = await run_in_threadpool(files.for_write, ctx.db, ctx.who, ref, org, _lim(ctx), ctx.now, False)
    try:
        await run_in_threadpool(store.remove, t.paths.data, rel)
    except store.VolumeFileError as e:
        raise _file_error(e) from None
    await run_in_threadpool(files.remeasure, ctx.db, t, ctx.now)
    return Response(status_code=204)


@router.put("/volumes/{volume}/tree", openapi_extra={"requestBody": BINARY})
async def put_tree(ref: Ref, request: Request, ctx: Auth, path: PathQ = "", org: OrgQ = None,
                   sha256: Sha = None) -> PutOut:  # fmt: skip
    """A plain tar stream merged into directory `path` (made if need be): only files and directories, no links,
    no absolute paths or `..` (422 naming the entry), within the room left (507)."""
    rel = files.clean(path)
    lim = _lim(ctx)
    t = await run_in_threadpool(files.for_write, ctx.db, ctx.who, ref, org, lim, ctx.now)
    feed = _Feed()
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def work() -> None:
        assert t.claim is not None
        try:
            out: Any = vio.put_tree(t.paths, rel, feed, t.claim, lim.max_files, sha256)
        except BaseException as e:
            out = e
        finally:
            files.done(t)  # merged or not: its claim on the room ends
        feed.closed = True
        loop.call_soon_threadsafe(done.set_result, out)

    threading.Thread(target=work, name="volume-tree", daemon=True).start()
    buf = bytearray()
    try:
        async for chunk in request.stream():
            buf += chunk
            if len(buf) >= BUFFER:
                await run_in_threadpool(feed.put, bytes(buf))
                buf.clear()
        await run_in_threadpool(feed.put, bytes(buf))
        await run_in_threadpool(feed.put, b"")
    except ClientDisconnect:
        feed.fail()
    out = await done
    if isinstance(out, store.OverSize):
        raise files.room_error(t, out)
    if isinstance(out, store.VolumeFileError | ArchiveError):
        raise Invalid(f"body: {out}")
    if isinstance(out, BaseException):
        raise out
    nbytes, nfiles, digest = out
    await run_in_threadpool(files.remeasure, ctx.db, t, ctx.now)
    return PutOut(path=rel, bytes=nbytes, files=nfiles, sha256=digest)


class _Feed:
    """The request body as a blocking reader for the thread that unpacks it; bounded (the body waits)."""

    def __init__(self) -> None:
        self.q: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
        self.cur, self.pos, self.closed, self.eof = b"", 0, False, False

    def put(self, chunk: bytes) -> None:
        while not self.closed:
            try:
                self.q.put(chunk, timeout=0.2)
                return
            except queue.Full:
                continue

    def fail(self) -> None:
        self.put(None)  # type: ignore[arg-type]

    def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes (fewer only at the end), without copying the rest of a chunk on every read."""
        parts: list[bytes] = []
        want = n if n >= 0 else 1 << 62
        while want > 0:
            if self.pos >= len(self.cur):
                if self.eof:
                    break
                item = self.q.get()
                if item is None:
                    raise Invalid("body: the upload broke off")
                if not item:
                    self.eof = True
                self.cur, self.pos = item, 0
                continue
            take = self.cur[self.pos : self.pos + want]
            self.pos += len(take)
            want -= len(take)
            parts.append(take)
        return b"".join(parts)


@router.get("/volumes/{volume}/tree", response_class=StreamingResponse,
            responses={200: {"content": {"application/x-tar": {}}}})  # fmt: skip
async def get_tree(ref: Ref, ctx: Auth, path: PathQ = "", org: OrgQ = None) -> StreamingResponse:
    rel = files.clean(path)
    t = await run_in_threadpool(files.for_read, ctx.db, ctx.who, ref, org, _lim(ctx))
    if await run_in_threadpool(store.kind, t.paths.data, rel) != "dir":
        raise Invalid(f"path: {rel or '/'} is not a directory")
    await run_in_threadpool(store.check_depth, t.paths.data, rel)  # too deep: a 422 now, not a stream cut short
    return StreamingResponse(vio.tar_tree(t.paths.data, rel), media_type="application/x-tar")

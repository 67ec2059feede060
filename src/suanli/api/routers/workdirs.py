"""Uploading a job's workdir (`POST /workdirs`): a .tar.gz as the raw body, under its own body limit
(`max_upload_bytes`), unpacked and counted against the org's storage quota, then named by a submission."""

from __future__ import annotations

import tempfile
from datetime import datetime

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import Field
from starlette.requests import ClientDisconnect

from suanli.api.deps import Auth
from suanli.api.schemas import Out
from suanli.control.errors import Invalid
from suanli.control.storage import storage
from suanli.storage import workdirs

router = APIRouter(tags=["workloads"])
SPOOL_IN_MEMORY = 1 << 20  # a body larger than this waits on disk, in an unnamed file, until it is unpacked
BINARY = {"type": "string", "format": "binary", "description": "the .tar.gz itself (any content type)"}
GZIP_BODY = {"required": True, "content": {"application/octet-stream": {"schema": BINARY}}}


class WorkdirOut(Out):
    id: str = Field(description="name it as `workdir_upload` in the submission (once, by the uploader)")
    org_id: str
    bytes: int = Field(description="on disk, counted against the org's storage quota: files in whole 4 KiB blocks")
    files: int = Field(description="files and directories")
    expires_at: datetime = Field(description="removed then unless a submission has named it")


@router.post("/workdirs", status_code=201, openapi_extra={"requestBody": GZIP_BODY})
async def upload_workdir(
    request: Request,
    ctx: Auth,
    org: str | None = Query(None, max_length=64, description="the org that will pay; default: your personal org"),
) -> WorkdirOut:
    """Upload a job's workdir as a .tar.gz body (at most `max_upload_bytes`, 413 beyond). It is unpacked at once
    under the bounds of one upload (`workdir_max_bytes`, `workdir_max_files`) and what is left of the org's
    `storage_quota_bytes` (409 naming both): only files and directories, no absolute paths or `..` (422 naming
    the entry). Kept for an hour for the submission that names it. Whether the caller may upload for the org, and
    whether the org has room, is asked before the body is read."""
    settings = ctx.srv.settings
    store = storage.Store.of(settings)
    await run_in_threadpool(storage.admit, ctx.db, ctx.who, org, store)  # refusals come before the body is read
    incoming = workdirs.incoming_dir(settings.home)
    incoming.mkdir(parents=True, exist_ok=True)
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY, dir=incoming) as spool:
        try:
            async for chunk in request.stream():  # the edge stops it at max_upload_bytes
                spool.write(chunk)
        except ClientDisconnect:
            raise Invalid("body: the upload did not arrive whole") from None
        spool.seek(0)
        up = await run_in_threadpool(storage.upload, ctx.db, ctx.who, org, spool, store, ctx.now)
    return WorkdirOut(id=up.id, org_id=up.org_id, bytes=up.bytes, files=up.files, expires_at=up.expires_at)

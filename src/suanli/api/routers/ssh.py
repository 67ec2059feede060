"""SSH public keys (`suanli keys …`) and where the SSH gateway listens (`suanli ssh`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from suanli.api import reauth
from suanli.api.deps import Auth, Caller, in_thread
from suanli.api.schemas import SshInfoOut, SshKeyIn, SshKeyOut
from suanli.api.strict_json import StrictJSONRoute
from suanli.control.accounts import accounts, ssh_keys

router = APIRouter(route_class=StrictJSONRoute, tags=["ssh"])


@router.get("/keys")
@in_thread
def list_keys(ctx: Auth) -> list[SshKeyOut]:
    """The caller's SSH public keys."""
    with ctx.db.read() as s:
        return [SshKeyOut.model_validate(k) for k in ssh_keys.listing(s, ctx.who)]


@router.post("/keys", status_code=201)
async def add_key(body: SshKeyIn, request: Request, ctx: Auth) -> SshKeyOut:
    """Add a public key: it then logs in to every instance of every org the caller is a member of. A key never
    expires: a caller whose token does gives the account's `password` (403 without it, 422 wrong, both naming it),
    so a stolen console session or login is no way to a shell that outlives it."""
    proof = await reauth.gate(ctx, request, body.password, "an SSH key", needed=ctx.who.token_expires_at is not None)
    return await run_in_threadpool(_add_key, ctx, body, proof)


def _add_key(ctx: Caller, body: SshKeyIn, proof: reauth.Proof | None) -> SshKeyOut:
    with ctx.db.write() as s, s.begin():
        accounts.check_live(s, ctx.who)
        reauth.settle(s, ctx, proof, ctx.now)
        return SshKeyOut.model_validate(ssh_keys.add(s, ctx.who, body.public_key, body.name, ctx.now))


@router.delete("/keys/{key_id}")
@in_thread
def remove_key(key_id: str, ctx: Auth) -> SshKeyOut:
    """Remove one of the caller's keys (by id or fingerprint); new logins with it are refused at once."""
    with ctx.db.write() as s, s.begin():
        return SshKeyOut.model_validate(ssh_keys.remove(s, ctx.who, key_id))


@router.get("/ssh")
@in_thread
def ssh_info(ctx: Auth) -> SshInfoOut:
    """The SSH gateway: its port on this server's host and its host key (`ssh -p PORT INSTANCE@HOST`)."""
    from suanli.ssh.hostkey import public_host_key

    port = ctx.srv.settings.ssh_port
    key = public_host_key(ctx.srv.settings.home) if port else None
    return SshInfoOut(enabled=bool(port), port=port or None, host_key=key[0] if key else None,
                      host_key_fingerprint=key[1] if key else None)  # fmt: skip

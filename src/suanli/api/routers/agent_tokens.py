"""Node agents' tokens (operators mint and revoke them), and who may post GPU samples: an operator, or a node's
agent token for that node's samples only (`control.telemetry.agent_tokens`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import Field

from suanli.api.deps import Server, bearer, caller, in_thread, server
from suanli.api.routers.admin import Admin
from suanli.api.schemas import Out
from suanli.api.strict_json import StrictJSONRoute
from suanli.control.accounts import accounts
from suanli.control.ids import utcnow
from suanli.control.telemetry import agent_tokens
from suanli.db.engine import Database

router = APIRouter(route_class=StrictJSONRoute, tags=["telemetry"])


class AgentTokenOut(Out):
    id: str
    node: str
    prefix: str = Field(description="the token's first characters, to tell it apart")
    created_at: datetime
    revoked_at: datetime | None


class NewAgentTokenOut(AgentTokenOut):
    token: str = Field(description="`suanli agent --token` on that node; shown once")


@dataclass(frozen=True)
class Reporter:
    """Who posts samples: an operator (any node), or an agent token (`node`: its node only)."""

    srv: Server
    now: datetime
    node: str | None

    @property
    def db(self) -> Database:
        return self.srv.db


def _agent_node(srv: Server, token: str) -> str:
    with srv.db.read() as s:
        return agent_tokens.node_of(s, token)


async def reporter(
    srv: Annotated[Server, Depends(server)],
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Reporter:
    if creds is not None and creds.scheme.lower() == "bearer" and agent_tokens.is_agent_token(creds.credentials):
        return Reporter(srv, utcnow(), await run_in_threadpool(_agent_node, srv, creds.credentials))
    ctx = await caller(srv, creds)
    accounts.require_admin(ctx.who)
    return Reporter(ctx.srv, ctx.now, None)


Reporting = Annotated[Reporter, Depends(reporter)]


@router.post("/admin/nodes/{node}/agent-tokens", status_code=201)
@in_thread
def create(node: str, ctx: Admin) -> NewAgentTokenOut:
    """A token for `suanli agent` on one node: it posts that node's samples and opens nothing else."""
    with ctx.db.write() as s, s.begin():
        shown, plain = agent_tokens.create(s, node, ctx.now)
    return NewAgentTokenOut(**shown.__dict__, token=plain)


@router.get("/admin/agent-tokens")
@in_thread
def listed(ctx: Admin) -> list[AgentTokenOut]:
    with ctx.db.read() as s:
        return [AgentTokenOut(**t.__dict__) for t in agent_tokens.listed(s)]


@router.delete("/admin/agent-tokens/{agent_token_id}")
@in_thread
def revoke(agent_token_id: str, ctx: Admin) -> AgentTokenOut:
    """Samples posted with it are refused from now on."""
    with ctx.db.write() as s, s.begin():
        return AgentTokenOut(**agent_tokens.revoke(s, agent_token_id, ctx.now).__dict__)

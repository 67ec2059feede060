"""Node agents' tokens: each posts GPU samples for its one node and opens nothing else.

`suanli agent` on a GPU node used to run with an operator's token, so whoever escaped a sandbox on any node held
the whole platform: top-up codes, every balance, every node's drain. An agent token (`sla_…`, shown once, kept as
its SHA-256) is refused by every route but `POST /telemetry/samples` (its prefix is not an account token's), and
there every sample must name its node.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from suanli.control.errors import Conflict, Forbidden, NotFound, Unauthorized
from suanli.control.ids import new_id, token_hash
from suanli.db.models import Node
from suanli.db.telemetry import AgentToken

PREFIX = "sla_"
MAX_LIVE = 8  # live tokens per node: enough to roll one over, few enough to keep track of


@dataclass(frozen=True)
class Shown:
    id: str
    node: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


MAX_LEN = 128


def is_agent_token(token: str) -> bool:
    return token.startswith(PREFIX)


def check_nodes(node: str | None, nodes: list[str]) -> None:
    """Refuse a batch naming another node than the agent token's (`node`; None: an operator's, any node), naming
    the first such sample."""
    bad = next((i for i, n in enumerate(nodes) if n != node), None) if node is not None else None
    if bad is not None:
        raise Forbidden(f"samples.{bad}.node: this agent token posts for {node} only")


def create(s: Session, node: str, now: datetime) -> tuple[Shown, str]:
    """A new token for `node` (by name); the token itself is returned once."""
    row = s.scalar(select(Node).where(Node.name == node))
    if row is None:
        raise NotFound(f"node {node} not found")
    live = s.scalar(select(func.count()).select_from(AgentToken)
                    .where(AgentToken.node_id == row.id, AgentToken.revoked_at.is_(None)))  # fmt: skip
    if (live or 0) >= MAX_LIVE:
        raise Conflict(f"node: {node} has {MAX_LIVE} live agent tokens; revoke one first")
    plain = PREFIX + secrets.token_urlsafe(32)
    tok = AgentToken(id=new_id("at"), node_id=row.id, token_hash=token_hash(plain), prefix=plain[: len(PREFIX) + 6],
                     created_at=now, revoked_at=None)  # fmt: skip
    s.add(tok)
    return Shown(tok.id, node, tok.prefix, now, None), plain


def listed(s: Session) -> list[Shown]:
    rows = s.execute(select(AgentToken, Node.name).join(Node, Node.id == AgentToken.node_id)
                     .order_by(Node.name, AgentToken.created_at))  # fmt: skip
    return [Shown(t.id, name, t.prefix, t.created_at, t.revoked_at) for t, name in rows]


def revoke(s: Session, token_id: str, now: datetime) -> Shown:
    row = s.get(AgentToken, token_id)
    if row is None:
        raise NotFound(f"agent token {token_id} not found")
    if row.revoked_at is None:
        row.revoked_at = now
    node = s.get(Node, row.node_id)
    return Shown(row.id, node.name if node else "", row.prefix, row.created_at, row.revoked_at)


def node_of(s: Session, token: str) -> str:
    """The node a live agent token posts for; Unauthorized for any other token."""
    if len(token) > MAX_LEN:
        raise Unauthorized("invalid, revoked or unknown agent token")
    name = s.scalar(select(Node.name).join(AgentToken, AgentToken.node_id == Node.id)
                    .where(AgentToken.token_hash == token_hash(token), AgentToken.revoked_at.is_(None)))  # fmt: skip
    if name is None:
        raise Unauthorized("invalid, revoked or unknown agent token")
    return name

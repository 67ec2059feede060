"""What every route gets: the server's state and the authenticated caller."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from suanli.control import accounts
from suanli.control.accounts import Principal
from suanli.control.errors import Unauthorized
from suanli.control.ids import utcnow
from suanli.control.offers import OfferCache
from suanli.control.settings import Settings
from suanli.db.engine import Database

bearer = HTTPBearer(auto_error=False, description="an API token (`suanli login` or `suanli tokens create`)")


@dataclass
class Server:
    settings: Settings
    db: Database
    offers: OfferCache


def server(request: Request) -> Server:
    return request.app.state.server


@dataclass(frozen=True)
class Caller:
    who: Principal
    srv: Server
    now: datetime

    @property
    def db(self) -> Database:
        return self.srv.db


def caller(
    srv: Annotated[Server, Depends(server)],
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Caller:
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
        raise Unauthorized("missing bearer token: log in (suanli login) and send 'Authorization: Bearer <token>'")
    now = utcnow()
    with srv.db.read() as s:
        who = accounts.authenticate(s, creds.credentials, now)
    return Caller(who, srv, now)


Auth = Annotated[Caller, Depends(caller)]
Srv = Annotated[Server, Depends(server)]

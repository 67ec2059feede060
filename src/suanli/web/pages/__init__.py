"""The console's pages, one module per area; each holds a router of server-rendered pages and htmx fragments."""

from __future__ import annotations

from fastapi import APIRouter

from suanli.web.pages import auth, dashboard, data, endpoints, keys, team, wallet

ROUTERS: tuple[APIRouter, ...] = (
    auth.router,
    dashboard.router,
    wallet.router,
    keys.router,
    team.router,
    data.router,
    endpoints.router,
)

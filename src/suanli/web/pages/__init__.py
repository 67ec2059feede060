"""The console's pages, one module per area; each holds a router of server-rendered pages and htmx fragments."""

from __future__ import annotations

from fastapi import APIRouter

from suanli.web.pages import auth, dashboard, instances, offers, run, workloads

ROUTERS: tuple[APIRouter, ...] = (
    auth.router,
    dashboard.router,
    workloads.router,
    run.router,
    offers.router,
    instances.router,
)

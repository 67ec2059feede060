"""The console's pages, one module per area; each holds a router of server-rendered pages and htmx fragments."""

from __future__ import annotations

from fastapi import APIRouter

from suanli.web.pages import (
    auth,
    dashboard,
    data,
    endpoints,
    instances,
    keys,
    offers,
    ops_accounts,
    ops_cluster,
    ops_codes,
    ops_nodes,
    ops_reports,
    password,
    run,
    team,
    verify,
    wallet,
    workloads,
)

ROUTERS: tuple[APIRouter, ...] = (
    auth.router,
    dashboard.router,
    offers.router,
    run.router,
    workloads.router,
    instances.router,
    wallet.router,
    verify.router,
    password.router,
    keys.router,
    team.router,
    data.router,
    endpoints.router,
    ops_cluster.router,
    ops_nodes.router,
    ops_reports.router,
    ops_accounts.router,
    ops_codes.router,
)

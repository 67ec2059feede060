"""The OpenAI-compatible gateway's routes, at /v1 (not under /api/v1: clients set `base_url=SERVER/v1`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from suanli.api.gateway import GatewayState, forward, models

router = APIRouter(tags=["openai"])


def _state(request: Request) -> GatewayState:
    app = request.app
    if getattr(app.state, "gateway", None) is None:
        app.state.gateway = GatewayState(app.state.server.db)
    return app.state.gateway


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    """The model this key opens (its endpoint's name)."""
    return await models(_state(request), request)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await forward(_state(request), request, "chat/completions")


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await forward(_state(request), request, "completions")


@router.post("/v1/embeddings")
async def embeddings(request: Request) -> Response:
    return await forward(_state(request), request, "embeddings")

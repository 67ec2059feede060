"""Hostile request bodies at the gateway answer 4xx or pass through to the runtime, never 500 (from a hostile
review of serving)."""

from __future__ import annotations

import json
from typing import Any

from tests.test_hardening_serving_money import (  # noqa: F401  (platform: the fixture)
    EP,
    SPEC,
    Replica,
    deploy_ready,
    platform,
    reports,
)
from tests.test_workloads_api import Platform


def _nested(d: int) -> bytes:
    return ('{"model":"chat","messages":[{"role":"user","content":"x","x":' + "[" * d + "]" * d + "}]}").encode()


def test_hostile_bodies_never_500(platform: Platform) -> None:  # noqa: F811
    replica = Replica(reports(1, 1))
    ep = deploy_ready(platform, replica.port, {**SPEC, "price_per_1m_tokens": "1"})
    key = platform.api.post(f"{EP}/{ep['id']}/keys", json={"password": "tenant-password"},
                            headers=platform.tenant.headers).json()["key"]  # fmt: skip
    h = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    m = [{"role": "user", "content": "x"}]
    bodies: list[bytes] = [_nested(d) for d in (900, 950, 970, 980, 985, 990, 995, 1000, 5000, 100_000)]
    docs: list[Any] = [
        {"model": "chat", "messages": m, "max_tokens": 1e400},
        {"model": "chat", "messages": m, "n": 2**200},
        {"model": "chat", "messages": m, "max_tokens": -1},
        {"model": "chat", "messages": m, "max_tokens": True},
        {"model": "chat", "messages": m, "stream_options": []},
        {"model": "chat", "messages": m, "stream": True, "stream_options": {"include_usage": False}},
        {"model": "chat", "messages": [{"role": "user", "content": "\ud800\udfff\u202e\x00"}]},
        {"model": "chat\u0000", "messages": m},
        {"model": ["chat"], "messages": m},
        {"model": "chat", "messages": [{"content": [1, None, {"type": None}]}]},
        {"model": "chat", "messages": m, "max_completion_tokens": 0, "max_tokens": 5},
        [1, 2, 3],
        "chat",
        None,
    ]
    bodies += [json.dumps(d).encode() for d in docs]
    bodies += [b"\xff\xfe\x00", b"\xef\xbb\xbf{}", b"{" * 10, b"", '{"model":"chat"}'.encode("utf-16")]
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
        for b in bodies:
            r = platform.api.post(path, content=b, headers=h)
            assert r.status_code != 500 and r.status_code < 502, (path, b[:80], r.status_code, r.text[:200])

"""Schema-driven fuzzing of the whole HTTP API: schemathesis generates requests from the app's own OpenAPI
document, valid ones (with real ids in the path, so they reach the services) and invalid ones, and sends them
in-process as a tenant and as an operator (`tests/test_api_fuzz_live.py` sends the same to a real server process
over HTTP). No answer may be a 5xx, and every answer must match the documented
status codes, content type and response schema.

Bounded: a few examples per operation, role and mode (fewer on PostgreSQL, whose per-request cost is higher);
each run draws new examples, so repeated runs keep exploring."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.control_plane import admin_token, bearer, join, signup

API = "/api/v1"
EXAMPLES = {"sqlite": 14, "postgresql": 10}  # per operation, role and generation mode
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
HTTPX_KWARGS = ("method", "url", "params", "headers", "cookies", "json", "content", "data", "files")


@dataclass
class Role:
    name: str
    headers: dict[str, str]
    ids: dict[str, str]  # path parameter -> a real value, so valid requests reach the services


def _roles(api: Any) -> list[Role]:
    adm = bearer(admin_token(api))
    for body in ({"preset": "2x8:H20", "name": "main"}, {"preset": "1x8:H20", "name": "scratch"}):
        assert api.post(f"{API}/admin/clusters", json=body, headers=adm).status_code == 201
    node = api.get(f"{API}/admin/nodes", params={"cluster": "main"}, headers=adm).json()[0]["name"]
    tenant, colleague = signup(api, "tenant@example.com"), signup(api, "colleague@example.com")
    team = api.post(f"{API}/orgs", json={"name": "fuzz-team"}, headers=tenant.headers).json()["id"]
    join(api, tenant, team, colleague)
    invitation = api.post(f"{API}/orgs/{team}/invitations", json={"email": "new@example.com"}, headers=tenant.headers)
    code = api.post(f"{API}/admin/invites", json={}, headers=adm)
    assert invitation.status_code == code.status_code == 201, (invitation.text, code.text)
    assert api.post(f"{API}/admin/orgs/{team}/transactions", json={"amount": "500"}, headers=adm).is_success
    spec = {"name": "fuzzed", "kind": "instance", "resources": {"gpus": 0}}
    r = api.post(f"{API}/workloads", json={"spec": spec, "org": team}, headers=tenant.headers)
    assert r.status_code == 201, r.text
    workload = r.json()["id"]
    r = api.post(f"{API}/volumes", json={"name": "fuzzvol", "size": "64Mi", "org": team}, headers=tenant.headers)
    assert r.status_code == 201, r.text
    volume = r.json()["id"]
    batch = api.post(f"{API}/admin/topup-codes", json={"amount": "5", "count": 3}, headers=adm)
    assert batch.status_code == 201, batch.text
    agent = api.post(f"{API}/admin/nodes/{node}/agent-tokens", json={}, headers=adm)
    assert agent.status_code == 201, agent.text
    roles = []
    for name, headers in (("tenant", tenant.headers), ("admin", adm)):
        spare = api.post(f"{API}/tokens", json={"name": "spare", "expires_in_days": 7}, headers=headers).json()["id"]
        ids = {"org_id": team, "org": team, "user_id": colleague.user_id, "token_id": spare, "node": node,
               "cluster": "scratch", "gpu": "H20", "ref": workload, "key_id": "key_0000",
               "invitation_id": invitation.json()["id"], "code_id": code.json()["id"], "name": "no-such-entry",
               "volume": volume, "batch_id": batch.json()["batch"]["id"], "provider": "hmac",
               "agent_token_id": agent.json()["id"]}  # fmt: skip
        roles.append(Role(name, headers, ids))
    return roles


def _httpx_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """What schemathesis prepares for `requests`, as the in-process (httpx) client takes it."""
    out = {k: v for k, v in kwargs.items() if k in HTTPX_KWARGS and v is not None and v != {}}
    out.setdefault("headers", {})
    if isinstance(out.get("data"), str | bytes):
        out["content"] = out.pop("data")
    out["headers"] = {k: v.encode() if isinstance(v, str) else v for k, v in out["headers"].items()}
    return out


def _repro(kw: dict[str, Any]) -> str:
    body = kw.get("json", kw.get("content", kw.get("data")))
    return f"{kw.get('method')} {kw.get('url')} params={kw.get('params')} body={json.dumps(body, default=repr)[:300]}"


def _fuzz(
    api: Any, op: Any, mode: GenerationMode, role: Role, examples: int, out: Counter[str], failures: list[str]
) -> None:
    pinned = {p: role.ids[p] for p in _path_params(op.path)} if mode is GenerationMode.POSITIVE else None
    fresh_token: Callable[[], dict[str, str]] = lambda: bearer(  # noqa: E731 — /logout must not end the run
        api.post(f"{API}/tokens", json={"name": "to-log-out", "expires_in_days": 7}, headers=role.headers).json()[
            "token"
        ]
    )

    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet)  # fmt: skip
    @given(case=op.as_strategy(generation_mode=mode, path_parameters=pinned))
    def one(case: Any) -> None:
        headers = fresh_token() if op.path == f"{API}/logout" else role.headers
        kw = case.as_transport_kwargs(headers=headers)
        label = f"[{role.name}, {mode.value}] {op.method.upper()} {op.path}"
        try:
            r = api.request(**_httpx_kwargs(kw))
        except httpx.LocalProtocolError:  # a live server's client would not send it (h11: a bad Content-Length
            out["unsendable"] += 1  # header the fuzz made): no byte reached the server, so nothing of it to judge
            return
        except Exception as e:  # the in-process client re-raises what the app did not handle: a 500
            failures.append(f"{label}: {type(e).__name__}: {e} <- {_repro(kw)}")
            return
        out[f"{r.status_code // 100}xx"] += 1
        try:
            case.validate_response(r, checks=CHECKS, headers=headers)
        except (AssertionError, BaseExceptionGroup) as e:
            kinds = sorted({getattr(x, "title", type(x).__name__) for x in getattr(e, "exceptions", [e])})
            failures.append(f"{label}: {r.status_code} {kinds}: {r.text[:200]} <- {_repro(kw)}")

    try:
        one()
    except Unsatisfiable:  # negative mode of an operation with nothing to get wrong
        out["unsatisfiable"] += 1


def _path_params(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{") and part.endswith("}")]


def fuzz_api(api: Any, openapi: dict[str, Any], examples: int) -> list[Role]:
    """Every operation of `openapi`, as a tenant (but not under /admin) and as the operator, valid and invalid
    requests, `examples` of each, sent with `api` (an httpx client: in-process or to a live server). Fails with
    every failure found; returns the roles (their tokens still valid)."""
    roles = _roles(api)
    schema = schemathesis.openapi.from_dict(openapi)
    ops = [result.ok() for result in schema.get_all_operations()]
    assert len(ops) >= 30, [op.label for op in ops]
    failures: list[str] = []
    seen: dict[str, Counter[str]] = {}
    for op in ops:
        for role in roles:
            if role.name == "tenant" and op.path.startswith(f"{API}/admin/"):
                continue  # a tenant only ever gets 403 there (test_api_isolation walks that)
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                _fuzz(api, op, mode, role, examples, seen.setdefault(f"{role.name} {op.label}", Counter()), failures)
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:40])
    answered = sum(c.total() - c["unsatisfiable"] for c in seen.values())
    assert answered >= len(ops) * examples, seen
    reached = sorted(k for k, c in seen.items() if c["2xx"])
    assert len(reached) >= len(ops) // 2, f"valid requests reached the services of only {reached}"
    assert api.get(f"{API}/me", headers=roles[0].headers).status_code == 200, "the tenant stayed logged in"
    check = api.get(f"{API}/admin/ledger/check", headers=roles[1].headers)
    assert check.status_code == 200 and check.json()["ok"], check.text
    return roles


def test_no_request_gets_a_server_error_or_breaks_the_schema(api: Any, request: pytest.FixtureRequest) -> None:
    fuzz_api(api, api.app.openapi(), EXAMPLES[request.node.callspec.params["db_url"]])

"""Tenant isolation: no endpoint lets one organisation read or change another's data.

The walk is generic: every route the app serves under /api/v1 is classified (global to any caller, operator-only,
or scoped by the ids in its path) and requested as a foreign tenant with the victim's ids. A route nobody
classified fails the test, so a new endpoint cannot ship without being walked."""

from __future__ import annotations

import gzip
import hashlib
import io
import itertools
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.routing import APIRoute

from suanli.control.ids import utcnow
from suanli.control.money import metering
from suanli.control.storage import hub
from suanli.web.pages import ROUTERS as WEB_ROUTERS
from tests.control_plane import Tenant, admin_token, bearer, join, signup

API = "/api/v1"
PASSWORD = "tenant-password"
# Routes any caller may use: they act on the caller's own account, or on nothing tenant-specific.
GLOBAL = {
    ("POST", "/signup"), ("POST", "/login"), ("POST", "/logout"), ("GET", "/me"), ("GET", "/tokens"),
    ("POST", "/tokens"), ("GET", "/orgs"), ("POST", "/orgs"), ("GET", "/prices"), ("GET", "/offers"),
    ("POST", "/quotes"), ("POST", "/quotes/workload"), ("POST", "/quotes/serve"), ("POST", "/quotes/storage"), ("GET", "/workloads"), ("POST", "/workloads"), ("GET", "/environments"),
    ("GET", "/keys"), ("POST", "/keys"), ("GET", "/ssh"), ("GET", "/invitations"), ("POST", "/workdirs"),
    ("GET", "/hub/models"), ("GET", "/hub/datasets"), ("GET", "/volumes"), ("POST", "/volumes"),
    ("GET", "/endpoints"), ("POST", "/endpoints"),
}  # fmt: skip
# For callers on the server's own host only (the same-host copy socket's address): 404 to the in-process client here.
LOCAL = {("GET", "/storage/local-copy")}
# The hub's public catalogue: every tenant may read any entry (no tenant's data in it).
CATALOG = {("GET", "/hub/models/{name}"), ("GET", "/hub/datasets/{name}")}
# The OpenAI gateway (outside /api/v1): it takes endpoint keys only, never a tenant's API token.
GATEWAY = {("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
           ("POST", "/v1/embeddings")}  # fmt: skip
# Payment webhooks: the provider's signature is the credential, never a token (tests/test_payments_webhook.py).
SIGNED = {("POST", "/payments/{provider}/webhook")}
# E-mail verification: a link's token is its own credential (it verifies the user it was mailed to, whoever sends
# it), and a resend acts on the caller. This world sends no mail, so both answer 4xx here: 422 (no such token) and
# 409 (no mail); what they do with mail is tests/test_email_verification.py.
VERIFY = {("POST", "/verify"), ("POST", "/verify/resend")}
# Passwords: a change acts on the caller and needs their current password (a wrong one here: 422); a reset link's
# token is its own credential (none such here: 422), and asking for one answers 409 in this world without mail;
# what they do is tests/test_passwords.py.
PASSWORDS = {("PUT", "/me/password"): 422, ("POST", "/password/forgot"): 409, ("POST", "/password/reset"): 422}
PUBLIC = {("POST", "/signup"), ("POST", "/login"), ("POST", "/verify"), ("POST", "/password/forgot"),
          ("POST", "/password/reset"), *SIGNED}  # no token needed  # fmt: skip
UNVERSIONED = {("GET", "/healthz"), ("GET", "/metrics")}  # the APIRoutes outside /api/v1
# The web console's pages (suanli.web): they answer a session cookie only. Without one, a page sends the browser to
# /login and a form is refused for its missing CSRF token; the sign-in pages and the API docs are public.
CONSOLE = {(m, r.path) for router in WEB_ROUTERS for r in router.routes for m in getattr(r, "methods", ())} | {
    ("GET", "/docs")
}
CONSOLE_PUBLIC = {("GET", "/docs"), ("GET", "/login"), ("GET", "/signup"), ("GET", "/verify"), ("GET", "/forgot"),
                  ("GET", "/reset")}  # fmt: skip
OPERATOR = {("POST", "/telemetry/samples"), ("GET", "/cluster/summary")}  # operator-only, outside /admin/
PROBE_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIInjAvsHnPEnhIT3CLfoR5qjDsvDKUqxWjtshpF4K1Wi probe"
VICTIM_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPYgWGKugdE1qhZINwqTdx8vVRu8YjxWU0L7RLCUqHML victim"
# A valid body per request model: a 422 would hide whether the caller was authorised.
SAMPLES: dict[str, dict[str, Any]] = {
    "TokenIn": {"name": "probe", "expires_in_days": 7},
    "InvitationIn": {"email": "mallory@example.com", "role": "owner"},
    "MemberPatch": {"monthly_spend_limit": "100"},
    "InviteCodeIn": {"uses": 5},
    "MoveIn": {"amount": "1000", "key": "steal"},
    "QuotaIn": {"gpus": 0},
    "PriceGpuIn": {"on_demand": "0.01"},
    "PlanPriceIn": {"hours": 24, "discount": "0.99"},
    "PriceHostIn": {"cpu_core_hour": "0.01"},
    "PriceUsageIn": {"gpu_hour": {"H20": "0.01"}, "floor": "0"},
    "StorageQuoteIn": {"size": "1Gi"},
    "WorkloadQuoteIn": {"spec": {"name": "probe", "command": "x", "resources": {"gpus": 0}}},
    "PriceBookIn": {
        "gpu_hour": {"H20": "0.01"},
        "plans": {"tiny": {"hours": 24, "discount": "0.5"}},
    },  # kept for DELETE
    "ClusterIn": {"preset": "1x8:H20", "name": "intruder"},
    "NodeStateIn": {"state": "down", "reason": "probe"},
    "AdminUserIn": {"email": "sleeper@example.com", "password": "password-123", "admin": True},
    "AdminUserPatch": {"admin": True},
    "QuoteIn": {"model": "llama3.1-8b", "tokens": 1e9, "gpus": 8},
    "ServeQuoteIn": {"model": "llama3.1-8b", "rps": 1},
    "PlanIn": {"plan": "hourly", "gpu": "H20", "gpus": 1},
    "WorkloadIn": {"spec": {"name": "probe", "kind": "instance", "resources": {"gpus": 0}}},
    "SamplesIn": {"samples": [{"node": "probe", "gpu": 0, "t": 1e9, "xid": 79}]},
    "FaultIn": {"gpu": 0, "kind": "off_bus"},
    "SshKeyIn": {"public_key": PROBE_KEY, "password": PASSWORD},
    "StartIn": {"no_gpu": True},
    "ScaleIn": {"gpus": 2},
    "ProxyIn": {},
    "VolumeIn": {"name": "probe-vol", "size": "1Gi"},
    "ResizeIn": {"size": "2Gi"},
    "SnapshotIn": {"message": "probe"},
    "RestoreIn": {"version": 1},
    "CloneIn": {"version": 1, "name": "probe-clone"},
    "EndpointIn": {
        "spec": {
            "name": "probe-chat",
            "kind": "service",
            "model": "tiny",
            "replicas": 0,
            "resources": {"gpu": "H20", "gpus": 1},
        }
    },
    "KeyIn": {"name": "probe", "password": PASSWORD},
    "BatchIn": {"amount": "1000", "count": 1},
    "VoidIn": {},
}
PROBE_SHA = hashlib.sha256(b"probe").hexdigest()
# Query parameters a route needs (a 422 for a missing one would hide whether the caller was authorised).
QUERY = {"files": "?path=hello.txt", "partial": "?path=hello.txt", "commit": f"?path=hello.txt&sha256={PROBE_SHA}", "stat": "?path=hello.txt", "ls": "?path=",
         "tree": "?path=", "diff": "?from=1&to=1"}  # fmt: skip


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


RAW = {
    ("POST", "/workdirs"): gzip.compress(bytes(1024)),  # an empty .tar.gz: two zero blocks
    ("PUT", "/volumes/{volume}/tree"): _tar({"probe.txt": b"probe"}),  # a plain tar
    ("PUT", "/volumes/{volume}/files"): b"probe",
}


def api_routes(app: Any) -> list[tuple[str, str, type | None]]:
    """(method, path, body model) of every API route, whichever way this FastAPI version lists included routers."""
    routes: list[Any] = [r for r in app.routes if isinstance(r, APIRoute)]
    if not any(r.path.startswith(API) for r in routes):
        from fastapi.routing import iter_route_contexts  # FastAPI >= 0.16x keeps included routers wrapped

        routes = [rc for rc in iter_route_contexts(app.routes) if isinstance(rc.original_route, APIRoute)]
    out = []
    for r in routes:
        model = r.body_field.field_info.annotation if r.body_field is not None else None
        out += [(m, str(r.path), model) for m in sorted(r.methods)]
    return out


@dataclass
class World:
    victim: Tenant
    colleague: Tenant  # a second member of the victim's team
    team: str  # the victim's team organisation
    team_name: str
    token_id: str  # a second token of the victim
    allocation: str
    attacker: Tenant
    attacker_team: str
    admin: dict[str, str]
    node: str
    cluster: str
    workload: str  # the victim's instance in its team
    ssh_key: str  # the victim's SSH key
    team_invitation: str  # the victim's team's pending invitation (to someone else)
    invitation: str  # a pending invitation to the victim (from the attacker's team)
    invite_code: str  # an operator's invite code
    volume: str  # the victim's team volume (with hello.txt, version 1)
    endpoint: str  # the victim's team endpoint (no replicas)
    endpoint_key: str  # a key of it
    topup_batch: str  # an operator's batch of top-up codes
    topup_code: str  # its code, unredeemed: the attacker tries it on the victim's orgs
    agent_token: str = ""  # an operator's agent token for `node`

    def secrets(self) -> list[str]:
        v, c = self.victim, self.colleague
        return [v.email, c.email, v.user_id, c.user_id, v.org_id, self.team, self.team_name, self.token_id,
                self.allocation, "victim-workload", self.workload, "victim-box", self.ssh_key, self.volume,
                "victim-data", self.endpoint, "victim-chat", self.endpoint_key]  # fmt: skip

    def values(self, name: str) -> list[str]:
        table = {
            "org_id": [self.team, self.victim.org_id], "org": [self.team, self.victim.org_id, self.victim.email],
            "token_id": [self.token_id], "user_id": [self.victim.user_id, self.colleague.user_id],
            "node": [self.node], "cluster": [self.cluster], "gpu": ["H20"],
            "ref": [self.workload, "victim-box", self.endpoint, "victim-chat"],
            "key_id": [self.ssh_key, self.endpoint_key], "invitation_id": [self.team_invitation, self.invitation],
            "code_id": [self.invite_code], "volume": [self.volume], "name": ["tiny"],
            "batch_id": [self.topup_batch], "provider": ["hmac"], "agent_token_id": [self.agent_token],
        }  # fmt: skip
        assert name in table, f"path parameter {{{name}}}: add the victim's value for it to World.values"
        return table[name]


@pytest.fixture
def world(api: Any) -> World:
    adm = bearer(admin_token(api))
    r = api.post(f"{API}/admin/clusters", json={"preset": "2x8:H20", "name": "shared"}, headers=adm)
    assert r.status_code == 201, r.text
    node = api.get(f"{API}/admin/nodes", headers=adm).json()[0]["name"]
    victim, colleague = signup(api, "victim@example.com", PASSWORD), signup(api, "colleague@example.com", PASSWORD)
    team = api.post(f"{API}/orgs", json={"name": "victim-team"}, headers=victim.headers).json()["id"]
    join(api, victim, team, colleague)
    r = api.post(f"{API}/orgs/{team}/invitations", json={"email": "newhire@example.com"}, headers=victim.headers)
    assert r.status_code == 201, r.text
    team_invitation = r.json()["id"]
    r = api.post(f"{API}/admin/orgs/{team}/transactions", json={"amount": "100", "key": "seed"}, headers=adm)
    assert r.status_code == 201, r.text
    token_id = api.post(f"{API}/tokens", json={"name": "ci", "expires_in_days": 7}, headers=victim.headers).json()["id"]
    db = api.app.state.server.db
    with db.write() as s, s.begin():
        alloc = metering.open_allocation(
            s, org_id=team, user_id=victim.user_id, workload="victim-workload", gpu_model="H20", gpus=8,
            placement={node: list(range(8))}, now=utcnow(), hold_minutes=10,
        )  # fmt: skip
        allocation = alloc.id
    spec = {"name": "victim-box", "kind": "instance", "resources": {"gpus": 0}}
    r = api.post(f"{API}/workloads", json={"spec": spec, "org": team}, headers=victim.headers)
    assert r.status_code == 201, r.text
    key = api.post(
        f"{API}/keys", json={"password": "tenant-password", "public_key": VICTIM_KEY}, headers=victim.headers
    )
    assert key.status_code == 201, key.text
    attacker = signup(api, "mallory@example.com", PASSWORD)
    attacker_team = api.post(f"{API}/orgs", json={"name": "mallory-team"}, headers=attacker.headers).json()["id"]
    invitation = api.post(f"{API}/orgs/{attacker_team}/invitations", json={"email": victim.email},
                          headers=attacker.headers).json()["id"]  # fmt: skip
    code = api.post(f"{API}/admin/invites", json={}, headers=adm).json()["id"]
    src = api.app.state.server.settings.home / "tiny-src"
    src.mkdir(parents=True)
    (src / "config.json").write_text('{"model_type": "llama"}')
    hub.add(db, hub.store_of(None, api.app.state.server.settings.home), "model", "tiny", str(src), utcnow(),
            repo_id="acme/tiny")  # fmt: skip
    vol = api.post(f"{API}/volumes", json={"name": "victim-data", "size": "1Gi", "org": team}, headers=victim.headers)
    assert vol.status_code == 201, vol.text
    up = api.put(f"{API}/volumes/{vol.json()['id']}/files", params={"path": "hello.txt"}, content=b"hello",
                 headers=victim.headers)  # fmt: skip
    assert up.status_code < 300, up.text
    snap = api.post(f"{API}/volumes/{vol.json()['id']}/versions", json={"message": "v1"}, headers=victim.headers)
    assert snap.status_code == 201, snap.text
    ep_spec = {"name": "victim-chat", "kind": "service", "model": "tiny", "replicas": 0,
               "resources": {"gpu": "H20", "gpus": 1}}  # fmt: skip
    ep = api.post(f"{API}/endpoints", json={"spec": ep_spec, "org": team}, headers=victim.headers)
    assert ep.status_code == 201, ep.text
    ek = api.post(
        f"{API}/endpoints/{ep.json()['id']}/keys",
        json={"password": "tenant-password", "name": "victim"},
        headers=victim.headers,
    )
    assert ek.status_code == 201, ek.text
    tc = api.post(f"{API}/admin/topup-codes", json={"amount": "5", "count": 1}, headers=adm)
    assert tc.status_code == 201, tc.text
    agent = api.post(f"{API}/admin/nodes/{node}/agent-tokens", json={}, headers=adm)
    assert agent.status_code == 201, agent.text
    return World(victim, colleague, team, "victim-team", token_id, allocation, attacker, attacker_team, adm,
                 node, "shared", r.json()["id"], key.json()["id"], team_invitation, invitation, code,
                 vol.json()["id"], ep.json()["id"], ek.json()["id"], tc.json()["batch"]["id"],
                 tc.json()["codes"][0]["code"], agent.json()["id"])  # fmt: skip


def _body(w: World, method: str, path: str, model: type | None, n: int) -> dict[str, Any] | None:
    if model is None:
        return None
    if path == "/signup":
        return {"email": f"newcomer{n}@example.com", "password": PASSWORD}
    if path == "/login":
        return {"email": w.attacker.email, "password": PASSWORD}
    if path == "/verify":
        return {"token": "A" * 43}
    if path == "/me/password":
        return {"current_password": "not-the-password", "new_password": "another-password-1"}
    if path == "/password/forgot":
        return {"email": w.victim.email}
    if path == "/password/reset":
        return {"token": "A" * 43, "new_password": "another-password-1"}
    if path == "/orgs":
        return {"name": f"mallory-org-{n}"}
    if path.endswith("/redeem"):  # a real code: the victim's own redemption works, the attacker's must not
        return {"code": w.topup_code}
    if path.startswith("/endpoints/") and path.endswith("/scale"):  # (the workloads' ScaleIn has the same name)
        return {"replicas": 0}
    assert model.__name__ in SAMPLES, f"{method} {path}: add a valid sample {model.__name__} body to SAMPLES"
    return SAMPLES[model.__name__]


def _requests(w: World, method: str, path: str) -> Iterator[str]:
    """The concrete URLs of one route with every combination of the victim's ids."""
    names = re.findall(r"{(\w+)}", path)
    for combo in itertools.product(*(w.values(n) for n in names)):
        url = path
        for name, value in zip(names, combo, strict=True):
            url = url.replace(f"{{{name}}}", value)
        yield url + QUERY.get(path.rsplit("/", 1)[-1], "")


def _send(api: Any, method: str, path: str, url: str, body: dict[str, Any] | None, headers: dict[str, str]) -> Any:
    if path == "/volumes/{volume}/commit":  # what it commits: an upload the same caller holds
        held = url.replace("/commit?", "/files?").split("&")[0] + "&hold=true"
        api.put(held, content=b"probe", headers=headers)
    if (method, path) in RAW:  # a body that is not JSON
        return api.request(method, url, content=RAW[method, path], headers=headers)
    return api.request(method, url, json=body, headers=headers)


def _snapshot(api: Any, w: World) -> dict[str, Any]:
    """Everything of the victim's that a foreign tenant might read or change."""
    h = w.victim.headers
    me = api.get(f"{API}/me", headers=h)
    assert me.status_code == 200, me.text
    admin_orgs = {o["id"]: o for o in api.get(f"{API}/admin/orgs", headers=w.admin).json()}
    admin_users = {u["id"]: u for u in api.get(f"{API}/admin/users", headers=w.admin).json()}
    return {
        "me": me.json(),
        "tokens": api.get(f"{API}/tokens", headers=h).json(),
        "keys": api.get(f"{API}/keys", headers=h).json(),
        "orgs": [admin_orgs[o] for o in (w.team, w.victim.org_id)],
        "users": [admin_users[u] for u in (w.victim.user_id, w.colleague.user_id)],
        **{
            f"{org}{part}": api.get(f"{API}/orgs/{org}{part}", headers=h).json()
            for org in (w.team, w.victim.org_id)
            for part in ("", "/members", "/balance", "/transactions", "/usage")
        },
        "colleague": api.get(f"{API}/orgs/{w.team}", headers=w.colleague.headers).json(),
        "workloads": api.get(f"{API}/workloads", params={"all": True}, headers=h).json(),
        "workload": api.get(f"{API}/workloads/{w.workload}", headers=h).json(),
    }


def headers_for_proxy(w: World) -> dict[str, str]:
    """The attacker's bearer token and a made-up session cookie: neither opens an instance."""
    return {**w.attacker.headers, "Cookie": "suanli_proxy=" + "x" * 43}


def test_a_foreign_tenant_can_neither_read_nor_change_anything(api: Any, world: World) -> None:
    w = world
    before = _snapshot(api, w)
    assert before[f"{w.team}/balance"]["held_per_hour"] == "68.00", "the victim's allocation is open"
    logout_token = api.post(
        f"{API}/tokens", json={"name": "to-log-out", "expires_in_days": 7}, headers=w.attacker.headers
    ).json()["token"]
    routes = api_routes(api.app)
    walked: set[tuple[str, str]] = set()
    problems: list[str] = []
    for n, (method, full, model) in enumerate(routes):
        if full.startswith("/i/"):  # the instance proxy: a session cookie for the instance, never a bearer token
            url = full.replace("{wid}", w.workload).replace("{port}", "6006").replace("{path}", "api/status")
            r = api.request(method, url.replace("{ticket}", "x" * 43) + ("?ticket=" + "x" * 43 if "auth" in url else ""),
                            headers=headers_for_proxy(w))  # fmt: skip
            redirect = r.status_code == 307 and r.headers["location"].startswith(f"/i/{w.workload}/")
            if r.status_code not in (403, 404) and not redirect:
                problems.append(f"{method} {url}: {r.status_code}: {r.text[:200]}")
            continue
        if (method, full) in GATEWAY:  # a tenant's API token is not an endpoint key
            r = api.request(method, full, json={"model": "victim-chat"}, headers=w.attacker.headers)
            if r.status_code != 401 or any(x in r.text for x in w.secrets()):
                problems.append(f"{method} {full}: {r.status_code}: {r.text[:200]}")
            continue
        if (method, full) in CONSOLE:  # the web console: a session cookie, never a bearer token (tests/test_web_*)
            url = re.sub(r"\{[^}]+\}", "x", full)
            r = api.request(method, url, headers=w.attacker.headers, follow_redirects=False)
            public = (method, full) in CONSOLE_PUBLIC and r.status_code == 200
            refused = r.status_code in (403, 404) or (
                r.status_code == 303 and r.headers["location"].startswith("/login")
            )
            if not (public or refused) or any(x in r.text for x in w.secrets()):
                problems.append(f"{method} {url}: {r.status_code}: {r.text[:200]}")
            continue
        if not full.startswith(API):
            assert (method, full) in UNVERSIONED, f"{method} {full}: a route outside {API}; classify it"
            if full == "/metrics" and api.get(full, headers=w.attacker.headers).status_code != 403:
                problems.append("GET /metrics: a tenant may read the operator's exposition")
            continue
        path = full[len(API) :]
        headers = bearer(logout_token) if path == "/logout" else w.attacker.headers
        body = _body(w, method, path, model, n)
        if (method, path) in CATALOG:  # public: the attacker reads exactly what the victim reads, and no secret
            for url in _requests(w, method, full):
                r, mine = api.request(method, url, headers=headers), api.request(method, url, headers=w.victim.headers)
                if (r.status_code, r.text) != (mine.status_code, mine.text) or any(x in r.text for x in w.secrets()):
                    problems.append(f"{method} {url}: {r.status_code}: {r.text[:200]}")
        elif (method, path) in LOCAL:
            r = api.request(method, full, headers=headers)
            if r.status_code != 404 or any(x in r.text for x in w.secrets()):
                problems.append(f"{method} {path}: {r.status_code} to a caller off the host: {r.text[:200]}")
        elif (method, path) in VERIFY:
            r = api.request(method, full, json=body, headers=headers)
            if r.status_code != {"/verify": 422, "/verify/resend": 409}[path] or any(x in r.text for x in w.secrets()):
                problems.append(f"{method} {path}: {r.status_code}: {r.text[:200]}")
        elif (method, path) in PASSWORDS:
            r = api.request(method, full, json=body, headers=headers)
            if r.status_code != PASSWORDS[method, path] or any(x in r.text for x in w.secrets()):
                problems.append(f"{method} {path}: {r.status_code}: {r.text[:200]}")
        elif (method, path) in GLOBAL:
            if (method, path) in RAW:  # a body that is not JSON
                r = api.request(method, full, content=RAW[method, path], headers=headers)
            else:
                r = api.request(method, full, json=body, headers=headers)
            leaked = [x for x in w.secrets() if x in r.text]
            if r.status_code >= 400 or leaked:
                problems.append(f"{method} {path}: {r.status_code}, leaks {leaked}: {r.text[:200]}")
        elif path.startswith("/admin/") or "{" in path or (method, path) in OPERATOR:
            expected = {403} if path.startswith("/admin/") or (method, path) in OPERATOR else {403, 404}
            for url in _requests(w, method, full):
                r = _send(api, method, path, url, body, headers)
                if r.status_code not in expected or any(x in r.json()["detail"] for x in w.secrets()[:4]):
                    problems.append(f"{method} {url}: {r.status_code} (expected {sorted(expected)}): {r.text[:200]}")
        else:
            problems.append(f"{method} {path}: not classified; add it to GLOBAL if any caller may use it")
        walked.add((method, full))
    for method, full in sorted(GATEWAY):  # served ahead of the API's routes (api.gateway_asgi): walked by name
        r = api.request(method, full, json={"model": "victim-chat"}, headers=w.attacker.headers)
        if r.status_code != 401 or any(x in r.text for x in w.secrets()):
            problems.append(f"{method} {full}: {r.status_code}: {r.text[:200]}")
    assert not problems, "\n".join(problems)
    assert walked == {(m, p) for m, p, _ in routes if p.startswith(API)}
    assert len(walked) >= 30
    assert api.get(f"{API}/me", headers=w.attacker.headers).status_code == 200, "the walk ran authenticated"
    assert _snapshot(api, w) == before


def test_the_walk_was_not_refused_for_its_bodies(api: Any, world: World) -> None:
    """Control: the same requests, made by the victim on its own team (and by an operator on admin routes), are
    accepted for some combination of the victim's ids (an invitation the victim may cancel is not one it may
    accept), so the foreign tenant's 403/404 came from isolation, not from a malformed probe."""
    w = world
    problems = []
    # deletions last, a resource's parts before it: they remove what others use
    routes = sorted(api_routes(api.app), key=lambda r: (r[0] == "DELETE", -len(r[1])))
    for n, (method, full, model) in enumerate(routes):
        path = full[len(API) :]
        if not full.startswith(API) or (method, path) in GLOBAL | CATALOG | SIGNED | LOCAL | VERIFY | PASSWORDS.keys():
            continue
        body = _body(w, method, path, model, n)
        headers = w.admin if path.startswith("/admin/") else w.victim.headers
        refused = []
        for url in _requests(w, method, full):
            r = _send(api, method, path, url, body, headers)
            if r.status_code not in (401, 403, 404, 422) and r.status_code < 500:
                break
            refused.append(f"{method} {url}: {r.status_code}: {r.text[:200]}")
        else:
            problems += refused
    assert not problems, "\n".join(problems)


def test_without_a_token_only_signup_and_login_answer(api: Any, world: World) -> None:
    problems = []
    for n, (method, full, model) in enumerate(api_routes(api.app)):
        path = full[len(API) :]
        if not full.startswith(API) or (method, path) in PUBLIC:
            continue
        for url in _requests(world, method, full):
            r = api.request(method, url, json=_body(world, method, path, model, n))
            if r.status_code != 401 or "bearer token" not in r.json()["detail"]:
                problems.append(f"{method} {url}: {r.status_code}: {r.text[:200]}")
    assert not problems, "\n".join(problems)


def test_the_attackers_own_org_does_not_reach_the_victims_users(api: Any, world: World) -> None:
    w = world
    own = w.attacker_team
    r = api.delete(f"{API}/orgs/{own}/members/{w.victim.user_id}", headers=w.attacker.headers)
    assert r.status_code == 404, r.text
    usage = api.get(f"{API}/orgs/{own}/usage", params={"user_id": w.victim.user_id}, headers=w.attacker.headers)
    assert usage.status_code == 200 and usage.json() == []
    csv = api.get(f"{API}/orgs/{own}/usage", params={"format": "csv"}, headers=w.attacker.headers)
    assert csv.status_code == 200 and not any(x in csv.text for x in w.secrets())
    r = api.post(f"{API}/orgs/{own}/invitations", json={"email": w.victim.email}, headers=w.attacker.headers)
    assert r.status_code == 201, "inviting someone to your own team is allowed..."
    assert own not in {o["id"] for o in api.get(f"{API}/me", headers=w.victim.headers).json()["orgs"]}, "...not joining"
    assert api.get(f"{API}/orgs/{w.team}/balance", headers=w.attacker.headers).status_code == 404, "...not the reverse"
    r = api.delete(f"{API}/tokens/{w.token_id}", headers=w.attacker.headers)
    assert r.status_code == 404 and w.victim.email not in r.text
    assert api.post(f"{API}/login", json={"email": w.victim.email, "password": "guess-guess"}).status_code == 401

"""Operator routes, telemetry ingest and reads under a hostile review's attacks, which held: a tenant's token reaches
no operator route, hostile sample batches store nothing, hostile strings stay inside the exposition's labels, report
ranges are bounded, and a walk over every /api/v1 route with an id in its path finds no cross-org existence oracle."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from suanli.control.ids import utcnow
from suanli.control.money import revenue
from suanli.control.scheduling import waste_history
from tests.control_plane import bearer
from tests.endpoint_scene import API, PASSWORD, scene
from tests.test_api_isolation import (  # noqa: F401  (world: the fixture)
    CATALOG,
    QUERY,
    World,
    _body,
    _send,
    api_routes,
    world,
)

OPERATOR_ONLY = [
    ("POST", "/telemetry/samples", {"samples": [{"node": "n", "gpu": 0, "t": 1e9, "xid": 79}]}),
    ("POST", "/admin/nodes/{node}/faults", {"gpu": 0, "kind": "off_bus"}),
    ("GET", "/nodes/{node}/metrics", None),
    ("GET", "/admin/nodes/{node}/events", None),
    ("GET", "/admin/gpus", None),
    ("GET", "/cluster/summary", None),
    ("GET", "/admin/revenue", None),
    ("GET", "/admin/waste", None),
    ("PATCH", "/admin/nodes/{node}", {"state": "draining", "reason": "probe"}),
]


def test_a_tenants_never_expiring_token_reaches_no_operator_route(api: Any) -> None:
    """A tenant's API token (no expiry, made with its password) is still a tenant's: no sample, fault, drain or
    fleet read, and /metrics is refused."""
    sc = scene(api)
    for method, path, body in OPERATOR_ONLY:
        r = api.request(method, API + path.replace("{node}", sc.node), json=body, headers=sc.attacker_forever)
        assert r.status_code == 403, (method, path, r.status_code, r.text)
    assert api.get("/metrics", headers=sc.attacker_forever).status_code == 403
    node = api.get(f"{API}/admin/nodes/{sc.node}", headers=sc.admin).json()
    assert node["state"] == "ready" and all(g["healthy"] for g in node["gpus"])


def _sample(node: str, **over: Any) -> dict[str, Any]:
    return {"node": node, "gpu": 0, "t": utcnow().timestamp() - 1, "util": 50.0, **over}


def test_hostile_sample_batches_are_refused_with_4xx_and_store_nothing(api: Any) -> None:
    """Even from an operator's token (a node agent's): NaN/Infinity, negatives, overflowing numbers, unbounded
    strings, a batch over the limit, future clocks and unknown fields answer 4xx, never 500, and store nothing."""
    sc = scene(api)
    n = sc.node
    raw = [
        b'{"samples": [{"node": "%s", "gpu": 0, "t": NaN}]}' % n.encode(),
        b'{"samples": [{"node": "%s", "gpu": 0, "t": 1e9, "util": Infinity}]}' % n.encode(),
        b'{"samples": [{"node": "%s", "gpu": 0, "t": 1e9, "temp_c": -Infinity}]}' % n.encode(),
        b'{"samples": [{"node": "%s", "gpu": 0, "t": 1e9, "t": 2e9}]}' % n.encode(),
    ]
    bodies: list[Any] = [
        {"samples": [_sample(n, util=-1)]},
        {"samples": [_sample(n, util=100.0001)]},
        {"samples": [_sample(n, gpu=-1)]},
        {"samples": [_sample(n, gpu=1 << 70)]},
        {"samples": [_sample(n, ecc_dbe=1 << 63)]},
        {"samples": [_sample(n, mem_used_mib=1e300)]},
        {"samples": [_sample(n, t=1e300)]},
        {"samples": [_sample(n, t=-5)]},
        {"samples": [_sample(n, t=utcnow().timestamp() + 3600)]},
        {"samples": [_sample(n, error="x" * 501)]},
        {"samples": [_sample(n, uuid="u" * 97)]},
        {"samples": [_sample("n" * 256)]},
        {"samples": [_sample(n, node_extra="x")]},
        {"samples": [_sample(n)] * 20_001},
        {"samples": [_sample(n, error="\x00")]},
    ]
    for body in raw:
        r = api.post(f"{API}/telemetry/samples", content=body, headers={**sc.admin, "content-type": "application/json"})
        assert 400 <= r.status_code < 500, (body[:80], r.status_code, r.text[:200])
    for body in bodies:
        r = api.post(f"{API}/telemetry/samples", json=body, headers=sc.admin)
        assert 400 <= r.status_code < 500, (json.dumps(body)[-80:], r.status_code, r.text[:200])
    m = api.get(f"{API}/nodes/{n}/metrics", params={"resolution": "raw"}, headers=sc.admin).json()
    assert all(g["points"] == [] for g in m["gpus"])
    node = api.get(f"{API}/admin/nodes/{n}", headers=sc.admin).json()
    assert node["state"] == "ready" and all(g["healthy"] for g in node["gpus"])


def test_hostile_strings_in_samples_do_not_break_the_exposition(api: Any) -> None:
    """An agent's `error` and `uuid` with quotes, backslashes and newlines: /metrics stays parseable and no series
    is forged from them."""
    sc = scene(api)
    evil = 'x"} 1\nDCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="forged"} 99\n# \\'
    samples = [_sample(sc.node, gpu=1, uuid=evil[:96], util=12.0), _sample(sc.node, gpu=2, error=evil)]
    r = api.post(f"{API}/telemetry/samples", json={"samples": samples}, headers=sc.admin)
    assert r.status_code == 200, r.text
    text = api.get("/metrics", headers=sc.admin).text
    hosts = {s.labels.get("Hostname") for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert "forged" not in hosts


@pytest.mark.parametrize(
    "path,params",
    [
        ("/admin/revenue", {"days": revenue.MAX_DAYS + 1}),
        ("/admin/revenue", {"days": 0}),
        ("/admin/waste", {"hours": waste_history.MAX_HOURS + 1}),
        ("/admin/waste", {"hours": 10**30}),
        ("/admin/nodes/{node}/events", {"limit": 10_001}),
        ("/admin/users", {"limit": 10**9}),
        ("/admin/nodes", {"offset": -1}),
        ("/nodes/{node}/metrics", {"since": "not-a-date"}),
        ("/nodes/{node}/metrics", {"since": "2030-01-01T00:00:00Z", "until": "2020-01-01T00:00:00Z"}),
    ],
)
def test_operator_report_ranges_are_bounded(api: Any, path: str, params: dict[str, Any]) -> None:
    sc = scene(api, price=None)
    r = api.get(API + path.replace("{node}", sc.node), params=params, headers=sc.admin)
    assert r.status_code == 422, (path, params, r.status_code, r.text[:200])


def test_extreme_but_valid_dates_on_the_tenant_metrics_route_do_not_500(api: Any) -> None:
    sc = scene(api, price=None)
    spec = {"name": "box", "kind": "instance", "resources": {"gpus": 0}}
    w = api.post(f"{API}/workloads", json={"spec": spec, "org": sc.team}, headers=sc.victim.headers).json()
    for since, until in [("0001-01-01T00:00:00+14:00", None), (None, "9999-12-31T23:59:59-14:00"),
                         ("0001-01-01T00:00:00", "9999-12-31T23:59:59"), ("1970-01-01T00:00:00Z", None)]:  # fmt: skip
        params = {k: v for k, v in (("since", since), ("until", until), ("resolution", "raw")) if v}
        r = api.get(f"{API}/workloads/{w['id']}/metrics", params=params, headers=sc.victim.headers)
        assert r.status_code in (200, 422), (params, r.status_code, r.text[:200])
        other = api.get(f"{API}/workloads/{w['id']}/metrics", params=params, headers=sc.attacker.headers)
        ghost = api.get(f"{API}/workloads/wl_{'0' * 16}/metrics", params=params, headers=sc.attacker.headers)
        assert other.status_code == ghost.status_code == 404


def test_foreign_ids_answer_exactly_as_ids_that_do_not_exist(api: Any, world: World) -> None:  # noqa: F811
    """An attacker holding another org's ids learns nothing from them: every path-id route answers a foreign id
    with the same status and message (the id swapped) as an id nobody has."""
    w = world
    r = api.post(f"{API}/tokens", json={"name": "forever", "password": PASSWORD}, headers=w.attacker.headers)
    assert r.status_code == 201, r.text
    me = bearer(r.json()["token"])  # never expires: no password asked again (each ask counts as a login)
    problems: list[str] = []
    for n, (method, full, model) in enumerate(api_routes(api.app)):
        if not full.startswith(API) or "{" not in full or full.startswith(f"{API}/admin/"):
            continue
        path = full[len(API) :]
        if (method, path) in CATALOG or path.endswith("/webhook"):
            continue
        body = _body(w, method, path, model, n)
        names = re.findall(r"{(\w+)}", path)
        for name in names:
            for value in w.values(name):
                fake = _fake(value)
                query = QUERY.get(path.rsplit("/", 1)[-1], "")
                a = _send(api, method, path, _fill(full, names, name, value, w) + query, body, me)
                b = _send(api, method, path, _fill(full, names, name, fake, w) + query, body, me)
                da, db_ = str(a.json().get("detail")), str(b.json().get("detail"))
                if a.status_code != b.status_code or da.replace(value, fake) != db_:
                    problems.append(f"{method} {path} {{{name}}}: foreign {a.status_code} {da[:120]!r} "
                                    f"vs none {b.status_code} {db_[:120]!r}")  # fmt: skip
    assert not problems, "\n".join(problems)


def _fake(value: str) -> str:
    """An id of the same shape that nobody has."""
    if "@" in value:
        return "nobody-" + value
    head, _, tail = value.rpartition("_")
    return f"{head}_{'z' * len(tail)}" if head else "z" * len(value)


def _fill(full: str, names: list[str], which: str, value: str, w: World) -> str:
    url = full
    for name in names:
        url = url.replace(f"{{{name}}}", value if name == which else w.values(name)[0])
    return url

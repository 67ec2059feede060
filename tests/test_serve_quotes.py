"""`POST /api/v1/quotes/serve` (`suanli quote --serve`): replicas and GPUs from the performance model's inference
estimates, priced exactly from the price book, every input bounded (422 naming the field). In-process, on SQLite
and PostgreSQL (the `api` fixture)."""

from __future__ import annotations

from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any

import pytest

import suanli.client
from suanli import catalog
from suanli.client import Client
from suanli.perf import model_preset
from suanli.perf.plan import Placement
from suanli.perf.serve_plan import SLO, ServeOffer, size_replicas
from suanli.topology import presets
from tests.cli_helpers import invoke
from tests.control_plane import Tenant, admin_token, bearer, signup
from tests.test_host_billing import forwarding

API = "/api/v1"
PRESET = "h20-roce800-128"
ASK = {"model": "llama3.1-8b", "rps": 10}


@pytest.fixture
def market(api: Any) -> tuple[Any, Tenant, dict[str, Any]]:
    adm = bearer(admin_token(api))
    assert api.post(f"{API}/admin/clusters", json={"preset": PRESET}, headers=adm).status_code == 201
    who = signup(api, "tenant@example.com")
    return api, who, api.get(f"{API}/prices", headers=who.headers).json()


def _quote(api: Any, who: Tenant, **body: Any) -> dict[str, Any]:
    r = api.post(f"{API}/quotes/serve", json={**ASK, **body}, headers=who.headers)
    assert r.status_code == 200, r.text
    return r.json()


def _per_million(per_hour: Decimal, tokens_per_hour: Decimal) -> Decimal:
    return (per_hour * 1_000_000 / tokens_per_hour).quantize(Decimal("0.00000001"), rounding=ROUND_CEILING)


def test_replicas_from_the_performance_model_priced_exactly(market: tuple[Any, Tenant, dict[str, Any]]) -> None:
    api, who, book = market
    doc = _quote(api, who, rps="12.5", input_len=512, output_len=128)
    (row,) = doc["offers"]
    assert (row["gpu"], row["cluster"], doc["currency"]) == ("H20", PRESET, book["currency"])
    # the same sizing as the performance model's own search on this cluster's layout
    spec = presets.preset_spec(PRESET)
    from suanli.control.scheduling.inventory import build_cluster

    topo = build_cluster(spec)
    placement = Placement(topo, topo.compact_gpus(8))
    offer = ServeOffer(catalog.gpu("H20"), Decimal(book["gpu_hour"]["H20"]), 8, placement.domain_size,
                       placement.group_fn())  # fmt: skip
    best = size_replicas(model_preset("llama3.1-8b"), offer, SLO(2.0, 0.1), 12.5, 512, 128)[0]
    assert (row["replicas"], row["gpus_per_replica"], row["precision"]) == (
        best.replicas, best.layout.gpus, best.precision)  # fmt: skip
    assert row["gpus"] == row["replicas"] * row["gpus_per_replica"]
    per_hour = Decimal(book["gpu_hour"]["H20"]) * row["gpus"]
    assert Decimal(row["rate_per_hour"]) == per_hour  # exact: no float anywhere
    assert Decimal(row["per_1m_tokens"]) == _per_million(per_hour, Decimal("12.5") * 640 * 3600)
    assert Decimal(row["per_1m_output_tokens"]) == _per_million(per_hour, Decimal("12.5") * 128 * 3600)
    assert row["available_now"] is True and row["free_gpus"] >= row["gpus"]
    more = _quote(api, who, rps=2000, input_len=512, output_len=128)["offers"][0]
    assert more["replicas"] * more["gpus_per_replica"] > row["gpus"]  # a higher rate needs more GPUs


def test_host_resources_and_spot_are_priced_like_a_replica_workload(
    market: tuple[Any, Tenant, dict[str, Any]],
) -> None:  # fmt: skip
    api, who, book = market
    (row,) = _quote(api, who, cpus_per_replica="4.5", memory_per_replica="24Gi", billing_mode="spot")["offers"]
    spot = Decimal(book["spot_factor"])
    gpu_h = (Decimal(book["gpu_hour"]["H20"]) * spot).quantize(Decimal("0.00000001")) * row["gpus_per_replica"]
    host_h = (Decimal("4.5") * Decimal(book["cpu_core_hour"]) + 24 * Decimal(book["memory_gib_hour"])) * spot
    assert Decimal(row["replica_per_hour"]) == gpu_h + host_h
    assert Decimal(row["rate_per_hour"]) == (gpu_h + host_h) * row["replicas"]


def test_an_slo_no_layout_keeps_names_the_offer(market: tuple[Any, Tenant, dict[str, Any]]) -> None:
    api, who, _ = market
    doc = _quote(api, who, slo_itl_ms="0.001")
    assert doc["offers"] == [] and doc["cannot_meet_slo"] == [f"H20 ({PRESET})"]
    assert _quote(api, who, gpu="H100-SXM")["offers"] == []  # a GPU model nobody registered: nothing on offer


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"rps": 0}, "rps"), ({"rps": -1}, "rps"), ({"rps": 10**7}, "rps"), ({"rps": "NaN"}, "rps"),
        ({"rps": "1e999"}, "rps"), ({"rps": "0.0001"}, "rps"), ({"rps": [1]}, "rps"),
        ({"input_len": 0}, "input_len"), ({"output_len": 2**21}, "output_len"), ({"slo_ttft_ms": 0}, "slo_ttft_ms"),
        ({"slo_itl_ms": 10**9}, "slo_itl_ms"), ({"model": "nope"}, "model"), ({"model": "x" * 65}, "model"),
        ({"gpu": "nope"}, "gpu"), ({"precision": ["fp3"]}, "precision"), ({"precision": []}, "precision"),
        ({"max_gpus_per_replica": 0}, "max_gpus_per_replica"), ({"max_gpus_per_replica": 65}, "max_gpus_per_replica"),
        ({"billing_mode": "usage"}, "billing_mode"), ({"memory_per_replica": "lots"}, "memory_per_replica"), ({"memory_per_replica": "9" * 40 + "Gi"}, "memory_per_replica"),
        ({"cpus_per_replica": "0.0001"}, "cpus_per_replica"), ({"surprise": 1}, "surprise"),
    ],
)  # fmt: skip
def test_every_input_is_bounded_422_naming_the_field(
    market: tuple[Any, Tenant, dict[str, Any]], change: dict[str, Any], field: str
) -> None:
    api, who, _ = market
    r = api.post(f"{API}/quotes/serve", json={**ASK, **change}, headers=who.headers)
    assert r.status_code == 422 and field in r.json()["detail"], r.text


def test_a_quote_needs_an_account(market: tuple[Any, Tenant, dict[str, Any]]) -> None:
    api, _, _ = market
    assert api.post(f"{API}/quotes/serve", json=ASK).status_code == 401


def test_the_sdk_and_the_cli_quote_serving(
    market: tuple[Any, Tenant, dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    api, who, _ = market
    transport = forwarding(api)

    class Forwarded(Client):
        def __init__(self, server: str | None = None, token: str | None = None, **kw: Any) -> None:
            super().__init__(server, token, transport=transport)

    monkeypatch.setattr(suanli.client, "Client", Forwarded)
    monkeypatch.setenv("SUANLI_HOME", str(tmp_path / "cli-home"))
    monkeypatch.setenv("SUANLI_SERVER", "http://suanli.test")
    monkeypatch.setenv("SUANLI_TOKEN", who.token)
    monkeypatch.setenv("COLUMNS", "240")
    q = suanli.client.Client("http://suanli.test", who.token).quote_serve(
        "llama3.1-8b", Decimal("12.5"), output_len=128, billing_mode="spot"
    )
    (o,) = q.offers
    assert (q.rps, q.billing_mode, o.gpu) == (Decimal("12.5"), "spot", "H20")
    assert isinstance(o.per_1m_tokens, Decimal) and o.rate_per_hour == o.replica_per_hour * o.replicas
    out = invoke(["quote", "--serve", "--model", "llama3.1-8b", "--rps", "12.5", "--output-len", "128", "--spot"])
    assert "H20" in out.stdout and f"{o.per_1m_tokens:,.4f}" in out.stdout
    bad = invoke(["quote", "--serve", "--model", "llama3.1-8b", "--rps", "0"], code=2)
    assert "rps" in bad.stderr
    assert "--rps" in invoke(["quote", "--serve", "--model", "llama3.1-8b"], code=2).stderr

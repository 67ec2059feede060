"""`POST /quotes/serve` (`suanli quote --serve`): replicas, GPUs and price per 1M tokens of serving a model at a
request rate, on each offer."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import Field

from suanli.api.deps import Auth, in_thread
from suanli.api.schemas import In, MemorySize, Out
from suanli.api.strict_json import StrictJSONRoute
from suanli.control.serving.quotes import ServeAsk, serve_quotes
from suanli.perf.serve_shape import SERVE_PRECISIONS, ServePrecision
from suanli.workloads.resources import parse_memory_mib

router = APIRouter(route_class=StrictJSONRoute, tags=["market"])
MAX_LEN = 1 << 20  # tokens of prompt or output
MAX_SLO_MS = 3_600_000


class ServeQuoteIn(In):
    model: str = Field(min_length=1, max_length=64, description="performance-model preset, e.g. llama3.1-8b")
    rps: Decimal = Field(gt=0, le=1_000_000, decimal_places=3, description="requests per second to serve")
    input_len: int = Field(1024, ge=1, le=MAX_LEN, description="prompt tokens per request")
    output_len: int = Field(256, ge=1, le=MAX_LEN, description="output tokens per request")
    slo_ttft_ms: Decimal = Field(Decimal(2000), gt=0, le=MAX_SLO_MS, decimal_places=3,
                                 description="mean time to first token, at most")  # fmt: skip
    slo_itl_ms: Decimal = Field(Decimal(100), gt=0, le=MAX_SLO_MS, decimal_places=3,
                                description="mean inter-token latency, at most")  # fmt: skip
    gpu: str = Field("any", min_length=1, max_length=64, description="GPU model, or 'any'")
    precision: list[ServePrecision] | None = Field(None, min_length=1, max_length=len(SERVE_PRECISIONS),
                                                   description="precisions to consider (default: all)")  # fmt: skip
    max_gpus_per_replica: int = Field(8, ge=1, le=64)
    billing_mode: Literal["on-demand", "spot"] = "on-demand"
    cpus_per_replica: Decimal | None = Field(None, gt=0, le=4096, decimal_places=3, description="host CPU cores")
    memory_per_replica: MemorySize | None = Field(None, description="host memory, e.g. 64Gi")

    def ask(self) -> ServeAsk:
        return ServeAsk(
            model=self.model, rps=self.rps, input_len=self.input_len, output_len=self.output_len,
            slo_ttft_ms=self.slo_ttft_ms, slo_itl_ms=self.slo_itl_ms, gpu=None if self.gpu == "any" else self.gpu,
            precisions=tuple(dict.fromkeys(self.precision or SERVE_PRECISIONS)),
            max_gpus_per_replica=self.max_gpus_per_replica, mode=self.billing_mode,
            cpu_milli=int(self.cpus_per_replica * 1000) if self.cpus_per_replica is not None else 0,
            memory_mib=parse_memory_mib(self.memory_per_replica) if self.memory_per_replica is not None else 0,
        )  # fmt: skip


class ServeQuoteRow(Out):
    cluster: str
    gpu: str
    gpus_per_replica: int
    tp: int
    pp: int
    ep: int
    precision: str
    replicas: int
    gpus: int
    free_gpus: int
    available_now: bool
    replica_max_rps: float
    ttft_ms: float | None
    itl_ms: float
    rate_per_hour: str
    replica_per_hour: str
    per_1m_tokens: str
    per_1m_output_tokens: str


class ServeQuoteOut(Out):
    model: str
    rps: str
    input_len: int
    output_len: int
    slo_ttft_ms: str
    slo_itl_ms: str
    billing_mode: str
    currency: str
    offers: list[ServeQuoteRow]
    cannot_meet_slo: list[str]


@router.post("/quotes/serve")
@in_thread
def quote_serve(body: ServeQuoteIn, ctx: Auth) -> ServeQuoteOut:
    """Serving `model` at `rps` within the latency SLO on each offer: the cheapest replica layout and precision
    (performance model), how many replicas and GPUs, and the price per hour and per 1M tokens (exact, from the
    price book in force), cheapest first; offers where no layout keeps the SLO are named."""
    with ctx.db.read() as s:
        doc: dict[str, Any] = serve_quotes(s, ctx.srv.offers, body.ask())
    return ServeQuoteOut.model_validate(doc)

"""The Python SDK: `Client` speaks the suanli REST API (/api/v1) over HTTP and returns typed results.

The client is an interface peer of the server, not a part of it: it imports nothing from `suanli.api` or the
services, so it works wherever httpx does. Money arrives as strings and is parsed to `Decimal` (never float);
every failure is an `ApiError` carrying the HTTP status (0 when the server cannot be reached) and the server's
one-line message.

    with Client("http://127.0.0.1:8000") as c:
        c.login("me@example.com", "…")
        print(c.balance().balance)
        w = c.submit(Path("job.yaml"), workdir=Path("."))
        for text in c.follow_logs(w.id):
            print(text, end="")
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from suanli import __version__
from suanli.client.admin import AdminCalls
from suanli.client.credit import CreditCalls
from suanli.client.hub import HubCalls
from suanli.client.models import (
    Balance,
    Me,
    Member,
    NewToken,
    Offer,
    Org,
    PasswordSet,
    Plan,
    Quote,
    Session,
    Signup,
    Token,
    Transaction,
    WorkloadQuote,
    load,
)
from suanli.client.money import StatementCalls
from suanli.client.orgs import OrgCalls
from suanli.client.requests import _amount, _params, _seg, _spec_body
from suanli.client.scale import ScaleCalls
from suanli.client.serving import ServingCalls
from suanli.client.ssh import SshCalls
from suanli.client.telemetry import TelemetryCalls
from suanli.client.volumes import VolumeCalls
from suanli.client.workloads import WorkloadCalls

DEFAULT_SERVER = "http://127.0.0.1:8000"
SERVER_ENV = "SUANLI_SERVER"
API = "/api/v1"


READ_RETRIES = 3


def _retry_after(r: httpx.Response) -> float:
    """The server's Retry-After in seconds (1 when missing or a date), at most 5."""
    try:
        return min(5.0, max(0.0, float(r.headers.get("retry-after", "1"))))
    except ValueError:
        return 1.0


class ApiError(Exception):
    """A failed call: `status` is the HTTP status (0: no answer), `message` the server's `detail`."""

    def __init__(self, status: int, message: str, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors or []

    def __str__(self) -> str:
        return self.message


def normalise_server(url: str | None) -> str:
    """`host:port` or a full URL, without a trailing slash and without a user name or password (they would be
    printed in every error message and saved beside the token); None: SUANLI_SERVER, else the local default."""
    url = (url or os.environ.get(SERVER_ENV) or DEFAULT_SERVER).strip().rstrip("/")
    url = url if "://" in url else f"http://{url}"
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:  # it would be printed in every error, and saved
        url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return url


# ---- the client --------------------------------------------------------------------------------------------------
class Client(
    WorkloadCalls,
    AdminCalls,
    TelemetryCalls,
    SshCalls,
    ScaleCalls,
    StatementCalls,
    OrgCalls,
    HubCalls,
    VolumeCalls,
    ServingCalls,
    CreditCalls,
):
    """A synchronous client for one suanli server; after `signup` or `login` it uses the new token."""

    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.server = normalise_server(server)
        self.token = token
        self._http = httpx.Client(
            base_url=self.server, timeout=timeout, transport=transport, headers={"User-Agent": f"suanli/{__version__}"}
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def __repr__(self) -> str:
        return f"Client({self.server!r}, token={'set' if self.token else None})"

    # ---- transport ----
    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        auth: bool = True,
        content: bytes | None = None,
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """One call: `path` under /api/v1 (or /healthz, /metrics); an ApiError unless the server answers 2xx. A
        read the server answers 503 (its database cannot serve right now) is tried again after its Retry-After, up
        to `READ_RETRIES` times; a write is not, as it may have been applied."""
        url = path if path.startswith(("/api/", "/healthz", "/metrics")) else f"{API}{path}"
        headers = {**(headers or {}), **({"Authorization": f"Bearer {self.token}"} if auth and self.token else {})}
        if content_type is not None:
            headers["Content-Type"] = content_type
        r = self._send(method, url, json, params, headers, content)
        for _ in range(READ_RETRIES if method in ("GET", "HEAD") else 0):
            if r.status_code != 503:
                break
            time.sleep(_retry_after(r))
            r = self._send(method, url, json, params, headers, content)
        if r.is_error:
            raise _error(r)
        return r

    def _send(
        self,
        method: str,
        url: str,
        json: Any,
        params: dict[str, Any] | None,
        headers: dict[str, str],
        content: bytes | None = None,
    ) -> httpx.Response:
        try:
            return self._http.request(method, url, json=json, params=params, headers=headers, content=content)
        except httpx.TimeoutException as e:
            raise ApiError(0, f"suanli server at {self.server} did not answer in time ({type(e).__name__})") from e
        except httpx.TransportError as e:
            reason = str(e) or type(e).__name__
            raise ApiError(
                0, f"cannot reach suanli server at {self.server}: {reason}; is it running? (suanli server)"
            ) from e

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, Any] | None = None,
        auth: bool = True,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """One call and its JSON answer."""
        r = self.request(method, path, json=body, params=params, auth=auth, headers=headers)
        try:
            return r.json()
        except (ValueError, RecursionError) as e:  # (nested past Python's recursion limit: no answer of ours)
            raise ApiError(0, f"{self.server}{r.url.path} did not answer with JSON; is it a suanli server?") from e

    def _get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params=_params(**params))

    def _post(self, path: str, body: Any = None, *, auth: bool = True) -> Any:
        return self.call("POST", path, body, auth=auth)

    # ---- health ----
    def health(self) -> dict[str, Any]:
        return self.call("GET", "/healthz", auth=False)

    # ---- accounts ----
    def signup(self, email: str, password: str, invite: str | None = None) -> Signup:
        """A new user with a personal org and the trial credit; the client then uses the returned token. `invite`:
        an invitation's or an operator's invite code, where the server's signup is invite-only. Where the server
        sends mail, the credit waits for the mailed link (`trial_pending`; `verify_email`)."""
        body = {"email": email, "password": password, **({"invite": invite} if invite else {})}
        out = load(Signup, self._post("/signup", body, auth=False))
        self.token = out.token
        return out

    def login(self, email: str, password: str) -> Session:
        out = load(Session, self._post("/login", {"email": email, "password": password}, auth=False))
        self.token = out.token
        return out

    def logout(self) -> None:
        """Revoke the token this client uses, and stop using it."""
        self.request("POST", "/logout")
        self.token = None

    def me(self) -> Me:
        return load(Me, self._get("/me"))

    def change_password(self, current: str, new: str) -> PasswordSet:
        """Set a new password, given the current one: every other token of yours is revoked, this client's stays.
        Refused: 422 naming `current_password` (wrong; counted like a failed login) or `new_password`."""
        body = {"current_password": current, "new_password": new}
        return load(PasswordSet, self.call("PUT", "/me/password", body))

    def forgot_password(self, email: str) -> str:
        """Ask for a reset link mailed to `email`; the answer is the same whether or not an account has it."""
        return str(self._post("/password/forgot", {"email": email}, auth=False)["detail"])

    def reset_password(self, token: str, new: str) -> PasswordSet:
        """Redeem a reset link's token with a new password: every token of that user is revoked (log in again)."""
        return load(PasswordSet, self._post("/password/reset", {"token": token, "new_password": new}, auth=False))

    def tokens_list(self) -> list[Token]:
        return [load(Token, t) for t in self._get("/tokens")]

    def tokens_create(self, name: str, expires_in_days: int | None = None, password: str | None = None) -> NewToken:
        """A new token. One that outlives the caller's own (or never expires, while the caller's does) needs the
        account's `password`: refused without it (403 naming `password`)."""
        body: dict[str, Any] = {"name": name, "expires_in_days": expires_in_days}
        if password is not None:
            body["password"] = password
        return load(NewToken, self._post("/tokens", body))

    def tokens_revoke(self, token_id: str) -> Token:
        return load(Token, self.call("DELETE", f"/tokens/{_seg(token_id)}"))

    # ---- organisations ----
    def orgs(self) -> list[Org]:
        return [load(Org, o) for o in self._get("/orgs")]

    def org(self, org_id: str) -> Org:
        return load(Org, self._get(f"/orgs/{_seg(org_id)}"))

    def org_create(self, name: str) -> Org:
        return load(Org, self._post("/orgs", {"name": name}))

    def members(self, org_id: str) -> list[Member]:
        return [load(Member, m) for m in self._get(f"/orgs/{_seg(org_id)}/members")]

    def member_remove(self, org_id: str, user_id: str) -> None:
        """Remove a member (owners and admins), or leave the org (your own user id)."""
        self.request("DELETE", f"/orgs/{_seg(org_id)}/members/{_seg(user_id)}")

    def _org_id(self, org_id: str | None) -> str:
        return org_id or self.me().user.personal_org_id

    def balance(self, org_id: str | None = None) -> Balance:
        """The org's balance; None: the caller's personal org."""
        return load(Balance, self._get(f"/orgs/{_seg(self._org_id(org_id))}/balance"))

    def transactions(
        self, org_id: str | None = None, *, limit: int | None = None, before_id: int | None = None
    ) -> list[Transaction]:
        """Ledger transactions of the org, newest first (page with `before_id`)."""
        path = f"/orgs/{_seg(self._org_id(org_id))}/transactions"
        return [load(Transaction, t) for t in self._get(path, limit=limit, before_id=before_id)]

    def _usage_path(self, org_id: str | None) -> str:
        return f"/orgs/{_seg(self._org_id(org_id))}/usage"

    def usage(
        self,
        org_id: str | None = None,
        *,
        user_id: str | None = None,
        workload: str | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        page_size: int | None = None,
    ) -> list[dict[str, Any]]:
        """Usage statement rows (one per allocation), newest first: every page of it (`page_size` rows a request)."""
        params = _params(format="json", user_id=user_id, workload=workload, since=since, until=until, limit=page_size)
        rows: list[dict[str, Any]] = []
        for page in self._usage_pages(org_id, params):
            rows.extend(page.json())
        return rows

    def _usage_pages(self, org_id: str | None, params: dict[str, Any]) -> Iterator[httpx.Response]:
        """The statement's pages, following `X-Next-After` to the last."""
        path, after = self._usage_path(org_id), None
        while True:
            page = self.request("GET", path, params={**params, **({"after": after} if after else {})})
            yield page
            nxt = page.headers.get("X-Next-After")
            if not nxt or nxt == after:  # the last page (or a cursor that does not move: never loop on it)
                return
            after = nxt

    def usage_csv(
        self,
        org_id: str | None = None,
        *,
        user_id: str | None = None,
        workload: str | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        page_size: int | None = None,
    ) -> str:
        """The same statement as CSV, header first: every page of it."""
        params = _params(format="csv", user_id=user_id, workload=workload, since=since, until=until, limit=page_size)
        parts = [p.text for p in self._usage_pages(org_id, params)]
        return parts[0] + "".join(p.split("\n", 1)[1] for p in parts[1:])

    def plans(self, org_id: str | None = None) -> list[Plan]:
        """Reserved plans the org bought, newest first."""
        return [load(Plan, p) for p in self._get(f"/orgs/{_seg(self._org_id(org_id))}/plans")]

    def plan_buy(self, plan: str, gpu: str, gpus: int, org_id: str | None = None, *, key: str | None = None) -> Plan:
        """Buy `gpus` GPUs of `gpu` for one period of `plan` (hourly, daily, weekly, monthly), paid upfront."""
        body = {"plan": plan, "gpu": gpu, "gpus": gpus, **({"key": key} if key else {})}
        return load(Plan, self._post(f"/orgs/{_seg(self._org_id(org_id))}/plans", body))

    # ---- market ----
    def prices(self) -> dict[str, Any]:
        """The price book in force, as the server sends it (amounts as strings, `version` included)."""
        return self._get("/prices")

    def offers(self) -> list[Offer]:
        return [load(Offer, o) for o in self._get("/offers")]

    def quote(
        self,
        model: str,
        *,
        tokens: float | None = None,
        steps: int | None = None,
        gpu: str | None = None,
        gpus: int | None = None,
        precision: str | None = None,
        seq_len: int | None = None,
        global_batch: int | None = None,
        billing_mode: str | None = None,
        rank: str | None = None,
        limit: int | None = None,
        cpus_per_gpu: Decimal | int | str | None = None,
        memory_per_gpu: str | None = None,
    ) -> list[Quote]:
        """Feasible offers for a training run, best first by `rank`; give exactly one of tokens and steps.
        `cpus_per_gpu`/`memory_per_gpu` (e.g. "64Gi") price host CPU and memory in; `billing_mode` on-demand, spot or
        usage (then each quote is a range: `floor_*` idle, rate and cost fully active). Options left as None take the
        server's defaults."""
        body = _params(
            model=model, tokens=tokens, steps=steps, gpu=gpu, gpus=gpus, precision=precision, seq_len=seq_len,
            global_batch=global_batch, billing_mode=billing_mode, rank=rank, limit=limit,
            cpus_per_gpu=None if cpus_per_gpu is None else _amount(cpus_per_gpu), memory_per_gpu=memory_per_gpu,
        )  # fmt: skip
        return [load(Quote, q) for q in self._post("/quotes", body)]

    def quote_workload(self, spec: str | dict[str, Any] | Path, org_id: str | None = None) -> list[WorkloadQuote]:
        """What a workload spec (YAML text, a dict, or a Path) would pay on each GPU model that could run it, cheapest
        first (CPU-only work: one row), and the cost of its duration; nothing is submitted."""
        return [load(WorkloadQuote, q) for q in self._post("/quotes/workload", _spec_body(spec, org_id))]


def _error(r: httpx.Response) -> ApiError:
    """The server's one-line `detail`, or the status line when the body is not ours (a proxy's error page)."""
    try:
        doc = r.json()
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, dict) and "detail" in doc:
        detail = doc["detail"]
        message = detail if isinstance(detail, str) else str(detail)
        errors = doc.get("errors") if isinstance(doc.get("errors"), list) else None
        return ApiError(r.status_code, message, errors)
    text = " ".join(r.text.split())[:200]
    return ApiError(r.status_code, f"HTTP {r.status_code} {r.reason_phrase}" + (f": {text}" if text else ""))

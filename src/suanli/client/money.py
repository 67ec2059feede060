"""The SDK's calls for an organisation's statement: every transaction that moved its money, with the balance after
each, one page at a time or all of it (as results or as CSV).

A mixin of `suanli.client.Client` (kept apart so each file stays small).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from suanli.client.models import Statement, load

PAGE = 1000  # the most rows the server gives in one page


class StatementCalls:
    if TYPE_CHECKING:  # provided by `Client`

        def _get(self, path: str, **params: Any) -> Any: ...
        def _org_id(self, org_id: str | None) -> str: ...
        def request(
            self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None, auth: bool = True
        ) -> httpx.Response: ...

    def _statement_path(self, org_id: str | None) -> str:
        return f"/orgs/{quote(self._org_id(org_id), safe='@')}/statement"

    def statement(
        self,
        org_id: str | None = None,
        *,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        kind: str | None = None,
        after_id: int | None = None,
        limit: int | None = None,
    ) -> Statement:
        """One page of the org's statement (None: the caller's personal org), oldest first: top-ups, trial credit,
        usage per workload, plan purchases, refunds and credits, each with its memo and the balance after it. Pass
        `next_after_id` as `after_id` for the next page (None: it was the last)."""
        since = since.isoformat() if isinstance(since, datetime) else since
        until = until.isoformat() if isinstance(until, datetime) else until
        asked = {"since": since, "until": until, "kind": kind, "after_id": after_id, "limit": limit}
        params = {k: v for k, v in asked.items() if v is not None}
        return load(Statement, self._get(self._statement_path(org_id), **params))

    def statement_all(self, org_id: str | None = None, *, since: datetime | str | None = None) -> Statement:
        """Every page of the statement, as one."""
        first = page = self.statement(org_id, since=since, limit=PAGE)
        rows = list(first.rows)
        while page.next_after_id is not None:
            page = self.statement(org_id, since=since, after_id=page.next_after_id, limit=PAGE)
            rows += page.rows
        return replace(first, rows=rows, closing_balance=page.closing_balance, next_after_id=None)

    def statement_csv(self, org_id: str | None = None, *, since: datetime | str | None = None) -> str:
        """The whole statement as CSV (one header, exact decimals), page by page."""
        path, out, after = self._statement_path(org_id), [], None
        while True:
            params: dict[str, Any] = {"format": "csv", "limit": PAGE}
            if since is not None:
                params["since"] = since.isoformat() if isinstance(since, datetime) else since
            if after is not None:
                params["after_id"] = after
            r = self.request("GET", path, params=params)
            text = r.text if not out else r.text.split("\n", 1)[1]  # the header once
            out.append(text)
            nxt = r.headers.get("X-Next-After-Id")
            if not nxt:
                return "".join(out)
            after = int(nxt)

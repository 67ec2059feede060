"""Tokens sold on a priced endpoint, attacked by its seller (found by a hostile review): the seller's replica runs
the seller's code and reports its own usage, and a seller may be a member of the buyer's team.

Reuses the fake replica and helpers of tests/test_hardening_serving_money.py."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from suanli.api.gateway_relay import TOKENS_PER_CHOICE
from suanli.control.accounts import spend_limits
from suanli.control.ids import utcnow
from tests.control_plane import join, signup
from tests.test_hardening_serving_money import (  # noqa: F401  (platform: the fixture)
    EP,
    SPEC,
    Replica,
    asyncio_flush,
    balance,
    deploy_ready,
    platform,
    reports,
    settle,
    usage,
)
from tests.test_workloads_api import Platform


def _key(p: Platform, ep: dict[str, Any], who: Any, org: str | None = None) -> str:
    body: dict[str, Any] = {"password": "tenant-password"}
    if org:
        body["org"] = org
    r = p.api.post(f"{EP}/{ep['id']}/keys", json=body, headers=who.headers)
    assert r.status_code == 201, r.text
    return r.json()["key"]


def test_a_spend_limited_member_cannot_drain_the_team_through_their_own_priced_endpoint(platform: Platform) -> None:  # noqa: F811
    """A member whose monthly spend limit in the team is ¥1 deploys an endpoint in their personal org at the highest
    price allowed (¥1,000,000 per 1M tokens), makes a key paid by the team, and sends one request. Their replica
    answers a million tokens. The gateway lets the request in (¥1 left under the limit); the charge took
    min(cost, team balance) and ignored the limit, and the team's whole ¥1000 moved to the member's org. Now it
    takes no more than the limit leaves."""
    owner = platform.tenant
    team = platform.api.post("/api/v1/orgs", json={"name": "team"}, headers=owner.headers).json()["id"]
    platform.topup(team, "1000")
    member = signup(platform.api, "thief@example.com")
    join(platform.api, owner, team, member)
    r = platform.api.patch(f"/api/v1/orgs/{team}/members/{member.user_id}", json={"monthly_spend_limit": "1"},
                           headers=owner.headers)  # fmt: skip
    assert r.status_code == 200, r.text
    platform.topup(member.org_id, "100")  # enough to deploy one replica in their own org
    replica = Replica(reports(1, 1_000_000))  # and a million bytes of answer: the tokens may be real
    ep = deploy_ready(platform, replica.port, {**SPEC, "name": "mine", "price_per_1m_tokens": "1000000"}, who=member)
    key = _key(platform, ep, member, org=team)
    team0, mine0 = balance(platform, team), balance(platform, member.org_id)
    body = {"model": "mine", "messages": [{"role": "user", "content": "hi"}]}
    r = platform.api.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    settle(platform, ep["id"])
    lost = team0 - balance(platform, team)
    gained = balance(platform, member.org_id) - mine0
    with platform.db.read() as s:
        spent = spend_limits.month_to_date(s, team, utcnow(), member.user_id).get(member.user_id, Decimal(0))
    # The member's limit is ¥1 for the month: the team must not lose (nor the member gain) more than that.
    assert lost == gained == spent == Decimal(1), f"team lost ¥{lost} (member gained ¥{gained}, spent ¥{spent})"


def test_a_lying_replica_cannot_bill_a_buyer_a_million_tokens_for_a_two_character_answer(platform: Platform) -> None:  # noqa: F811
    """A stranger buys from a priced endpoint with the openai client's defaults (no max_tokens, n=1). The seller's
    replica answers "hi" and reports 1,000,000 completion tokens: the count was capped only by what the request
    could have asked for (2^20 without max_tokens), and the buyer paid its whole balance for two characters. Now a
    completion token must stand for at least a byte of what was answered (`gateway_relay.answered_tokens`)."""
    replica = Replica(reports(5, 1_000_000, content="hi"))
    ep = deploy_ready(platform, replica.port, {**SPEC, "price_per_1m_tokens": "1000"})
    buyer = signup(platform.api, "victim-buyer@example.com")
    platform.topup(buyer.org_id, "100")
    key = _key(platform, ep, buyer)
    b0 = balance(platform, buyer.org_id)
    body = {"model": "chat", "messages": [{"role": "user", "content": "say hi"}]}
    r = platform.api.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hi", r.text
    settle(platform, ep["id"])
    (row,) = usage(platform, ep["id"])
    charged = b0 - balance(platform, buyer.org_id)
    # "hi" is at most a few tokens (a BPE token decodes to >= 1 byte, plus an end-of-sequence token per choice)
    assert row.completion_tokens == 2 + TOKENS_PER_CHOICE, f"billed {row.completion_tokens} tokens (¥{charged})"


def test_a_buyer_cannot_use_more_than_its_balance_before_the_charge_runs(platform: Platform) -> None:  # noqa: F811
    """Tokens are charged a minute or two after their minute; the gateway compared the settled balance with zero,
    so a sign-up with ¥10 of trial credit had 40 requests of ¥1.01 served before the first charge. Now what the
    org's keys used and is not charged yet counts against what is left. Between requests here the gateway reports
    its counts and its key cache expires, as a second and five seconds do in a server: within those, a buyer can
    still go over by what it sends meanwhile."""
    replica = Replica(reports(10, 1000))  # 1,010 tokens a request
    ep = deploy_ready(platform, replica.port, {**SPEC, "price_per_1m_tokens": "1000"})  # about ¥1.01 a request
    buyer = signup(platform.api, "freeloader@example.com")
    b0 = balance(platform, buyer.org_id)
    key = _key(platform, ep, buyer)
    owner0 = balance(platform, platform.tenant.org_id)
    served = 0
    for _ in range(40):
        r = platform.api.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                              json={"model": "chat", "max_tokens": 1000,
                                    "messages": [{"role": "user", "content": "x"}]})  # fmt: skip
        served += r.status_code == 200
        if r.status_code != 200:
            assert r.status_code == 402, r.text
        asyncio_flush(platform)
        platform.api.app.state.gateway.keys.clear()  # type: ignore[attr-defined]
    settle(platform, ep["id"])
    tokens = sum(u.prompt_tokens + u.completion_tokens for u in usage(platform, ep["id"]))
    worth = Decimal(tokens) * 1000 / 1_000_000
    paid = balance(platform, platform.tenant.org_id) - owner0
    assert served == 10 and worth - paid < Decimal("1.02"), (served, b0, worth, paid)

"""The SDK's calls for self-service credit: redeeming a top-up code, verifying an e-mail (which releases the trial
credit where the server sends mail), and operators' batches of codes.

A mixin of `suanli.client.Client` (kept apart so each file stays small).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from suanli.client.models import load
from suanli.client.requests import _seg


@dataclass(frozen=True)
class TopupBatch:
    """Codes made together; `redeemed` and `voided` count its codes."""

    id: str
    amount: Decimal  # each code's worth
    count: int
    note: str
    org_id: str | None  # only this org may redeem them; None: any org
    created_by: str  # the operator's email
    created_at: datetime
    expires_at: datetime | None
    redeemed: int
    voided: int


@dataclass(frozen=True)
class TopupCode:
    """One code of a batch as operators see it: its hint, never the code."""

    id: str
    batch_id: str
    hint: str  # the code's last 4 characters
    state: str  # unused | redeemed | voided | expired
    redeemed_at: datetime | None
    redeemed_by: str | None  # the user's email
    redeemed_org: str | None
    transaction_id: int | None
    voided_at: datetime | None


@dataclass(frozen=True)
class TopupBatchDetail(TopupBatch):
    codes: list[TopupCode] = field(default_factory=list)


@dataclass(frozen=True)
class NewTopupCode:
    id: str
    code: str = field(repr=False)  # shown once


@dataclass(frozen=True)
class NewTopupBatch:
    batch: TopupBatch
    codes: list[NewTopupCode]


@dataclass(frozen=True)
class Redemption:
    code_id: str
    batch_id: str
    org_id: str
    amount: Decimal
    transaction_id: int
    memo: str
    created_at: datetime
    balance: Decimal  # the org's balance after it, two decimals
    exact_balance: Decimal


@dataclass(frozen=True)
class Verification:
    """A verification link redeemed: whose e-mail it verified, and the trial credit it released (0 if earlier)."""

    user_id: str
    email: str
    email_verified: bool
    credited: Decimal
    balance: Decimal
    currency: str


class CreditCalls:
    if TYPE_CHECKING:  # provided by `Client`

        def _get(self, path: str, **params: Any) -> Any: ...
        def _post(self, path: str, body: Any = None, *, auth: bool = True) -> Any: ...
        def _org_id(self, org_id: str | None) -> str: ...

    def redeem(self, code: str, org_id: str | None = None) -> Redemption:
        """Redeem a top-up code into an org (None: your personal org); owners, admins and members may. Refused:
        404 no such code, 409 redeemed already, 410 voided or expired, 403 a code for another org, 429 too many
        codes tried."""
        return load(Redemption, self._post(f"/orgs/{_seg(self._org_id(org_id))}/redeem", {"code": code}))

    def verify_email(self, token: str) -> Verification:
        """Redeem the token of the link in a verification e-mail (no login needed: it verifies the user it was
        mailed to, whoever sends it) and release their trial credit, once. Refused: 422 unknown or expired, 409 used."""
        return load(Verification, self._post("/verify", {"token": token}, auth=False))

    def resend_verification(self) -> str:
        """Mail yourself a new verification link; returns the address it goes to. Refused: 409 verified already or
        the server sends no mail, 429 asked too often."""
        return str(self._post("/verify/resend")["sent_to"])

    # ---- operators ----
    def admin_topup_codes_create(
        self,
        amount: Decimal | int | str,
        count: int,
        *,
        expires_at: datetime | None = None,
        note: str = "",
        org: str | None = None,
    ) -> NewTopupBatch:
        """A batch of `count` codes worth `amount` each (whole cents); the codes are in this result only."""
        if isinstance(amount, float):
            raise TypeError("amounts are Decimal, int or str, not float: floats cannot represent cents exactly")
        body = {"amount": str(Decimal(str(amount))), "count": count, "note": note, "org": org,
                "expires_at": expires_at.isoformat() if expires_at else None}  # fmt: skip
        return load(NewTopupBatch, self._post("/admin/topup-codes", body))

    def admin_topup_batches(self, limit: int | None = None) -> list[TopupBatch]:
        params = {"limit": limit} if limit is not None else {}
        return [load(TopupBatch, b) for b in self._get("/admin/topup-codes", **params)]

    def admin_topup_batch(self, batch_id: str) -> TopupBatchDetail:
        """A batch and its codes: which were redeemed, by whom, into which org, when."""
        return load(TopupBatchDetail, self._get(f"/admin/topup-codes/{_seg(batch_id)}"))

    def admin_topup_codes_void(self, batch_id: str, codes: list[str] | None = None) -> TopupBatch:
        """Void the batch's unredeemed codes (None), or only `codes` (ids; 409 if one was redeemed)."""
        return load(TopupBatch, self._post(f"/admin/topup-codes/{_seg(batch_id)}/void", {"codes": codes}))

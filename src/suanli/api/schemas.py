"""Wire schemas: what requests may carry (unknown fields refused, every number bounded) and what comes back.

Money travels as strings ("10.00" shown, exact amounts with 8 decimals), never as floats."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from suanli.billing.money import INTERNAL
from suanli.workloads.resources import parse_memory_mib


def _not_float(value: object) -> object:
    """JSON numbers with a fraction are floats before pydantic sees them: 0.1 is not exactly a tenth."""
    if isinstance(value, float):
        raise ValueError('money must be a string such as "1.50" (or a whole number), not a JSON number with a fraction')
    return value


Amount = Annotated[Decimal, BeforeValidator(_not_float)]


def _memory_size(v: str) -> str:
    parse_memory_mib(v)  # ValueError naming the expected shape
    return v


MemorySize = Annotated[str, Field(max_length=32), AfterValidator(_memory_size)]  # host memory, e.g. 64Gi
NUL_MESSAGE = "NUL characters (\\u0000) are not allowed"


MAX_DEPTH = 32


def check_strings(value: object) -> None:
    """Refuse a NUL in any string (PostgreSQL text cannot hold one) and documents nested deeper than MAX_DEPTH
    (whatever walks them later must not run out of stack); iterative, so a hostile document cannot either. The
    message names where in the document the NUL is (`billing`, `env.X`, `args[2]`)."""
    stack: list[tuple[object, int, str]] = [(value, 0, "")]
    while stack:
        item, depth, at = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise ValueError(f"{NUL_MESSAGE} (at {at})" if at else NUL_MESSAGE)
        elif isinstance(item, dict | list | tuple):
            if depth >= MAX_DEPTH:
                raise ValueError(f"nested more than {MAX_DEPTH} levels deep")
            if isinstance(item, dict):
                for k, v in item.items():
                    name = f"{at}.{_key(k)}" if at else _key(k)
                    stack.extend(((k, depth + 1, f"{name} (its name)"), (v, depth + 1, name)))
            else:
                stack.extend((child, depth + 1, f"{at}[{i}]") for i, child in enumerate(item))


def _key(k: object) -> str:
    return repr(k)[:64] if not isinstance(k, str) or "\x00" in k or len(k) > 64 else k


def _as_utc(t: datetime) -> datetime:
    """Times without a zone are UTC; a time whose UTC equivalent falls outside years 1-9999 is refused."""
    if t.tzinfo is None:
        return t.replace(tzinfo=UTC)
    try:
        return t.astimezone(UTC)
    except OverflowError as e:
        raise ValueError("out of range once converted to UTC") from e


UtcTime = Annotated[datetime, AfterValidator(_as_utc)]


class In(BaseModel):
    model_config = ConfigDict(extra="forbid", str_max_length=4096)

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul(cls, value: object) -> object:
        if type(value) not in (int, float, bool) and value is not None:  # numbers hold no strings (hot: samples)
            check_strings(value)
        return value


class Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


# ---- errors -------------------------------------------------------------------------------------------------
class ErrorOut(Out):
    detail: str = Field(description="one line that names the field or object at fault")


class ErrorItem(Out):
    loc: list[str]
    msg: str
    type: str


class ValidationErrorOut(ErrorOut):
    errors: list[ErrorItem] = Field(default_factory=list, description="each field at fault (request validation)")


# ---- accounts -----------------------------------------------------------------------------------------------
class Credentials(In):
    email: str = Field(min_length=3, max_length=254)
    password: str = Field(min_length=1, max_length=1024)


class SignupIn(Credentials):
    invite: str | None = Field(
        None, min_length=1, max_length=128, description="an invitation's code or an operator's invite code"
    )


class UserOut(Out):
    id: str
    email: str
    is_admin: bool
    personal_org_id: str
    created_at: datetime


class OrgOut(Out):
    id: str
    name: str
    personal: bool
    quota_gpus: int | None
    quota_cpus: int | None = Field(None, description="most host CPU cores held at once; null: no limit")
    quota_memory_gib: int | None = Field(None, description="most host memory (GiB) held at once; null: no limit")
    role: str | None = None


class SessionOut(Out):
    user: UserOut
    token: str = Field(description="bearer token; shown once")
    token_id: str
    expires_at: datetime | None


class SignupOut(SessionOut):
    org: OrgOut
    balance: str
    currency: str
    trial_pending: bool = Field(
        False, description="the trial credit waits until the e-mail is verified (a link was mailed)"
    )


class MeOut(Out):
    user: UserOut
    orgs: list[OrgOut]
    email_verified: bool = Field(False, description="the user redeemed a verification link mailed to them")
    trial_pending: bool = Field(False, description="verifying the e-mail would release the trial credit")


class VerifyIn(In):
    token: str = Field(min_length=1, max_length=128, description="the token of the link in the verification e-mail")


class VerifyOut(Out):
    user_id: str
    email: str
    email_verified: bool
    credited: str = Field(description="trial credit granted now (0 where it had been granted already)")
    balance: str
    currency: str


class ResendOut(Out):
    sent_to: str


class PasswordChangeIn(In):
    current_password: str = Field(min_length=1, max_length=1024)
    new_password: str = Field(min_length=1, max_length=1024)


class PasswordResetAskIn(In):
    email: str = Field(min_length=3, max_length=254)


class PasswordResetIn(In):
    token: str = Field(min_length=1, max_length=128, description="the token of the link in the reset e-mail")
    new_password: str = Field(min_length=1, max_length=1024)


class PasswordSetOut(Out):
    email: str
    revoked_tokens: int = Field(description="the user's other tokens (logins, console sessions, API tokens) revoked")
    removed_ssh_keys: int = Field(0, description="the user's SSH keys removed (a reset removes them; a change not)")
    revoked_endpoint_keys: int = Field(0, description="endpoint keys the user made, revoked (a reset; a change not)")


class PasswordResetAskOut(Out):
    detail: str


class TokenIn(In):
    name: str = Field(min_length=1, max_length=128)
    expires_in_days: int | None = Field(None, ge=1, le=3650)
    # The caller's password: needed when the new token would outlive the one making it (`routers.auth`).
    password: str | None = Field(None, min_length=1, max_length=1024)


class TokenOut(Out):
    id: str
    name: str
    prefix: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class NewTokenOut(TokenOut):
    token: str = Field(description="bearer token; shown once, stored only as a hash")


class SshKeyIn(In):
    model_config = ConfigDict(extra="forbid", str_max_length=8192)
    public_key: str = Field(min_length=1, max_length=8192, description="one OpenSSH public key (the .pub file)")
    name: str | None = Field(None, min_length=1, max_length=128, description="default: the key's comment")
    # The caller's password: an SSH key never expires, so a caller whose token does gives it (`api.reauth`).
    password: str | None = Field(None, min_length=1, max_length=1024)


class SshKeyOut(Out):
    id: str
    name: str
    algorithm: str
    fingerprint: str = Field(description="SHA256, as `ssh-keygen -l` prints it")
    public_key: str
    created_at: datetime


class SshInfoOut(Out):
    enabled: bool
    port: int | None = Field(description="the gateway's port on the server's host; None when it is off")
    host_key: str | None = Field(description="its public host key (OpenSSH form), for known_hosts")
    host_key_fingerprint: str | None


class OrgIn(In):
    name: str = Field(min_length=1, max_length=128)


Role = Literal["owner", "admin", "member", "viewer"]
SpendLimit = Annotated[Decimal, BeforeValidator(_not_float), Field(ge=0, le=Decimal("1000000000"), decimal_places=8)]


class InvitationIn(In):
    email: str = Field(min_length=3, max_length=254)
    role: Role = "member"
    monthly_spend_limit: SpendLimit | None = Field(None, description="most they may spend a month; null: no limit")


class MemberPatch(In):
    """Only the fields given change; `monthly_spend_limit: null` removes the limit."""

    role: Role | None = None
    monthly_spend_limit: SpendLimit | None = None

    @field_validator("role")
    @classmethod
    def _a_role(cls, v: str | None) -> str | None:
        if v is None:  # given as null: there is no "no role"
            raise ValueError("one of owner, admin, member, viewer")
        return v

    @model_validator(mode="after")
    def _some(self) -> MemberPatch:
        if not self.model_fields_set:
            raise ValueError("give role and/or monthly_spend_limit")
        return self


class MemberOut(Out):
    user_id: str
    email: str
    role: str
    monthly_spend_limit: str | None = Field(None, description="most they may spend a month; null: no limit")
    month_to_date: str = Field("0.00000000", description="their charges to the org this calendar month (UTC)")


class InvitationOut(Out):
    id: str
    org_id: str
    org_name: str
    email: str
    role: str
    monthly_spend_limit: str | None
    state: str = Field(description="pending, accepted, declined or cancelled")
    invited_by: str = Field(description="the inviter's email")
    created_at: datetime
    expires_at: datetime


class NewInvitationOut(InvitationOut):
    code: str = Field(description="shown once: where signup is invite-only, the invitee signs up with it")


# ---- money --------------------------------------------------------------------------------------------------
class BalanceOut(Out):
    org_id: str
    balance: str = Field(description="two decimals, as shown")
    exact: str = Field(description="internal precision (1e-8)")
    currency: str
    held_per_hour: str = Field(description="hourly rate of everything the org runs now")


class EntryOut(Out):
    account: str
    amount: str


class TransactionOut(Out):
    id: int
    key: str
    kind: str
    memo: str
    amount: str = Field(description="net effect on the org's balance")
    allocation_id: str | None
    created_at: datetime


class StatementRowOut(Out):
    id: int = Field(description="the ledger transaction's id, in posting order")
    created_at: datetime
    kind: str = Field(description="topup, trial_credit, usage, plan_purchase, refund, credit, adjustment")
    amount: str = Field(description="net effect on the org's balance, exact")
    balance: str = Field(description="the org's balance after this transaction, exact")
    workload: str | None = Field(description="the workload it paid for (usage and what settling gave back)")
    workload_name: str | None
    allocation: str | None
    memo: str
    key: str = Field(description="the transaction's idempotency key")


class StatementOut(Out):
    org_id: str
    currency: str
    opening_balance: str = Field(description="before the first row")
    closing_balance: str = Field(description="after the last row")
    rows: list[StatementRowOut]
    next_after_id: int | None = Field(description="pass as after_id for the next page; null: this was the last")


class MoveIn(In):
    amount: Amount = Field(gt=0, le=Decimal("1000000000"), decimal_places=8)
    kind: Literal["topup", "credit", "refund"] = "topup"
    memo: str = Field("", max_length=500)
    key: str | None = Field(None, min_length=1, max_length=150, description="idempotency key; a retry posts nothing")


class QuotaIn(In):
    """Only the quotas named change; null removes that limit."""

    gpus: int | None = Field(None, description="most GPUs held at once", ge=0, le=1_000_000)
    cpus: int | None = Field(None, description="most host CPU cores held at once", ge=0, le=100_000_000)
    memory_gib: int | None = Field(None, description="most host memory held at once, GiB", ge=0, le=1_000_000_000)

    @model_validator(mode="after")
    def _some(self) -> QuotaIn:
        if not self.model_fields_set:
            raise ValueError("give at least one of gpus, cpus and memory_gib")
        return self

    def limits(self) -> dict[str, int | None]:
        return {k: getattr(self, k) for k in ("gpus", "cpus", "memory_gib") if k in self.model_fields_set}


# ---- operators ----------------------------------------------------------------------------------------------
class AdminUserIn(Credentials):
    admin: bool = False
    trial_credit: bool = Field(False, description="grant the sign-up trial credit")


class AdminUserPatch(In):
    admin: bool


class CheckOut(Out):
    ok: bool
    mismatches: dict[str, list[str]]


def money(value: Decimal) -> str:
    """Fixed-point at internal precision: "0.00000000", never "0E-8"."""
    return format(value.quantize(INTERNAL), "f")

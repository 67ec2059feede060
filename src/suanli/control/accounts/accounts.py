"""Users, organisations and API tokens; who may see what (what each role may do: `control.accounts.memberships`).

Every user gets a personal organisation (the billing entity) on sign-up, as its owner. Tenant isolation is
enforced here, not in the routers: `org_for` returns an org only to its members (and admins) and answers
"not found" to everyone else, so another tenant cannot even learn that an org id exists.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from suanli.billing.ledger import PROMOTIONS, org_account, transfer
from suanli.control.accounts import sandbox_uids
from suanli.control.errors import Conflict, Forbidden, Invalid, NotFound, Unauthorized
from suanli.control.ids import TOKEN_PREFIX, new_id, new_token, token_hash
from suanli.control.money import ledger
from suanli.db.models import ApiToken, Membership, Org, User

_hasher = PasswordHasher()
EMAIL = re.compile(r"^[^@\s]{1,64}@[^@\s]{1,189}\.[^@\s]{1,63}$")
MIN_PASSWORD = 8
MAX_LIVE_TOKENS = 200  # per user: logins and console sessions past it retire the soonest to expire
MAX_PASSWORD = 1024

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Principal:
    """The caller of a request, as its token says."""

    user_id: str
    email: str
    is_admin: bool
    personal_org_id: str
    token_id: str
    token_expires_at: datetime | None = None


def normalise_email(email: str) -> str:
    return email.strip().lower()


def check_credentials(email: str, password: str) -> str:
    """The normalised email, or 422 naming the field at fault."""
    email = check_email(email)
    check_password(password)
    return email


def check_email(email: str) -> str:
    """The normalised email, or 422 naming `email`. An address is how teammates, invitees and the operator know
    a person, so one with control or invisible characters (`ops@example.com` + U+200B, a bidi override) or one
    that NFKC folds into another (fullwidth `ｏｐｓ@example.com`) is refused: it would pose as someone else's."""
    email = normalise_email(email)
    domain = email.rpartition("@")[2]
    if not EMAIL.match(email) or domain.startswith(".") or domain.endswith(".") or ".." in domain:
        raise Invalid(f"email: {email!r} is not an email address")
    bad = next((c for c in email if unicodedata.category(c) in BAD_CATEGORIES), None)
    if bad is not None:
        raise Invalid(f"email: must not contain control or invisible characters (U+{ord(bad):04X})")
    folded = unicodedata.normalize("NFKC", email).lower()
    if folded != email:
        raise Invalid(f"email: {email!r} is another way of writing {folded!r}; use that")
    return email


def check_password(password: str, field: str = "password") -> None:
    """422 naming `field` for a password too short to keep out a guesser or too long to hash cheaply."""
    if len(password) < MIN_PASSWORD:
        raise Invalid(f"{field}: at least {MIN_PASSWORD} characters")
    if len(password) > MAX_PASSWORD:
        raise Invalid(f"{field}: at most {MAX_PASSWORD} characters")


def hash_password(password: str) -> str:
    """argon2id; ~0.3 s of CPU on purpose: run it in `control.accounts.passwords.PasswordPool`, not on a request
    thread."""
    return _hasher.hash(password)


def verify_password(stored: str | None, password: str) -> bool:
    """Whether `password` matches the stored hash. With no hash (no such user) it spends the same time and says
    no: the answer's timing does not tell which emails are registered."""
    try:
        if stored is None:
            _hasher.hash(password)
            return False
        return _hasher.verify(stored, password)
    except (VerificationError, InvalidHashError):
        return False


class EmailTaken(Conflict):
    """The email belongs to a user already. Operators are told so; a signup is not (see `api.routers.auth`)."""


def create_user(
    s: Session,
    email: str,
    password: str,
    now: datetime,
    *,
    admin: bool = False,
    trial_credit: Decimal = Decimal(0),
    password_hash: str | None = None,
) -> tuple[User, Org]:
    """A user, their personal org (they own it), and the trial credit, once: its key is the user's id.
    `password_hash`: the password hashed already (off the request thread); `password` is then only checked."""
    email = check_credentials(email, password)
    if s.scalar(select(User.id).where(User.email == email)):
        raise EmailTaken(f"email: {email} is already registered")
    org = Org(id=new_id("org"), name=email, personal=True, created_at=now)
    sandbox_uids.assign(s, org)
    user = User(
        id=new_id("usr"),
        email=email,
        password_hash=password_hash or hash_password(password),
        is_admin=admin,
        personal_org_id=org.id,
        created_at=now,
    )
    s.add(org)
    s.flush()
    s.add(user)
    s.flush()
    s.add(Membership(org_id=org.id, user_id=user.id, role="owner"))
    try:
        s.flush()
    except IntegrityError as e:  # a concurrent sign-up with the same email won the race
        raise EmailTaken(f"email: {email} is already registered") from e
    if trial_credit > 0:
        tx = transfer(f"trial:{user.id}", "trial_credit", PROMOTIONS, org_account(org.id), trial_credit, "trial credit")
        ledger.post(s, tx, now, org_id=org.id, user_id=user.id)
    return user, org


def issue_token(
    s: Session, user: User, name: str, now: datetime, expires_at: datetime | None = None
) -> tuple[ApiToken, str]:
    """A new bearer token; the plain token is returned once and never stored."""
    if not name or len(name) > 128:
        raise Invalid("name: 1 to 128 characters")
    if expires_at is not None and expires_at <= now:
        raise Invalid("expires_in_days: the token would already be expired")
    _make_room(s, user.id, now, expiring=expires_at is not None)
    plain = new_token()
    row = ApiToken(
        id=new_id("tok"),
        user_id=user.id,
        name=name,
        token_hash=token_hash(plain),
        prefix=plain[: len(TOKEN_PREFIX) + 6],
        created_at=now,
        expires_at=expires_at,
        revoked_at=None,
    )
    s.add(row)
    s.flush()
    return row, plain


def _make_room(s: Session, user_id: str, now: datetime, expiring: bool) -> None:
    """At most `MAX_LIVE_TOKENS` live tokens a user: an expiring one (a login, a console session) past it retires
    the user's tokens that expire soonest, a token that never expires is refused (409). Without a bound each
    request for a short-lived token, which needs no password, was one more row for good. Counted without a lock:
    logins at the same moment may each see room for one more."""
    live = (ApiToken.user_id == user_id, ApiToken.revoked_at.is_(None),
            or_(ApiToken.expires_at.is_(None), ApiToken.expires_at > now))  # fmt: skip
    n = s.scalar(select(func.count()).select_from(ApiToken).where(*live)) or 0
    if n < MAX_LIVE_TOKENS:
        return
    oldest = list(s.scalars(select(ApiToken.id).where(*live, ApiToken.expires_at.is_not(None))
                            .order_by(ApiToken.expires_at, ApiToken.id).limit(n - MAX_LIVE_TOKENS + 1)))  # fmt: skip
    if not expiring or not oldest:
        raise Conflict(f"tokens: you have {n} live tokens, the most one user may keep; revoke some "
                       "('suanli tokens list', 'suanli tokens revoke ID')")  # fmt: skip
    s.execute(update(ApiToken).where(ApiToken.id.in_(oldest)).values(revoked_at=now)
              .execution_options(synchronize_session=False))  # fmt: skip


def outlives(expires_at: datetime | None, caller_expires_at: datetime | None) -> bool:
    """Whether a new token expiring at `expires_at` (None: never) would outlive the caller's."""
    if caller_expires_at is None:
        return False
    return expires_at is None or expires_at > caller_expires_at


def password_still(s: Session, user_id: str, checked: str) -> bool:
    """Whether `checked` is still the user's password hash, read FOR SHARE (a new password being set commits first)."""
    q = select(User.id).where(User.id == user_id, User.password_hash == checked).with_for_update(read=True)
    return s.scalar(q) is not None


def password_hash_of(s: Session, email: str) -> str | None:
    """The stored hash of the user with this (normalised) email, or None: `verify_password` then says no."""
    return s.scalar(select(User.password_hash).where(User.email == email))


def finish_login(s: Session, email: str, now: datetime, days: int, checked: str) -> tuple[User, ApiToken, str]:
    """After the password was verified against the hash `checked`: the user and a new login token; 401 when the
    user was removed, or a new password set, while it was checked (a login in flight never outlives a reset). FOR
    SHARE waits for a new password being set to commit, then reads it."""
    q = select(User).where(User.email == email, User.password_hash == checked).with_for_update(read=True)
    user = s.scalar(q)
    if user is None:
        raise Unauthorized("wrong email or password")
    row, plain = issue_token(s, user, "login", now, now + timedelta(days=days))
    return user, row, plain


def check_live(s: Session, who: Principal) -> None:
    """The caller's token read again inside the write that makes a credential (a token, an SSH key, an endpoint key,
    a proxy ticket), and held (FOR SHARE) until it commits: 401 if it was revoked meanwhile. Requests are
    authenticated from a cache that another server process keeps for 5 s; a token revoked by a new password must
    not make one that outlives it."""
    q = select(ApiToken.revoked_at).where(ApiToken.id == who.token_id).with_for_update(read=True)
    row = s.execute(q).first()
    if row is None or row.revoked_at is not None:
        raise Unauthorized("token revoked; log in again")


def check_token_format(token: str) -> None:
    if not token.startswith(TOKEN_PREFIX):
        raise Unauthorized("not a suanli token (they start with 'sl_')")


def authenticate(s: Session, token: str, now: datetime) -> Principal:
    check_token_format(token)
    row = s.execute(
        select(
            ApiToken.id,
            ApiToken.expires_at,
            ApiToken.revoked_at,
            User.id,
            User.email,
            User.is_admin,
            User.personal_org_id,
        )
        .join(User, User.id == ApiToken.user_id)
        .where(ApiToken.token_hash == token_hash(token))
    ).first()
    if row is None:
        raise Unauthorized("unknown token; log in again")
    tok_id, expires_at, revoked_at, user_id, email, is_admin, org_id = row
    if revoked_at is not None:
        raise Unauthorized("token revoked; log in again")
    if expires_at is not None and expires_at <= now:
        raise Unauthorized("token expired; log in again")
    return Principal(user_id, email, is_admin, org_id, tok_id, expires_at)


def list_tokens(s: Session, who: Principal) -> list[ApiToken]:
    return list(s.scalars(select(ApiToken).where(ApiToken.user_id == who.user_id).order_by(ApiToken.created_at)))


def revoke_token(s: Session, who: Principal, token_id: str, now: datetime) -> ApiToken:
    row = s.get(ApiToken, token_id)
    if row is None or row.user_id != who.user_id:
        raise NotFound(f"token {token_id} not found")
    if row.revoked_at is None:
        row.revoked_at = now
    return row


def user(s: Session, who: Principal) -> User:
    row = s.get(User, who.user_id)
    if row is None:
        raise Unauthorized("user no longer exists")
    return row


# ---- organisations -----------------------------------------------------------------------------------------
def role_in(s: Session, who: Principal, org_id: str) -> str | None:
    return s.scalar(select(Membership.role).where(Membership.org_id == org_id, Membership.user_id == who.user_id))


def org_for(s: Session, who: Principal, org_id: str) -> Org:
    """The org, if `who` may see it (a member, or an operator); what each role may do:
    `control.accounts.memberships`."""
    org = s.get(Org, org_id)
    role = role_in(s, who, org_id) if org is not None else None
    if org is None or (role is None and not who.is_admin):
        raise NotFound(f"organisation {org_id} not found")
    return org


def orgs_of(s: Session, who: Principal) -> list[tuple[Org, str]]:
    rows = s.execute(
        select(Org, Membership.role)
        .join(Membership, Membership.org_id == Org.id)
        .where(Membership.user_id == who.user_id)
        .order_by(Org.created_at)
    )
    return [(o, r) for o, r in rows]


ID_SHAPE = re.compile(r"[a-z]+_[0-9a-f]{16}", re.IGNORECASE)  # what `new_id` makes: `org_…`, `usr_…`, `wl_…`


BAD_CATEGORIES = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")  # control, format, surrogate, private, unassigned, lines
JOINERS = "\u200c\u200d"  # zero-width (non-)joiners: emoji sequences (👩‍👩‍👧) and Persian or Indic words need them


def org_name_problem(name: str) -> str | None:
    """Why `name` cannot name a team org, or None. Ids and emails are refused because operators find orgs by id or
    by a personal org's email: a team named after either would receive what was meant for it. Control, format
    (U+200B, U+202E) and line-separator characters are refused because they make one name look like another."""
    if not 1 <= len(name) <= 128:
        return "1 to 128 characters"
    if ID_SHAPE.fullmatch(name):
        return "must not look like an id (prefix_ and 16 hex digits)"
    if "@" in name:
        return "must not contain @ (personal organisations are named after emails)"
    bad = next((c for c in name if unicodedata.category(c) in BAD_CATEGORIES and c not in JOINERS), None)
    if bad is not None:
        return f"must not contain control or invisible characters (U+{ord(bad):04X})"
    return None


def create_org(s: Session, who: Principal, name: str, now: datetime, most: int = 20) -> Org:
    """A team org the caller owns; at most `most` (the setting `teams_per_user`) owned at once, counted under the
    user's row lock so concurrent requests cannot pass it together."""
    name = name.strip()
    problem = org_name_problem(name)
    if problem is not None:
        raise Invalid(f"name: {problem}")
    s.get(User, who.user_id, with_for_update=True)
    owned = s.scalar(
        select(func.count()).select_from(Membership).join(Org, Org.id == Membership.org_id)
        .where(Membership.user_id == who.user_id, Membership.role == "owner", Org.personal.is_(False))
    )  # fmt: skip
    if (owned or 0) >= most:
        raise Conflict(f"you own {owned} team organisations, the most one user may (teams_per_user: {most}); "
                       "remove one or ask the operator")  # fmt: skip
    if s.scalar(select(Org.id).where(Org.name == name)):  # team names only: an email is never a team's name
        raise Conflict("name: taken by another organisation; choose another")
    org = Org(id=new_id("org"), name=name, personal=False, created_at=now)
    sandbox_uids.assign(s, org)
    s.add(org)
    s.flush()
    s.add(Membership(org_id=org.id, user_id=who.user_id, role="owner"))
    s.flush()
    return org


# ---- operators ----------------------------------------------------------------------------------------------
def require_admin(who: Principal) -> None:
    if not who.is_admin:
        raise Forbidden("operators only (admin role)")


def users(s: Session, limit: int) -> list[User]:
    return list(s.scalars(select(User).order_by(User.created_at).limit(limit)))


def all_orgs(s: Session, limit: int) -> list[Org]:
    return list(s.scalars(select(Org).order_by(Org.created_at).limit(limit)))


def set_admin(s: Session, user_id: str, admin: bool) -> User:
    row = s.get(User, user_id)
    if row is None:
        raise NotFound(f"user {user_id} not found")
    row.is_admin = admin
    return row


def org_by_ref(s: Session, ref: str) -> Org:
    """An org by id, or else by name (a personal org is named after its user's email), for operators."""
    where = Org.id == ref if ID_SHAPE.fullmatch(ref) else Org.name == ref  # an id is only ever an id
    row = s.scalar(select(Org).where(where))
    if row is None:
        raise NotFound(f"organisation {ref} not found")
    return row


QUOTAS = ("gpus", "cpus", "memory_gib")  # what an org may hold at once: GPUs, host CPU cores, host memory GiB


def set_quota(s: Session, ref: str, limits: dict[str, int | None]) -> Org:
    """Set the org's quotas named in `limits` (None: no limit); the others stay as they were."""
    unknown = set(limits) - set(QUOTAS)
    if unknown:
        raise Invalid(f"quota: unknown {', '.join(sorted(unknown))}; quotas: {', '.join(QUOTAS)}")
    row = org_by_ref(s, ref)
    for name, limit in limits.items():
        setattr(row, f"quota_{name}", limit)
    return row


def ensure_admin(s: Session, email: str, password: str, now: datetime) -> User | None:
    """The first admin from the environment: created once. A user who registered the address before is promoted only
    when the configured password is theirs: else whoever signed up first with an address the operator configures
    later (a second operator, a new address) became an operator, on their own password. None: not promoted (logged;
    `suanli admin set-password` or another address settles it)."""
    existing = s.scalar(select(User).where(User.email == email.strip().lower()))
    if existing is not None:
        if existing.is_admin or verify_password(existing.password_hash, password):
            existing.is_admin = True
            return existing
        log.error("admin_email %s is a user's whose password is not admin_password: not made an operator", email)
        return None
    u, _ = create_user(s, email, password, now, admin=True)
    return u

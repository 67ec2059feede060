"""E-mail verification: where the server can send mail (`smtp_url`), a signup's trial credit waits until the user
redeems the link mailed to them, so a throwaway address that cannot receive mail earns nothing.

A token is 256 random bits, stored as its SHA-256 only, good once and for `TOKEN_TTL`. It is a bearer proof of the
mailbox: redeeming it verifies and credits the user it was sent to, whoever presents it (the link is opened
without logging in). The credit is the ledger transaction `trial:<user>`, the key signup uses without mail, so the
ledger itself grants it at most once however many links are redeemed. Mail is sent after the transaction commits,
on a few threads of its own (`suanli.mail.outbox`): a mail server that is down fails nobody's signup, and the user may ask
for another link (`RESEND`: 3 at once, then one every 20 minutes).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from suanli.control.accounts import links, throttle, trials
from suanli.control.errors import Conflict
from suanli.control.ids import new_secret, token_hash
from suanli.db.access import EmailVerification
from suanli.db.models import User
from suanli.mail import Mail

TOKEN_TTL = timedelta(hours=24)
RESEND = throttle.Bucket(3, 1200.0)
MAX_LINKS = 10  # links one account is ever mailed: its address may be someone else's, who should not get one a day
PATH = "/verify"  # the console's page a link lands on (GET shows a button; only its POST redeems)


@dataclass(frozen=True)
class Redeemed:
    user_id: str
    email: str
    org_id: str
    credited: Decimal  # 0 where the trial credit had been granted already


def issue(s: Session, user: User, now: datetime, grants_trial: bool) -> str:
    """A new link's token for `user`; the plain token is returned once and never stored. `grants_trial`: redeeming
    it grants the trial credit (a signup's link; a user an operator made gets none by verifying)."""
    plain = new_secret()
    s.add(EmailVerification(token_hash=token_hash(plain), user_id=user.id, email=user.email, created_at=now,
                            expires_at=now + TOKEN_TTL, used_at=None, grants_trial=grants_trial))  # fmt: skip
    s.flush()
    return plain


def is_verified(s: Session, user_id: str) -> bool:
    q = select(EmailVerification.token_hash).where(
        EmailVerification.user_id == user_id, EmailVerification.used_at.is_not(None)
    )
    return s.scalar(q.limit(1)) is not None


def trial_waits(s: Session, user_id: str) -> bool:
    """Whether a link of the user's grants the trial credit (their signup's: they were meant to have it)."""
    q = select(EmailVerification.token_hash).where(
        EmailVerification.user_id == user_id, EmailVerification.grants_trial.is_(True)
    )
    return s.scalar(q.limit(1)) is not None


UNKNOWN = "token: not a verification token (copy the whole link from the e-mail)"


def trial_pending(s: Session, user: User, trial_credit: Decimal) -> bool:
    """Whether verifying would still release a trial credit: one of the user's links carries it, and neither they
    nor another user of their mailbox had one."""
    return (trial_credit > 0 and trial_waits(s, user.id) and not trials.granted(s, user.id)
            and not trials.mailbox_had_one(s, user.email))  # fmt: skip


def check_known(s: Session, token: str) -> None:
    """422 for a token that is not of our shape or matches no link: checked on a read, so garbage sent to the
    unauthenticated route never takes the database's write lock."""
    links.check_known(s, EmailVerification, token, UNKNOWN)


def redeem(s: Session, token: str, now: datetime, trial_credit: Decimal) -> Redeemed:
    """Verify the user the token was sent to and grant their trial credit (once); 422/409 naming `token` otherwise.
    Redeems of one user's links take turns on the user's row (`links.spend`): each marks its own link and then the
    user's others, so two at once on PostgreSQL would otherwise each hold the row the other wants next."""
    row = links.spend(s, EmailVerification, token, now, unknown=UNKNOWN, used="token: this link was used already",
                      expired="token: this link has expired; ask for a new one")  # fmt: skip
    user = s.get(User, row.user_id)
    assert user is not None  # `links.spend` refused a link whose user is gone
    credited = proven(s, user, now, trial_credit)
    return Redeemed(user.id, user.email, user.personal_org_id, credited)


def proven(s: Session, user: User, now: datetime, trial_credit: Decimal) -> Decimal:
    """The user redeemed a link mailed to their address (a verification link, or a password reset's): the address
    is verified from now on, their other verification links are spent, and a trial credit that waited for this is
    granted, once per user and per mailbox (`trials.grant`; `trial_waits`: a user an operator made was promised
    none). Returns what was credited now. The
    caller holds the user's row (`links.spend`)."""
    s.execute(
        update(EmailVerification)
        .where(EmailVerification.user_id == user.id, EmailVerification.used_at.is_(None))
        .values(used_at=now)
        .execution_options(synchronize_session=False)
    )
    if not is_verified(s, user.id):  # proven by a reset, with no verification link ever mailed: record it as one
        s.add(EmailVerification(token_hash=token_hash(new_secret()), user_id=user.id, email=user.email,
                                created_at=now, expires_at=now, used_at=now, grants_trial=False))  # fmt: skip
        s.flush()
    return trials.grant(s, user, trial_credit, now) if trial_waits(s, user.id) else Decimal(0)


def begin_resend(s: Session, user: User, now: datetime) -> str:
    """A new link for `user`, or 409 when they are verified already or were mailed `MAX_LINKS`, 429 past
    `RESEND`."""
    if is_verified(s, user.id):
        raise Conflict("email: already verified")
    sent = s.scalar(select(func.count()).select_from(EmailVerification).where(EmailVerification.user_id == user.id))
    if (sent or 0) >= MAX_LINKS:
        raise Conflict(f"email: {MAX_LINKS} links were mailed to this address already; no more are sent (ask the "
                       "operator)")  # fmt: skip
    throttle.count(s, ("verify-resend", user.id), RESEND, now, "too many verification e-mails asked for")
    return issue(s, user, now, grants_trial=trial_waits(s, user.id))


def message(to: str, site_url: str, token: str, trial: bool = True) -> Mail:
    """The verification mail; `trial`: verifying releases a trial credit (not where the mailbox had its own)."""
    link = f"{site_url}{PATH}?token={token}"
    what = "verify it and receive your trial credit" if trial else "verify it"
    body = (
        "Someone (we hope you) signed up for a suanli account with this address.\n\n"
        f"Open this link to {what}:\n\n    {link}\n\n"
        f"The link works once, for {int(TOKEN_TTL.total_seconds() // 3600)} hours. "
        "If you did not sign up, ignore this message.\n"
    )
    return Mail(to=to, subject="Verify your e-mail address for suanli", body=body)

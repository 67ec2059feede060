"""The sign-up trial credit, once per user and once per mailbox.

A verified address proves a mailbox, but one mailbox has many addresses (`suanli.mail.addresses`: plus-addressing,
Gmail's dots, Fastmail's subdomains, a provider's several domains). So a trial is granted to a user only while no
other user of the same mailbox had one: `trial_mailboxes` keeps the SHA-256 of each mailbox granted a trial (not the address), its primary
key deciding between two grants at once. A domain that delivers every address to one inbox (a catch-all) is not
recognisable from the address; an operator who sees one abused sets `signup: invite` (docs/control-plane.md).

Grants an operator makes (`create-user --trial-credit`) are theirs to decide and are not counted here.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from suanli.billing.ledger import PROMOTIONS, org_account, transfer
from suanli.control.money import ledger
from suanli.db.access import TrialMailbox
from suanli.db.models import LedgerTransaction, User
from suanli.mail.addresses import mailbox


def mailbox_key(email: str) -> str:
    """What `trial_mailboxes` keeps: the SHA-256 of the mailbox, not the address."""
    return hashlib.sha256(mailbox(email).encode()).hexdigest()


def trial_key(user_id: str) -> str:
    """The ledger transaction's key: the ledger itself grants a user's trial at most once."""
    return f"trial:{user_id}"


def granted(s: Session, user_id: str) -> bool:
    return s.scalar(select(LedgerTransaction.id).where(LedgerTransaction.key == trial_key(user_id))) is not None


def mailbox_had_one(s: Session, email: str) -> bool:
    return s.get(TrialMailbox, mailbox_key(email)) is not None


def grant(s: Session, user: User, amount: Decimal, now: datetime) -> Decimal:
    """Credit the trial to the user's personal org unless they, or another user of their mailbox, had one; what was
    credited. Two grants to one mailbox at once: the second's insert fails on the key, and it credits nothing."""
    if amount <= 0 or granted(s, user.id) or mailbox_had_one(s, user.email):
        return Decimal(0)
    try:
        with s.begin_nested():
            s.add(TrialMailbox(mailbox_hash=mailbox_key(user.email), user_id=user.id, granted_at=now))
    except IntegrityError:  # another user of this mailbox was granted theirs first
        return Decimal(0)
    org = user.personal_org_id
    tx = transfer(trial_key(user.id), "trial_credit", PROMOTIONS, org_account(org), amount, "trial credit")
    _, created = ledger.post(s, tx, now, org_id=org, user_id=user.id)
    return amount if created else Decimal(0)

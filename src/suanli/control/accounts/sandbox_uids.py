"""The uid (and gid) a root server runs an org's sandboxes as, and owns its volumes' live trees by: one per org.

Outside every login and system range (`sandbox.bwrap.SANDBOX_UID_BASE`), recorded on the org so that no two orgs
share one. The first choice is the uid the org's id hashes to, which every org made before the column existed had
(its files are owned by it); an org whose hash is taken gets the next free uid.
"""

from __future__ import annotations

import zlib

from sqlalchemy import select
from sqlalchemy.orm import Session

from suanli.db.models import Org
from suanli.sandbox.bwrap import SANDBOX_UID_BASE, SANDBOX_UID_SPAN


def first_choice(org_id: str) -> int:
    return SANDBOX_UID_BASE + zlib.crc32(org_id.encode()) % SANDBOX_UID_SPAN


def assign(s: Session, org: Org) -> None:
    """Give a new org (not yet added) its uid. Two orgs made at once whose ids hash alike would meet the unique
    index, one in 2^24 of such pairs; the loser's transaction fails rather than share."""
    uid = first_choice(org.id)
    for _ in range(SANDBOX_UID_SPAN):
        if s.scalar(select(Org.id).where(Org.sandbox_uid == uid)) is None:
            org.sandbox_uid = uid
            return
        uid = SANDBOX_UID_BASE + (uid - SANDBOX_UID_BASE + 1) % SANDBOX_UID_SPAN
    raise RuntimeError("every sandbox uid is taken")


def of(s: Session, org_id: str) -> int:
    """The org's uid. Every org has one (`assign` at creation, 0028 before it); one without is refused, never run
    as some other uid."""
    uid = s.scalar(select(Org.sandbox_uid).where(Org.id == org_id))
    if uid is None:
        raise LookupError(f"org {org_id} has no sandbox uid")
    return int(uid)

"""Roles in an organisation and what each may do, and invitations (a member's monthly spend limit is checked in
`spend_limits`).

Nobody becomes a member without consent: a member who may manage the org invites an email with a role, and the
user with that email accepts (or declines) it. The invitation is answered the same whether or not the email belongs
to anyone, so inviting cannot be used to learn who is registered. Operators (the `admin` flag of a user, not the
org role) may do everything in every org.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from suanli.control.accounts import spend_limits, verification
from suanli.control.accounts.accounts import Principal, check_email
from suanli.control.errors import Conflict, Forbidden, Invalid, NotFound
from suanli.control.ids import new_id, new_secret, token_hash, utcnow
from suanli.db.access import Invitation
from suanli.db.models import Membership, Org, User, Workload

ROLES = ("owner", "admin", "member", "viewer")
RIGHTS: dict[str, frozenset[str]] = {
    "owner": frozenset({"read", "submit", "spend", "others", "manage", "owners"}),
    "admin": frozenset({"read", "submit", "spend", "others", "manage"}),
    "member": frozenset({"read", "submit", "spend"}),
    "viewer": frozenset({"read"}),
}
ENTER = tuple(r for r, rights in RIGHTS.items() if "submit" in rights)  # roles that get into instances (SSH, proxy)
WHAT = {
    "read": "see this organisation",
    "submit": "submit work or start it again",
    "spend": "spend this organisation's money",
    "others": "stop, start or scale other members' work",
    "manage": "invite or remove members, or change their roles and spend limits",
    "owners": "make, unmake, invite or remove owners",
}
INVITATION_DAYS = 14
MAX_PENDING = 100  # pending invitations per org: more is spam, not a team
CODE_PREFIX = "si_"  # invitation and signup codes (`control.accounts.signups`)


@dataclass(frozen=True)
class Access:
    """What the caller may do in one org: their role there (None: an operator who is not a member)."""

    org: Org
    role: str | None
    spend_limit: Decimal | None
    operator: bool

    def can(self, right: str) -> bool:
        return self.operator or (self.role is not None and right in RIGHTS[self.role])


def access(s: Session, who: Principal, org_id: str) -> Access:
    """The caller's access to the org; 404 to anyone who is neither a member nor an operator."""
    org = s.get(Org, org_id)
    m = s.get(Membership, (org_id, who.user_id)) if org is not None else None
    if org is None or (m is None and not who.is_admin):
        raise NotFound(f"organisation {org_id} not found")
    return Access(org, m.role if m else None, m.monthly_spend_limit if m else None, who.is_admin)


LOST_SPEND = "its submitter may no longer spend this organisation's money (removed, or made a viewer)"


def may_spend(s: Session, org_id: str, user_id: str) -> bool:
    """Whether work the user submitted may still start or grow on the org's money: their role there spends, or
    they are an operator. Asked wherever work starts or grows again on its own (a retry, a requeue after a
    preemption, a grow), not only at submission: a member removed or made a viewer kept spending the team's
    money through retries and grows, past any spend limit (a non-member has none)."""
    role = s.scalar(select(Membership.role).where(Membership.org_id == org_id, Membership.user_id == user_id))
    if role is not None and "spend" in RIGHTS.get(role, frozenset()):
        return True
    return bool(s.scalar(select(User.is_admin).where(User.id == user_id)))


def _refuse(a: Access, right: str) -> Forbidden:
    return Forbidden(f"organisation {a.org.id}: a {a.role or 'non-member'} cannot {WHAT[right]}")


def require(s: Session, who: Principal, org_id: str, *rights: str) -> Access:
    """The caller's access, if their role has every one of `rights`; else 403 naming the role and what it cannot
    do."""
    a = access(s, who, org_id)
    for right in rights:
        if not a.can(right):
            raise _refuse(a, right)
    return a


def check_work(s: Session, who: Principal, w: Workload, act: str) -> None:
    """May the caller `act` (stop, start, scale) on this workload of an org they can see? Stopping one's own work
    is always allowed; starting or scaling needs `submit`; another member's work needs `others` as well."""
    if who.is_admin:
        return
    role = s.scalar(select(Membership.role).where(Membership.org_id == w.org_id, Membership.user_id == who.user_id))
    rights = RIGHTS.get(role or "", frozenset())
    if act != "stop" and "submit" not in rights:
        raise Forbidden(f"organisation {w.org_id}: a {role} cannot {WHAT['submit']}")
    if w.user_id != who.user_id and "others" not in rights:
        raise Forbidden(f"workload {w.id}: another member's work; a {role} of its organisation cannot {act} it "
                        "(owners and admins can)")  # fmt: skip


# ---- members -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemberView:
    user_id: str
    email: str
    role: str
    monthly_spend_limit: Decimal | None
    month_to_date: Decimal


def members(s: Session, who: Principal, org_id: str, now: datetime) -> list[MemberView]:
    require(s, who, org_id, "read")
    spent = spend_limits.month_to_date(s, org_id, now)
    rows = s.execute(
        select(User.id, User.email, Membership.role, Membership.monthly_spend_limit)
        .join(Membership, Membership.user_id == User.id)
        .where(Membership.org_id == org_id)
        .order_by(User.email)
    )
    return [MemberView(uid, email, role, limit, spent.get(uid, Decimal(0))) for uid, email, role, limit in rows]


def member(s: Session, who: Principal, org_id: str, user_id: str, now: datetime) -> MemberView:
    """One member, as `members` lists them (reading that member's charges only)."""
    require(s, who, org_id, "read")
    row = s.execute(
        select(User.email, Membership.role, Membership.monthly_spend_limit)
        .join(Membership, Membership.user_id == User.id)
        .where(Membership.org_id == org_id, Membership.user_id == user_id)
    ).one_or_none()
    if row is None:
        raise NotFound(f"user {user_id} is not a member of {org_id}")
    spent = spend_limits.month_to_date(s, org_id, now, user_id).get(user_id, Decimal(0))
    return MemberView(user_id, row.email, row.role, row.monthly_spend_limit, spent)


def _keep_an_owner(s: Session, org_id: str) -> None:
    """Refuse to take away the last owner. The owners' rows are locked, so two owners demoting each other at once
    are taken one after the other and the second is refused."""
    owners = s.scalars(select(Membership).where(Membership.org_id == org_id, Membership.role == "owner")
                       .with_for_update()).all()  # fmt: skip
    if len(owners) <= 1:
        raise Conflict("an organisation keeps at least one owner; make another member owner first")


def _target(s: Session, org_id: str, user_id: str) -> Membership:
    m = s.get(Membership, (org_id, user_id))
    if m is None:
        raise NotFound(f"user {user_id} is not a member of {org_id}")
    return m


UNSET = object()


def _drop_invitations(s: Session, org_id: str, user_id: str, role: str | None, now: datetime) -> None:
    """Cancel the pending invitations `user_id` made in the org that their new `role` (None: no longer a member)
    may not make: an invitation carries its maker's right, and a demoted admin must not come back through one."""
    rights = RIGHTS.get(role or "", frozenset())
    if "manage" not in rights:
        roles: tuple[str, ...] = ROLES
    elif "owners" not in rights:
        roles = ("owner",)
    else:
        return
    s.execute(update(Invitation).where(Invitation.org_id == org_id, Invitation.invited_by == user_id,
                                       Invitation.state == "pending", Invitation.role.in_(roles))
              .values(state="cancelled", decided_at=now))  # fmt: skip


def set_member(
    s: Session, who: Principal, org_id: str, user_id: str, *, role: str | None = None, limit: object = UNSET,
    now: datetime | None = None,
) -> Membership:  # fmt: skip
    """Change a member's role and/or monthly spend limit (`limit` None: no limit; UNSET: unchanged). Invitations
    they made that their new role may not make are cancelled."""
    a = require(s, who, org_id, "manage")
    m = _target(s, org_id, user_id)
    if role is not None and role not in ROLES:
        raise Invalid(f"role: one of {', '.join(ROLES)}")
    if (m.role == "owner" or role == "owner") and not a.can("owners"):
        raise _refuse(a, "owners")
    if user_id == who.user_id and not a.can("owners"):
        raise Forbidden(f"organisation {org_id}: you cannot change your own role or spend limit; ask an owner")
    if role is not None and m.role == "owner" and role != "owner":
        _keep_an_owner(s, org_id)
    new_limit = m.monthly_spend_limit if limit is UNSET else spend_limits.check_limit(limit)  # type: ignore[arg-type]
    if not a.can("owners"):
        if limit is not UNSET and "admin" in (m.role, role):
            raise Forbidden(f"monthly_spend_limit: an admin's spend limit is an owner's to set in {org_id}")
        if limit is not UNSET or role == "admin":
            _within_own(a, new_limit)
    if role is not None and role != m.role:
        _drop_invitations(s, org_id, user_id, role, now or utcnow())
    if role is not None:
        m.role = role
    m.monthly_spend_limit = new_limit
    s.flush()
    return m


def _within_own(a: Access, limit: Decimal | None) -> None:
    """A manager with a spend limit gives nobody more than it (nor no limit): else a limited admin invited a second
    account of theirs as an unlimited admin, which lifted the first one's limit, and the owner's limit held nothing."""
    if a.spend_limit is not None and (limit is None or limit > a.spend_limit):
        raise Forbidden(
            f"monthly_spend_limit: your own limit in {a.org.id} is {a.spend_limit}; you may give others "
            "at most that (ask an owner for more, or for none)"
        )


def remove_member(s: Session, who: Principal, org_id: str, user_id: str, now: datetime | None = None) -> None:
    """Anyone may leave; removing someone else takes `manage` (and `owners` for an owner). The last owner stays.
    The invitations they made and nobody answered yet are cancelled."""
    access(s, who, org_id)  # 404 to outsiders before anything is said about the user
    m = _target(s, org_id, user_id)
    if user_id != who.user_id:
        require(s, who, org_id, *(("manage", "owners") if m.role == "owner" else ("manage",)))
    if m.role == "owner":
        _keep_an_owner(s, org_id)
    _drop_invitations(s, org_id, user_id, None, now or utcnow())
    s.delete(m)


# ---- invitations -------------------------------------------------------------------------------------------------
def invite(
    s: Session, who: Principal, org_id: str, email: str, role: str, limit: Decimal | None, now: datetime
) -> tuple[Invitation, str]:
    """An invitation to `email` (registered or not: the answer is the same) and its code, shown once: where
    signup is invite-only, the invitee signs up with it."""
    a = require(s, who, org_id, "manage")
    if a.org.personal:
        raise Conflict("a personal organisation has one member; create a team organisation to share")
    if role not in ROLES:
        raise Invalid(f"role: one of {', '.join(ROLES)}")
    if role == "owner" and not a.can("owners"):
        raise _refuse(a, "owners")
    email = check_email(email)
    limit = spend_limits.check_limit(limit)
    if not a.can("owners"):
        _within_own(a, limit)
    # Members are listed to those who may invite, so saying so reveals nothing new.
    member = select(Membership.user_id).join(User, User.id == Membership.user_id)
    if s.scalar(member.where(Membership.org_id == org_id, User.email == email)) is not None:
        raise Conflict(f"email: {email} is already a member of {org_id}")
    pending = select(Invitation.id).where(Invitation.org_id == org_id, Invitation.state == "pending",
                                          Invitation.expires_at > now)  # fmt: skip
    replaced = select(Invitation.id).where(Invitation.org_id == org_id, Invitation.email == email,
                                           Invitation.state == "pending", Invitation.role == "owner")  # fmt: skip
    if not a.can("owners") and s.scalar(replaced.limit(1)) is not None:  # inviting again cancels it
        raise _refuse(a, "owners")
    s.execute(update(Invitation).where(Invitation.org_id == org_id, Invitation.email == email,
                                       Invitation.state == "pending").values(state="cancelled", decided_at=now))  # fmt: skip
    s.get(Org, org_id, with_for_update=True)  # invitations of one org counted one at a time
    if len(s.scalars(pending.limit(MAX_PENDING)).all()) >= MAX_PENDING:
        raise Conflict(f"organisation {org_id} has {MAX_PENDING} pending invitations; cancel some first")
    code = CODE_PREFIX + new_secret()
    row = Invitation(id=new_id("inv"), org_id=org_id, email=email, role=role, monthly_spend_limit=limit,
                     code_hash=token_hash(code), invited_by=who.user_id, state="pending", created_at=now,
                     expires_at=now + timedelta(days=INVITATION_DAYS), decided_at=None)  # fmt: skip
    s.add(row)
    s.flush()
    return row, code


def cancel(s: Session, who: Principal, org_id: str, invitation_id: str, now: datetime) -> Invitation:
    a = require(s, who, org_id, "manage")
    row = s.get(Invitation, invitation_id)
    if row is None or row.org_id != org_id:
        raise NotFound(f"invitation {invitation_id} not found")
    if row.role == "owner" and row.state == "pending" and not a.can("owners"):
        raise _refuse(a, "owners")
    if row.state == "pending":
        row.state, row.decided_at = "cancelled", now
    return row


@dataclass(frozen=True)
class InvitationView:
    invitation: Invitation
    org_name: str
    invited_by: str  # the inviter's email


def _pending(s: Session, where: object, now: datetime) -> list[InvitationView]:
    rows = s.execute(
        select(Invitation, Org.name, User.email)
        .join(Org, Org.id == Invitation.org_id)
        .join(User, User.id == Invitation.invited_by)
        .where(where, Invitation.state == "pending", Invitation.expires_at > now)  # type: ignore[arg-type]
        .order_by(Invitation.created_at)
    )
    return [InvitationView(inv, name, by) for inv, name, by in rows]


def mine(s: Session, who: Principal, now: datetime, proof: bool = False) -> list[InvitationView]:
    """Pending invitations to the caller's email; none while `proof` is asked (the server sends mail, so it can
    tell a proven address from a claimed one) and the caller has not verified it."""
    if proof and not verification.is_verified(s, who.user_id):
        return []
    return _pending(s, Invitation.email == who.email, now)


def org_invitations(s: Session, who: Principal, org_id: str, now: datetime) -> list[InvitationView]:
    """The org's pending invitations (to those who may manage it)."""
    require(s, who, org_id, "manage")
    return _pending(s, Invitation.org_id == org_id, now)


def _addressed_to(s: Session, who: Principal, invitation_id: str, now: datetime, proof: bool) -> Invitation:
    """The invitation, made out to the caller's address, which the caller has proven where the server can ask for
    proof: else whoever signed up first with a colleague's address joined the team in their place, as any role."""
    row = s.get(Invitation, invitation_id, with_for_update=True)
    if row is None or row.email != who.email:
        raise NotFound(f"invitation {invitation_id} not found")
    if proof and not verification.is_verified(s, who.user_id):
        raise Forbidden("email: verify your address (the link mailed to it) to answer invitations made out to it")
    if row.state != "pending":
        raise Conflict(f"invitation {invitation_id} was {row.state}")
    if row.expires_at <= now:
        raise Conflict(f"invitation {invitation_id} expired; ask for a new one")
    return row


def join(s: Session, user_id: str, row: Invitation, now: datetime) -> Membership:
    """The invitee joins with the invitation's role and limit, as far as its inviter may still give them now: an
    invitation made by an operator since unmade, or by a manager since demoted or limited, used to admit with the
    rights its maker had then (an owner of a team the former operator never belonged to; no limit past the maker's
    new one)."""
    if s.get(Membership, (row.org_id, user_id)) is not None:
        raise Conflict(f"you are a member of {row.org_id} already")
    limit = _still_given(s, row)
    m = Membership(org_id=row.org_id, user_id=user_id, role=row.role, monthly_spend_limit=limit)
    s.add(m)
    row.state, row.decided_at = "accepted", now
    s.flush()
    return m


def _still_given(s: Session, row: Invitation) -> Decimal | None:
    """The spend limit the invitee joins with, if the inviter may still make this invitation (409 otherwise): a
    manager, and for an owner's role one who makes owners, or an operator; a limited manager gives no more than
    their own limit now."""
    inviter = s.get(User, row.invited_by)
    m = s.get(Membership, (row.org_id, row.invited_by))
    if inviter is not None and inviter.is_admin:
        return row.monthly_spend_limit
    rights = RIGHTS.get(m.role, frozenset()) if m is not None else frozenset()
    if "manage" not in rights or (row.role == "owner" and "owners" not in rights):
        raise Conflict(f"invitation {row.id}: whoever made it may no longer invite as {row.role}; ask for a new one")
    own = m.monthly_spend_limit if m is not None and "owners" not in rights else None
    if own is not None and (row.monthly_spend_limit is None or row.monthly_spend_limit > own):
        return own
    return row.monthly_spend_limit


def accept(s: Session, who: Principal, invitation_id: str, now: datetime, proof: bool = False) -> Membership:
    return join(s, who.user_id, _addressed_to(s, who, invitation_id, now, proof), now)


def decline(s: Session, who: Principal, invitation_id: str, now: datetime, proof: bool = False) -> Invitation:
    row = _addressed_to(s, who, invitation_id, now, proof)
    row.state, row.decided_at = "declined", now
    return row


def by_code(s: Session, code: str, email: str, now: datetime) -> Invitation | None:
    """The pending invitation this code belongs to, if it was made out to `email`."""
    row = s.scalar(select(Invitation).where(Invitation.code_hash == token_hash(code)).with_for_update())
    if row is None or row.email != email or row.state != "pending" or row.expires_at <= now:
        return None
    return row

"""Members of an organisation, their roles and spend limits, and invitations (sent, received, answered)."""

from __future__ import annotations

from fastapi import APIRouter

from suanli.api.deps import Auth, in_thread
from suanli.api.schemas import (
    InvitationIn,
    InvitationOut,
    MemberOut,
    MemberPatch,
    NewInvitationOut,
    OrgOut,
    money,
)
from suanli.api.strict_json import StrictJSONRoute
from suanli.control.accounts import memberships
from suanli.control.accounts.memberships import UNSET, InvitationView, MemberView
from suanli.control.workloads import workloads
from suanli.db.models import Org, User

router = APIRouter(route_class=StrictJSONRoute, tags=["organisations"])


def _member(m: MemberView) -> MemberOut:
    limit = None if m.monthly_spend_limit is None else money(m.monthly_spend_limit)
    return MemberOut(user_id=m.user_id, email=m.email, role=m.role, monthly_spend_limit=limit,
                     month_to_date=money(m.month_to_date))  # fmt: skip


def _invitation(v: InvitationView) -> InvitationOut:
    i = v.invitation
    limit = None if i.monthly_spend_limit is None else money(i.monthly_spend_limit)
    return InvitationOut(id=i.id, org_id=i.org_id, org_name=v.org_name, email=i.email, role=i.role,
                         monthly_spend_limit=limit, state=i.state, invited_by=v.invited_by, created_at=i.created_at,
                         expires_at=i.expires_at)  # fmt: skip


@router.get("/orgs/{org_id}/members")
@in_thread
def list_members(org_id: str, ctx: Auth) -> list[MemberOut]:
    """Members with their roles, spend limits and this month's charges (every member may read them)."""
    with ctx.db.read() as s:
        return [_member(m) for m in memberships.members(s, ctx.who, org_id, ctx.now)]


@router.patch("/orgs/{org_id}/members/{user_id}")
@in_thread
def patch_member(org_id: str, user_id: str, body: MemberPatch, ctx: Auth) -> MemberOut:
    """Change a member's role and/or monthly spend limit (owners and admins; owners alone touch owners). Made a
    viewer, their work still queued in the org stops."""
    limit = body.monthly_spend_limit if "monthly_spend_limit" in body.model_fields_set else UNSET
    with ctx.db.write() as s, s.begin():
        memberships.set_member(s, ctx.who, org_id, user_id, role=body.role, limit=limit, now=ctx.now)
        if body.role is not None and "spend" not in memberships.RIGHTS[body.role]:
            why = f"stopped: its submitter is now a {body.role} of {org_id}, who may not spend its money"
            workloads.stop_queued(s, org_id, user_id, why, ctx.now)
        return _member(memberships.member(s, ctx.who, org_id, user_id, ctx.now))


@router.delete("/orgs/{org_id}/members/{user_id}", status_code=204)
@in_thread
def remove_member(org_id: str, user_id: str, ctx: Auth) -> None:
    """Remove a member (owners and admins), or leave (anyone, yourself); the last owner stays. Their work still
    queued in the org stops (what runs goes on)."""
    with ctx.db.write() as s, s.begin():
        memberships.remove_member(s, ctx.who, org_id, user_id, ctx.now)
        why = f"stopped: its submitter is no longer a member of {org_id}"
        workloads.stop_queued(s, org_id, user_id, why, ctx.now)


@router.post("/orgs/{org_id}/invitations", status_code=201)
@in_thread
def invite(org_id: str, body: InvitationIn, ctx: Auth) -> NewInvitationOut:
    """Invite an email with a role; the invitee accepts or declines. Answered alike whether or not the email
    belongs to anyone. The `code` is shown once (for signup where it is invite-only)."""
    with ctx.db.write() as s, s.begin():
        row, code = memberships.invite(s, ctx.who, org_id, body.email, body.role, body.monthly_spend_limit, ctx.now)
        view = InvitationView(row, memberships.access(s, ctx.who, org_id).org.name, ctx.who.email)
        return NewInvitationOut(**_invitation(view).model_dump(), code=code)


@router.get("/orgs/{org_id}/invitations")
@in_thread
def org_invitations(org_id: str, ctx: Auth) -> list[InvitationOut]:
    """The organisation's pending invitations (owners and admins)."""
    with ctx.db.read() as s:
        return [_invitation(v) for v in memberships.org_invitations(s, ctx.who, org_id, ctx.now)]


@router.delete("/orgs/{org_id}/invitations/{invitation_id}")
@in_thread
def cancel_invitation(org_id: str, invitation_id: str, ctx: Auth) -> InvitationOut:
    with ctx.db.write() as s, s.begin():
        row = memberships.cancel(s, ctx.who, org_id, invitation_id, ctx.now)
        inviter = s.get(User, row.invited_by)  # who invited, not who cancels
        return _invitation(InvitationView(row, memberships.access(s, ctx.who, org_id).org.name,
                                          inviter.email if inviter else ""))  # fmt: skip


@router.get("/invitations")
@in_thread
def my_invitations(ctx: Auth) -> list[InvitationOut]:
    """Pending invitations to the caller's email (where this server sends mail: once the caller verified it)."""
    with ctx.db.read() as s:
        return [_invitation(v) for v in memberships.mine(s, ctx.who, ctx.now, proof=ctx.srv.mailer is not None)]


@router.post("/invitations/{invitation_id}/accept")
@in_thread
def accept(invitation_id: str, ctx: Auth) -> OrgOut:
    """Join the organisation with the invitation's role; returns it."""
    with ctx.db.write() as s, s.begin():
        m = memberships.accept(s, ctx.who, invitation_id, ctx.now, proof=ctx.srv.mailer is not None)
        org = memberships.access(s, ctx.who, m.org_id).org
        return OrgOut.model_validate(org).model_copy(update={"role": m.role})


@router.post("/invitations/{invitation_id}/decline")
@in_thread
def decline(invitation_id: str, ctx: Auth) -> InvitationOut:
    with ctx.db.write() as s, s.begin():
        row = memberships.decline(s, ctx.who, invitation_id, ctx.now, proof=ctx.srv.mailer is not None)
        org, inviter = s.get(Org, row.org_id), s.get(User, row.invited_by)
        return _invitation(InvitationView(row, org.name if org else "", inviter.email if inviter else ""))

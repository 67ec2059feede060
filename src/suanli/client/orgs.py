"""The SDK's calls for organisation membership: invitations (sent, received, answered), roles and spend limits, and
operators' invite codes. A mixin of `suanli.client.Client` (kept apart so each file stays small)."""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from suanli.client.models import Invitation, InviteCode, Member, NewInvitation, NewInviteCode, Org, load


def _seg(value: str) -> str:
    return quote(str(value), safe="@")


def _limit(value: Decimal | int | str | None) -> str | None:
    if isinstance(value, float):
        raise TypeError("amounts are Decimal, int or str, not float: floats cannot represent cents exactly")
    return None if value is None else str(Decimal(str(value)))


class _Unchanged:
    def __repr__(self) -> str:
        return "UNCHANGED"


KEEP = _Unchanged()  # a spend limit left as it is (None means: no limit)


class OrgCalls:
    if TYPE_CHECKING:  # provided by `Client`

        def call(self, method: str, path: str, body: Any = None, *, params: Any = None, auth: bool = True) -> Any: ...
        def _get(self, path: str, **params: Any) -> Any: ...
        def _post(self, path: str, body: Any = None, *, auth: bool = True) -> Any: ...

    def invite(
        self, org_id: str, email: str, role: str = "member", *, monthly_spend_limit: Decimal | int | str | None = None
    ) -> NewInvitation:
        """Invite `email` into a team org (owners and admins) as owner, admin, member or viewer; they accept or
        decline. `code` (shown once) signs them up where the server's signup is invite-only."""
        body = {"email": email, "role": role, "monthly_spend_limit": _limit(monthly_spend_limit)}
        return load(NewInvitation, self._post(f"/orgs/{_seg(org_id)}/invitations", body))

    def invitations(self, org_id: str | None = None) -> list[Invitation]:
        """Pending invitations to you; with `org_id`, the org's pending invitations (owners and admins)."""
        path = f"/orgs/{_seg(org_id)}/invitations" if org_id else "/invitations"
        return [load(Invitation, i) for i in self._get(path)]

    def accept(self, invitation_id: str) -> Org:
        """Join the org the invitation is for, with its role; returns the org."""
        return load(Org, self._post(f"/invitations/{_seg(invitation_id)}/accept"))

    def decline(self, invitation_id: str) -> Invitation:
        return load(Invitation, self._post(f"/invitations/{_seg(invitation_id)}/decline"))

    def invitation_cancel(self, org_id: str, invitation_id: str) -> Invitation:
        return load(Invitation, self.call("DELETE", f"/orgs/{_seg(org_id)}/invitations/{_seg(invitation_id)}"))

    def member_set(
        self, org_id: str, user_id: str, *, role: str | None = None,
        monthly_spend_limit: Decimal | int | str | _Unchanged | None = KEEP,
    ) -> Member:  # fmt: skip
        """Change a member's role and/or monthly spend limit (None: no limit; left out: unchanged)."""
        body: dict[str, Any] = {} if role is None else {"role": role}
        if not isinstance(monthly_spend_limit, _Unchanged):
            body["monthly_spend_limit"] = _limit(monthly_spend_limit)
        if not body:
            raise ValueError("give role and/or monthly_spend_limit")
        return load(Member, self.call("PATCH", f"/orgs/{_seg(org_id)}/members/{_seg(user_id)}", body))

    # ---- operators: invite codes ----
    def admin_invite_create(self, uses: int = 1, expires_in_days: int = 7, note: str = "") -> NewInviteCode:
        """An invite code for signup where it is invite-only; `code` is shown once."""
        body = {"uses": uses, "expires_in_days": expires_in_days, "note": note}
        return load(NewInviteCode, self._post("/admin/invites", body))

    def admin_invites(self) -> list[InviteCode]:
        return [load(InviteCode, c) for c in self._get("/admin/invites")]

    def admin_invite_revoke(self, code_id: str) -> InviteCode:
        return load(InviteCode, self.call("DELETE", f"/admin/invites/{_seg(code_id)}"))

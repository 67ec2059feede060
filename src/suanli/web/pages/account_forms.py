"""What the tenant's account pages (wallet, keys, team, volumes, hub, endpoints) share: the dependency, a form
that failed at the API shown again with its messages, and bounded parsing of what a query string asks for."""

from __future__ import annotations

import re
from datetime import date
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from suanli.web import session
from suanli.web.apicall import ApiError
from suanli.web.session import Page

Tenant = Annotated[Page, Depends(session.tenant)]
MAX_ID = 2**62


class BadQuery(Exception):
    """A query-string value the page cannot use; shown next to its field (422), never a 500."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field, self.message = field, message


def refused(page: Page, template: str, e: ApiError, **ctx: Any) -> HTMLResponse:
    """The page again with the API's status, its message (`error`) and its per-field messages (`fields`)."""
    return page.render(template, status=e.status, error=e.detail, fields=e.fields(), **ctx)


def at_fields(e: ApiError, default: str, known: tuple[str, ...] = ()) -> dict[str, str]:
    """The API's refusal by field: its validation errors, else its message at the field it starts with
    (`public_key: …`), else at `default`."""
    if e.fields():
        return e.fields()
    named = next((f for f in known if e.detail.startswith(f + ":")), default)
    return {named: e.detail}


def missing(page: Page, e: ApiError, back: str) -> HTMLResponse:
    """The API's refusal of an object (another org's, or none: 404) as a page of its own, with the way back."""
    return page.render("account/missing.html", status=e.status, code=e.status, message=e.detail, back=back)


def done(path: str) -> Response:
    """After a form that changed something: back to the page (a reload does not post it again)."""
    return RedirectResponse(path, status_code=303)


def day(page: Page, field: str, value: str | None) -> date | None:
    """An ISO day (`2026-01-31`, as a date input sends it) or nothing."""
    if not value:
        return None
    try:
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            raise ValueError(value)
        return date.fromisoformat(value)
    except ValueError:
        raise BadQuery(field, page.t("a day as YYYY-MM-DD", "日期格式应为 YYYY-MM-DD")) from None


def number(page: Page, field: str, value: str | None, low: int = 0, high: int = MAX_ID) -> int | None:
    if value in (None, ""):
        return None
    if not re.fullmatch(r"\d{1,19}", value) or not low <= int(value) <= high:
        raise BadQuery(field, page.t(f"a whole number from {low} to {high}", f"应为 {low} 到 {high} 之间的整数"))
    return int(value)


def word(page: Page, field: str, value: str | None, pattern: str = r"[a-z][a-z0-9_]{0,31}") -> str | None:
    if value in (None, ""):
        return None
    if not re.fullmatch(pattern, value):
        raise BadQuery(field, page.t("not one of the choices", "不是可选的值"))
    return value


def seg(value: str) -> str:
    """One path segment of an API path, quoted: an id from a URL can never walk to another route (`..`, `/`)."""
    return quote(value, safe="") if value not in (".", "..") else "%2E" * len(value)


def integer_or_text(value: str | None) -> int | str | None:
    """A form's number for the API: an int when it is one, else the text itself, so the API's own validation
    names the field; empty → None (the API's default)."""
    v = (value or "").strip()
    if not v:
        return None
    return int(v) if re.fullmatch(r"-?\d{1,18}", v) else v


def passwords_differ(page: Page, data: dict[str, str]) -> dict[str, str] | None:
    """A new password typed twice, differently: the message at the second field (the API sees one password)."""
    if data.get("new_password", "") == data.get("new_password_again", ""):
        return None
    return {"new_password_again": page.t("The two new passwords differ.", "两次输入的新密码不一致。")}

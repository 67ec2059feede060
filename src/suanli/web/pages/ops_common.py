"""What the operator pages share: the operator dependency, the API's field messages next to a form's fields."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import Depends
from fastapi.responses import HTMLResponse

from suanli.web import session
from suanli.web.apicall import ApiError
from suanli.web.render import ENV
from suanli.web.session import Page

Operator = Annotated[Page, Depends(session.operator)]
FIELD_RE = re.compile(r"^([a-z_][a-z0-9_.]*): (.+)$", re.S)


def errors(e: ApiError, default: str) -> dict[str, str]:
    """The API's per-field messages: its validation errors, or a service error's `field: message`; a message that
    names no field goes by `default` (the form's main field)."""
    if e.fields():
        return e.fields()
    m = FIELD_RE.match(e.detail)
    return {m.group(1): m.group(2)} if m else {default: e.detail}


def error_page(page: Page, status: int, message: str) -> HTMLResponse:
    html = ENV.get_template("error.html").render(page=None, t=page.t, lang=page.lang, status=status, message=message)
    return page.finish(HTMLResponse(html, status_code=status))  # type: ignore[return-value]

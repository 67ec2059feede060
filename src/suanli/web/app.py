"""Mount the console on the API's app: static files, the offline API docs, the pages, their error pages."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from suanli.web import i18n, session
from suanli.web.apicall import ApiError
from suanli.web.pages import ROUTERS
from suanli.web.render import ENV

STATIC = Path(__file__).parent / "static"
VENDOR = "/static/vendor"


def mount(app: FastAPI) -> None:
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        """Swagger UI from the package's own copy: the page works with no internet."""
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} API",
            swagger_js_url=f"{VENDOR}/swagger-ui/swagger-ui-bundle.js",
            swagger_css_url=f"{VENDOR}/swagger-ui/swagger-ui.css",
            swagger_favicon_url=f"{VENDOR}/swagger-ui/favicon-32x32.png",
            swagger_ui_parameters={"validatorUrl": None},  # no badge fetched from validator.swagger.io
        )  # fmt: skip

    @app.exception_handler(session.LoginRequired)
    async def login_required(request: Request, _: session.LoginRequired) -> Response:
        url = session.login_url(request)
        if request.headers.get("HX-Request"):
            return Response(status_code=204, headers={"HX-Redirect": url})
        resp = RedirectResponse(url, status_code=303)
        session.delete_cookie(resp, request, session.SESSION_COOKIE)
        return resp

    @app.exception_handler(session.Forbidden)
    async def forbidden(request: Request, exc: session.Forbidden) -> Response:
        return error_page(request, 403, exc.message)

    @app.exception_handler(ApiError)
    async def api_refused(request: Request, exc: ApiError) -> Response:
        """An API refusal a page did not handle itself (another tenant's workload: 404) is shown with the API's
        own status and message; a server error of the API stays a server error."""
        return error_page(request, exc.status, exc.detail)

    for r in ROUTERS:
        app.include_router(r, include_in_schema=False)


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    lang = i18n.pick(request.cookies.get(i18n.LANG_COOKIE), request.headers.get("accept-language"))
    html = ENV.get_template("error.html").render(
        page=None, t=lambda en, zh: i18n.translate(lang, en, zh), lang=lang, status=status, message=message
    )
    return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store", **session.SECURITY_HEADERS})

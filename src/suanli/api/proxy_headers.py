"""What passes between the browser and an instance through the proxy, header by header.

A tenant's service answers on the server's origin (unless each instance has its own, `proxy_url`), and it sees
what the browser sends: so the instance is never told the proxy's session cookie or any credentials, and the
browser is never told anything that reaches beyond the instance (a wider service worker scope, cookies outside its
prefix, a redirect off the server).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx

from suanli.control.errors import ServiceError
from suanli.control.workloads import proxy

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "trailers", "transfer-encoding", "upgrade", "host"})  # fmt: skip
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class BadGateway(ServiceError):
    """The instance's service answered something the proxy will not pass on, or broke off."""

    status = 502


def raw_target(path: bytes, query: bytes) -> bytes:
    path = path if path.startswith(b"/") else b"/" + path
    return path + (b"?" + query if query else b"")


def ours(name: str) -> bool:
    """A cookie of this server: the proxy's session and the web console's (`suanli_session`, its CSRF, org and
    language cookies; `__Host-` prefixed over HTTPS). Without `proxy_url` the console shares the instance's host,
    so the browser sends the console's Path=/ cookies with every request for `/i/<id>/` too."""
    return name.strip().removeprefix("__Host-").startswith("suanli_")


def strip_cookie(header: str) -> str:
    """The Cookie header without this server's own cookies (`ours`): the instance never sees a session of the
    proxy's or of the console's. Split by hand: a cookie parser gives up on a header with one malformed pair, which
    the instance itself can plant."""
    parts = [p.strip() for p in header.split(";")]
    return "; ".join(p for p in parts if p and not ours(p.split("=", 1)[0]))


def cross_site(headers: Any, method: str) -> bool:
    """A state-changing request another site made the browser send (the session cookie is SameSite=Strict, so
    this is defence in depth), or a WebSocket opened from another origin."""
    site = headers.get("sec-fetch-site")
    if method not in SAFE_METHODS and site not in (None, "same-origin", "none"):
        return True
    origin = headers.get("origin")
    if origin and method not in SAFE_METHODS:
        return urlsplit(origin).netloc.lower() != (headers.get("host") or "").lower()
    return False


def upstream_headers(request_headers: Any, up: proxy.Upstream, client: str, scheme: str, prefix: str,
                     body: bool) -> dict[str, str]:  # fmt: skip
    """What the instance is told. Never: the proxy's session cookie, an Authorization header (a reverse proxy's
    or another service's credentials), hop-by-hop headers; a body's length only when a body goes with it."""
    out: dict[str, str] = {}
    for k, v in request_headers.items():
        lk = k.lower()
        if lk in HOP_BY_HOP or lk.startswith("sec-websocket") or lk == "authorization":
            continue
        if not body and lk == "content-length":
            continue
        out[lk] = strip_cookie(v) if lk == "cookie" else v
    out["host"] = request_headers.get("host", "localhost")
    if up.socket is not None:
        out["authorization"] = f"token {up.token}"
    out["x-forwarded-for"] = client
    out["x-forwarded-proto"] = scheme
    out["x-forwarded-host"] = out["host"]
    out["x-forwarded-prefix"] = prefix
    return out


def _cookie(value: str, scope: str) -> str | None:
    """An upstream's Set-Cookie, confined to the instance: none named like this server's own (`ours`), no Domain,
    and a Path inside `scope` (a service at / that sets Path=/ means its own prefix)."""
    pair, *attrs = value.split(";")
    if ours(pair.split("=", 1)[0]):
        return None
    kept = []
    for a in attrs:
        key = a.split("=", 1)[0].strip().lower()
        if key == "domain":
            continue
        if key == "path":
            path = a.split("=", 1)[1].strip() if "=" in a else "/"
            if not path.startswith(scope):
                path = scope + path.lstrip("/")
            kept.append(f" Path={path}")
            continue
        kept.append(a)
    if not any(a.strip().lower().startswith("path=") for a in kept):
        kept.append(f" Path={scope}")
    return ";".join([pair, *kept])


def downstream_headers(headers: httpx.Headers, prefix: str, scope: str, host: str,
                       rewrite_location: bool) -> list[tuple[bytes, bytes]]:  # fmt: skip
    """What the browser is told. A tenant's service answers on the server's origin, so nothing may reach beyond
    the instance: no service worker scope wider than its script's, cookies confined (`_cookie`), no redirect off
    this server."""
    out = []
    for k, raw in headers.raw:  # the bytes as sent: a value in UTF-8 passes as it came, as any proxy passes it
        lk = k.decode("latin-1").lower()
        if lk in HOP_BY_HOP or lk == "service-worker-allowed":
            continue
        v = raw.decode("latin-1")
        if lk == "set-cookie":
            confined = _cookie(v, scope)
            if confined is None:
                continue
            v = confined
        if lk == "location":
            if not _stays_here(v, host):
                raise BadGateway("the service redirected off this server")
            if rewrite_location and v.startswith("/"):
                v = prefix + v  # a service at / that redirects to /x means /i/<id>/port/N/x
        out.append((lk.encode("latin-1"), v.encode("latin-1")))
    return out


def _stays_here(location: str, host: str) -> bool:
    """Whether a redirect stays on this server, read as a browser reads it: a browser takes `\\` for `/` and drops
    control characters and spaces, and `https:/x` or `https:x` to another host is `https://x`. So: no backslash or
    control character or space at all; a path that does not begin `//`; or a URL written whole (`scheme://`) to this
    very host."""
    if any(c == "\\" or ord(c) <= 0x20 or ord(c) == 0x7F for c in location):
        return False
    target = urlsplit(location)
    if target.scheme or ":" in location.split("/", 1)[0]:
        return location.startswith(f"{target.scheme}://") and target.netloc.lower() == host.lower() != ""
    return not location.startswith("//")

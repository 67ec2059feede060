"""What the account and admin commands share: which server, which token, saved logins, and API errors.

Logins are saved per server URL in `SUANLI_HOME/credentials.json` (mode 0600: the file holds bearer tokens):
`{"http://127.0.0.1:8000": {"token": "sl_…", "email": "me@example.com"}}`. `--server` (or SUANLI_SERVER) picks
the server on every command; SUANLI_TOKEN, when set, is used instead of the saved token.

Exit codes: 2 for bad input and for requests the server refused (4xx: not logged in, not found, invalid …);
1 when the server cannot be reached or fails (5xx).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

from suanli.cli.common import EXIT_BAD_INPUT, fail, one_line

if TYPE_CHECKING:  # the client (httpx) is imported when a command runs, not on every `suanli` start
    from suanli.client import ApiError, Client

EXIT_UNAVAILABLE = 1
TOKEN_ENV = "SUANLI_TOKEN"
HOME_ENV = "SUANLI_HOME"
FILE = "credentials.json"

ServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server",
        envvar="SUANLI_SERVER",
        metavar="URL",
        help="suanli server URL (default: SUANLI_SERVER, else http://127.0.0.1:8000).",
        show_envvar=False,
    ),
]
PasswordStdinOpt = Annotated[
    bool, typer.Option("--password-stdin", help="Read the password from the first line of stdin (for scripts).")
]


def home() -> Path:
    """SUANLI_HOME, else the server's default data directory."""
    env = os.environ.get(HOME_ENV)
    if env:
        return Path(env).expanduser()
    from suanli.control.settings import default_home

    return default_home()


def path() -> Path:
    return home() / FILE


def load_all() -> dict[str, dict[str, str]]:
    p = path()
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    except OSError as e:
        fail(f"cannot read saved credentials {p}: {e}; delete the file and log in again")
    with os.fdopen(fd, encoding="utf-8") as f:
        _private(p, os.fstat(f.fileno()), "file", f.fileno())
        try:
            doc = json.loads(f.read())
        except (OSError, ValueError) as e:
            fail(f"cannot read saved credentials {p}: {e}; delete the file and log in again")
    return doc if isinstance(doc, dict) else {}


def _private(p: Path, st: os.stat_result, what: str, fd: int | None = None) -> None:
    """A credentials file or directory no other user may write (whoever can write there can swap in their own token,
    or plant a link the tokens are written through): one of the caller's loses its group and other write bits (a
    umask of 002, Debian's default for users, makes directories group-writable); another user's is refused, as
    ssh refuses a loose ~/.ssh."""
    if st.st_uid not in (os.geteuid(), 0) or (st.st_mode & 0o022 and st.st_uid != os.geteuid()):
        fail(f"{p}: this {what} holds your tokens, but another user may write it (owner uid {st.st_uid}, mode "
             f"{oct(st.st_mode & 0o777)}); make it yours and not writable by others (chmod go-w), or set {HOME_ENV}")  # fmt: skip
    if st.st_mode & 0o022:
        mode = stat.S_IMODE(st.st_mode) & ~0o022
        if fd is not None:
            os.fchmod(fd, mode)
        else:
            os.chmod(p, mode)


def _write(doc: dict[str, dict[str, str]]) -> None:
    """Replace the file atomically; it is created 0600 (under a new name no one else can have planted) and never
    readable by others, even for a moment."""
    p = path()
    p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _private(p.parent, os.stat(p.parent), "directory")
    fd, name = tempfile.mkstemp(dir=p.parent, prefix=f".{FILE}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)
            json.dump(doc, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save(server: str, token: str, email: str) -> None:
    doc = load_all()
    doc[server] = {"token": token, "email": email}
    _write(doc)


def forget(server: str) -> bool:
    """Drop the saved login for `server`; whether there was one."""
    doc = load_all()
    if server not in doc:
        return False
    del doc[server]
    _write(doc)
    return True


def saved(server: str) -> dict[str, str]:
    entry = load_all().get(server)
    return entry if isinstance(entry, dict) else {}


def token_for(server: str) -> str | None:
    return os.environ.get(TOKEN_ENV) or saved(server).get("token") or None


def resolve(server: str | None) -> str:
    from suanli.client import normalise_server

    return normalise_server(server)


# ---- errors ---------------------------------------------------------------------------------------------------
def api_fail(e: ApiError) -> NoReturn:
    """One line on stderr; exit 1 when the server is unreachable or broken, 2 when it refused the request."""
    typer.echo(f"error: {one_line(e.message)}", err=True)
    raise typer.Exit(EXIT_UNAVAILABLE if e.status == 0 or e.status >= 500 else EXIT_BAD_INPUT)


@contextmanager
def api(server: str | None, *, auth: bool = True) -> Iterator[Client]:
    """A client for the chosen server with the saved (or SUANLI_TOKEN) login; API errors become one-line exits."""
    from suanli.client import ApiError, Client

    url = resolve(server)
    token = token_for(url)
    if auth and not token:
        fail(f"not logged in to {url}: run 'suanli login --email EMAIL' (or 'suanli signup'), or set {TOKEN_ENV}")
    try:
        with Client(url, token) as c:
            yield c
    except ApiError as e:
        api_fail(e)


def read_password(stdin: bool, *, confirm: bool, prompt: str = "Password", flag: str = "--password-stdin") -> str:
    """From stdin's next line (--password-stdin), else a hidden prompt (twice for a new password)."""
    if stdin:
        line = sys.stdin.readline()
        password = line[:-1] if line.endswith("\n") else line
        if not password:
            fail(f'{flag}: stdin is empty; pipe the password, e.g. printf %s "$PW" | suanli …')
        return password.removesuffix("\r")
    return str(typer.prompt(prompt, hide_input=True, confirmation_prompt=confirm))


T = TypeVar("T")


def with_password(make: Callable[[str | None], T], password_stdin: bool) -> T:
    """`make(password)`: the password from stdin when asked (--password-stdin); else none, and where the server
    wants it (403 naming `password`: what is made would outlive this login), asked for on a terminal, once."""
    from suanli.client import ApiError

    password = read_password(True, confirm=False) if password_stdin else None
    try:
        return make(password)
    except ApiError as e:
        if e.status != 403 or not e.message.startswith("password:") or password is not None:
            raise
        if not sys.stdin.isatty():
            fail(f"{e.message} (pipe it with --password-stdin)")
        return make(read_password(False, confirm=False))


# ---- parsing and formatting -----------------------------------------------------------------------------------
def parse_amount(text: str, what: str = "AMOUNT") -> Decimal:
    try:
        value = Decimal(text.strip().replace(",", "").replace("_", ""))
    except InvalidOperation:
        fail(f"invalid {what} {text!r}: give an amount such as 100 or 12.50")
    if not value.is_finite() or value < 0:
        fail(f"invalid {what} {text!r}: give a non-negative amount such as 100 or 12.50")
    return value


def jsonable(obj: Any) -> Any:
    """A client result as JSON (money as strings)."""
    from suanli.client import jsonable as convert

    return convert(obj)


def money(value: Decimal | str | None) -> str:
    """Two decimals with thousands separators; '-' for no price."""
    if value is None:
        return "-"
    return f"{Decimal(value):,.2f}"


def unit_price(value: Decimal | str | None) -> str:
    """A price per unit exactly, with at least two decimals: 0.10, 0.025; '-' for none."""
    if value is None:
        return "-"
    d = Decimal(value)
    return f"{d:,.2f}" if d == round(d, 2) else f"{d.normalize():,f}"


def when(value: Any) -> str:
    """A timestamp to the second, in UTC as the server gives it; '-' for none."""
    if value is None:
        return "-"
    text = value.isoformat() if hasattr(value, "isoformat") else str(value)
    return text.replace("T", " ")[:19]


def org_id(c: Client, ref: str | None) -> str | None:
    """An org id from an id or the name of one of the caller's orgs (None: the personal org)."""
    if ref is None or ref.startswith("org_"):
        return ref
    for o in c.orgs():
        if o.name == ref or o.name == ref.strip().lower():
            return o.id
    fail(f"--org: you are not a member of an organisation named {ref!r} (see 'suanli orgs list')")

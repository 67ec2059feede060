"""A copy out of a volume never writes outside its destination, whatever links a workload planted in the volume.

A job (a teammate's, or a library a tenant's own job ran) can make any tree in a volume it mounts writable. Before
this, the SDK unpacked a copy with tarfile's "data" filter, which CPython before 3.11.13 / 3.12.11 lets through a
link whose path grows past PATH_MAX while it is checked (CVE-2025-4517): such a link looks inside the copy to the
check and points outside it on disk, and the next copy into the same place wrote through it onto the victim's own
machine. Both ways out (HTTP, and the same-host socket) are checked here against a real server.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from suanli.client import Client
from suanli.client.tree_writer import Refused, TreeWriter, stays_inside
from tests.control_plane import live_server, signup

COMP = "d" * 247  # nested 16 deep: 3,968 characters
STEPS = "abcdefghijklmnop"
LONG = "l" * 100  # under PATH_MAX below a relative destination, past it below the absolute one the check resolves


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("download-links")
    with live_server(tmp / "home", f"sqlite+pysqlite:///{tmp / 'db'}") as s:
        with httpx.Client(base_url=s.url) as http:
            a = signup(http, "victim@example.com")
        with Client(s.url, a.token) as c:
            c.volume_create("v", "64Mi")
            yield s, c


def _data(s: Any) -> Path:
    return next(s.home.glob("volumes/*/vols/*/data"))


def plant_escape(top: Path, outside: str) -> None:
    """What a hostile job writes into the volume under `top`: the published PoC's chain of long directories and
    links, and `escape`, a link that the data filter's check resolves inside the copy and the kernel outside it."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for step in STEPS:  # top/COMP/COMP/... with a link `step` → COMP beside each COMP
            os.mkdir(COMP, dir_fd=fd)
            os.symlink(COMP, step, dir_fd=fd)
            nxt = os.open(COMP, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.symlink("/".join([".."] * len(STEPS)), LONG, dir_fd=fd)  # back up to top, on disk
    finally:
        os.close(fd)
    os.symlink("/".join([*STEPS, LONG]) + "/../" + outside, top / "escape")


def test_a_planted_link_chain_never_lets_a_later_copy_write_outside_it(
    srv: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`suanli volumes cp v:/m ./models`, twice, as a user re-syncs: the first copy makes the links, the second
    writes `escape/pwned` through them. The destination is relative, as typed: the kernel then creates the long
    link from a path under PATH_MAX, while the filter resolved its absolute path, past PATH_MAX, and gave up."""
    s, c = srv
    victim = tmp_path / "laptop"
    victim.mkdir()
    monkeypatch.chdir(victim)
    dest = Path("models")
    for same_host in (False, True):
        data = _data(s)
        shutil.rmtree(data / "m", ignore_errors=True)
        plant_escape(data / "m", "outside")
        shutil.rmtree(dest, ignore_errors=True)
        (victim / "outside").mkdir(exist_ok=True)
        got = c.volume_download("v", "m", dest, same_host=same_host)
        assert got.via == ("same-host" if same_host else "http")
        # the job swaps its link for a directory of the same name; the victim copies again into the same place
        os.unlink(data / "m" / "escape")
        (data / "m" / "escape").mkdir()
        (data / "m" / "escape" / "pwned").write_text("written by another tenant's job\n")
        c.volume_download("v", "m", dest, same_host=same_host)
        assert os.listdir(victim / "outside") == [], f"same_host={same_host}: a file landed outside the copy"
        assert not os.path.islink(dest / "escape")  # the link that leaves was never made
        assert (dest / "escape" / "pwned").read_text() == "written by another tenant's job\n"
        assert os.readlink(dest / "a") == COMP  # the chain's own links stay inside and were made


def test_links_that_stay_inside_the_copy_still_arrive_as_links(srv: Any, tmp_path: Path) -> None:
    """A tree with ordinary links (a virtualenv's python → python3, a checkpoint's latest → step-100) copies whole;
    a link to an absolute path or up out of the copy is left out, over both ways."""
    s, c = srv
    data = _data(s)
    shutil.rmtree(data / "venv", ignore_errors=True)
    (data / "venv" / "bin").mkdir(parents=True)
    (data / "venv" / "bin" / "python3").write_text("#!/bin/sh\n")
    os.chmod(data / "venv" / "bin" / "python3", 0o755)
    os.symlink("python3", data / "venv" / "bin" / "python")
    (data / "venv" / "ckpt" / "step-100").mkdir(parents=True)
    (data / "venv" / "ckpt" / "step-100" / "w.bin").write_bytes(b"w" * 10)
    os.symlink("step-100", data / "venv" / "ckpt" / "latest")
    os.symlink("../bin/python3", data / "venv" / "ckpt" / "py")
    os.symlink("/etc/passwd", data / "venv" / "abs")
    os.symlink("../../..", data / "venv" / "bin" / "up")
    os.symlink("ckpt/latest/../..", data / "venv" / "through")  # `..` after a link: where it lands depends on it
    for same_host in (False, True):
        out = tmp_path / f"out-{same_host}"
        c.volume_download("v", "venv", out, same_host=same_host)
        assert os.readlink(out / "bin" / "python") == "python3"
        assert (out / "bin" / "python").read_text() == "#!/bin/sh\n"
        assert os.access(out / "bin" / "python3", os.X_OK)
        assert (out / "ckpt" / "latest" / "w.bin").read_bytes() == b"w" * 10
        assert os.readlink(out / "ckpt" / "py") == "../bin/python3"
        for refused in ("abs", "bin/up", "through"):
            assert not os.path.lexists(out / refused), (same_host, refused)


@pytest.mark.parametrize(
    ("where", "target", "inside"),
    [
        ("a/link", "b", True),
        ("a/link", "../b", True),
        ("a/link", "./../b/./c", True),
        ("a/link", "../../b", False),  # above the copy
        ("link", "../x", False),
        ("a/link", "b/../c", False),  # `..` after a name: lands wherever the link `b` leads
        ("a/link", "/etc/passwd", False),
        ("a/link", "", False),
        ("a/link", "b\0c", False),
    ],
)
def test_a_link_is_made_only_when_it_stays_inside_whatever_the_others_are(
    where: str, target: str, inside: bool
) -> None:
    assert stays_inside(tuple(where.split("/")), target) is inside


def test_nothing_is_written_through_a_link_already_at_the_destination(tmp_path: Path) -> None:
    """A link the destination already holds (a last copy's, or the user's own) is replaced by a file of that name,
    never written through, and a directory's way through it stops the copy naming it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text("mine")
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(outside, dest / "dir")
    os.symlink(outside / "f", dest / "f")
    with TreeWriter(dest) as tree:
        with os.fdopen(tree.create("f", 0o644), "wb") as out:
            out.write(b"copied")
        with pytest.raises(Refused, match="dir is a link or a file here"):
            tree.create("dir/g", 0o644)
        with pytest.raises(Refused, match="outside the copy"):
            tree.mkdir("x/../../y")
    assert (outside / "f").read_text() == "mine" and os.listdir(outside) == ["f"]
    assert not os.path.islink(dest / "f") and (dest / "f").read_text() == "copied"
    assert oct(os.stat(dest / "f").st_mode & 0o777) == oct(0o644)

"""Issue: any tenant could fill the disk for free (a 0.87 MiB .tar.gz unpacked to 900 MiB, kept after the job),
and absolute archive paths were rewritten, not refused as the docs say. Attacks on the unpacking of an uploaded
workdir, first: bombs of bytes and of entries (bounded while the stream is read, not by the headers' word),
paths out of the tree, links, sparse files, devices, and headers that would make the reader hold a huge name in
memory. A refused archive leaves nothing behind."""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
import time
import tracemalloc
from pathlib import Path

import pytest

from suanli.storage import workdirs
from suanli.storage.workdirs import ArchiveError, Limits, TooLarge
from suanli.workdir_upload import pack_workdir

KiB, MiB = 1 << 10, 1 << 20


def tar_gz(*members: tuple[tarfile.TarInfo, bytes | None], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def entry(
    name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, **attrs: object
) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, len(data) if kind == tarfile.REGTYPE else 0
    for k, v in attrs.items():
        setattr(info, k, v)
    return info, data


def unpack(data: bytes, dest: Path, max_bytes: int = 16 * MiB, entries: int = 1000) -> workdirs.Unpacked:
    return workdirs.unpack(data, dest, Limits(max_bytes, entries))


def refused(data: bytes, tmp_path: Path, match: str, **limits: int) -> ArchiveError:
    dest = tmp_path / "dest"
    with pytest.raises(ArchiveError, match=match) as e:
        unpack(data, dest, **limits)
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a refused archive leaves nothing behind"
    return e.value


# ---- bombs ------------------------------------------------------------------------------------------------------
def test_a_gzip_bomb_is_refused_while_streaming(tmp_path: Path) -> None:
    zeros = bytes(64 * MiB)
    bomb = tar_gz(entry("a.bin", zeros))
    assert len(bomb) < 100 * KiB  # 64 MiB of zeros in ~64 KiB: the 900 MiB from 0.87 MiB
    err = refused(bomb, tmp_path, r"'a.bin': unpacks to more than 1048576 bytes", max_bytes=MiB)
    assert isinstance(err, TooLarge) and err.what == "bytes" and err.limit == MiB


def test_many_small_files_add_up_while_streaming(tmp_path: Path) -> None:
    """No one header is over the limit; their sum is, and the refusal comes at the entry that crosses it."""
    files = [entry(f"part-{i:03d}.bin", bytes(100 * KiB)) for i in range(20)]
    err = refused(tar_gz(*files), tmp_path, r"'part-010.bin': unpacks to more than", max_bytes=MiB + 8 * KiB)
    assert isinstance(err, TooLarge) and err.what == "bytes"


def test_a_many_files_bomb_is_refused_at_the_first_entry_over(tmp_path: Path) -> None:
    bomb = tar_gz(*(entry(f"f{i}") for i in range(3000)))
    t0 = time.perf_counter()
    err = refused(bomb, tmp_path, r"more than 100 files and directories", entries=100)
    assert isinstance(err, TooLarge) and err.what == "entries"
    assert time.perf_counter() - t0 < 2.0


def test_empty_files_and_directories_count_a_block_each(tmp_path: Path) -> None:
    """What the disk holds: every entry takes at least a 4 KiB block, so a million empty files are not free."""
    got = unpack(tar_gz(entry("d", kind=tarfile.DIRTYPE), entry("d/empty"), entry("one", b"x"),
                        entry("two", bytes(4097))), tmp_path / "ok")  # fmt: skip
    assert (got.bytes, got.files) == (4096 + 4096 + 4096 + 8192, 4)
    refused(tar_gz(*(entry(f"e{i}") for i in range(300))), tmp_path / "x", r"unpacks to more than", max_bytes=MiB)


def test_a_long_name_header_is_not_read_into_memory(tmp_path: Path) -> None:
    """A GNU long-name (or pax) header's data is read whole by tarfile: 32 MiB of it is refused unread."""
    for kind in (tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE):
        info = tarfile.TarInfo("././@LongLink")
        info.type, info.size = kind, 32 * MiB
        raw = info.tobuf(tarfile.GNU_FORMAT) + bytes(32 * MiB) + entry("x")[0].tobuf() + bytes(1024)
        bomb = gzip.compress(raw, 1)
        tracemalloc.start()
        try:
            refused(bomb, tmp_path, r"header of 33554432 bytes")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 4 * MiB, f"{kind!r}: {peak} bytes held"


def test_a_header_that_lies_about_its_size_is_refused(tmp_path: Path) -> None:
    """A pax `size` of 1 TB over 5 bytes of data: refused by its claim, and the stream could not back it."""
    info, _ = entry("liar.bin", b"hello")
    info.pax_headers = {"size": str(1 << 40)}
    raw = tar_gz((info, b"hello"))
    refused(raw, tmp_path, r"'liar.bin': unpacks to more than")
    refused(raw, tmp_path, r"'liar.bin'", max_bytes=1 << 50)  # allowed by the limit: the data is not there


# ---- paths out of the tree --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["/etc/passwd", "/abs/dir/file.txt", "//twice"])
def test_absolute_paths_are_refused_naming_the_entry_not_rewritten(tmp_path: Path, name: str) -> None:
    refused(tar_gz(entry("ok.txt", b"1"), entry(name, b"x")), tmp_path, f"{name!r}: an absolute path")


@pytest.mark.parametrize("name", ["../escape.txt", "a/../../escape.txt", "a/..", "..", "./../x"])
def test_dot_dot_is_refused(tmp_path: Path, name: str) -> None:
    refused(tar_gz(entry(name, b"x")), tmp_path, f"{name!r}: '..'")


def test_links_are_refused_inside_or_out(tmp_path: Path) -> None:
    for kind, target in [(tarfile.SYMTYPE, "/etc"), (tarfile.SYMTYPE, "../.."), (tarfile.SYMTYPE, "ok.txt"),
                         (tarfile.LNKTYPE, "/etc/passwd"), (tarfile.LNKTYPE, "ok.txt")]:  # fmt: skip
        raw = tar_gz(entry("ok.txt", b"1"), entry("link", kind=kind, linkname=target), entry("link/passwd", b"x"))
        what = "a symbolic link" if kind == tarfile.SYMTYPE else "a hard link"
        refused(raw, tmp_path, f"'link': {what}")


def test_a_symlink_planted_in_the_destination_is_not_followed(tmp_path: Path) -> None:
    """Unpacking goes into a fresh directory: nothing that was there (or a link the tenant made) is reused."""
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "box" / "workdir"
    dest.parent.mkdir()
    (dest.parent / "workdir.partial").symlink_to(outside)
    unpack(tar_gz(entry("f.txt", b"mine")), dest)
    assert (dest / "f.txt").read_bytes() == b"mine" and list(outside.iterdir()) == []
    with pytest.raises(ArchiveError, match="exists"):
        unpack(tar_gz(entry("g.txt", b"x")), dest)


@pytest.mark.parametrize(
    ("kind", "what"),
    [(tarfile.CHRTYPE, "a character device"), (tarfile.BLKTYPE, "a block device"), (tarfile.FIFOTYPE, "a FIFO")],
)
def test_devices_and_fifos_are_refused(tmp_path: Path, kind: bytes, what: str) -> None:
    refused(tar_gz(entry("dev/node", kind=kind, devmajor=1, devminor=3)), tmp_path, f"'dev/node': {what}")


def test_sparse_files_are_refused_in_either_encoding(tmp_path: Path) -> None:
    """GNU's old sparse type and pax's GNU.sparse.* keys both make a small archive claim a huge file."""
    info = tarfile.TarInfo("holes.bin")
    info.type, info.size = tarfile.GNUTYPE_SPARSE, 0
    refused(tar_gz((info, None), fmt=tarfile.GNU_FORMAT), tmp_path, r"'holes.bin': a sparse file")
    pax, _ = entry("holes.bin", b"x" * 10)
    pax.pax_headers = {"GNU.sparse.map": "0,10", "GNU.sparse.size": str(1 << 40), "GNU.sparse.name": "holes.bin"}
    refused(tar_gz((pax, b"x" * 10)), tmp_path, r"'holes.bin': a sparse file", max_bytes=1 << 50)


def test_an_entry_twice_or_under_a_file_is_refused(tmp_path: Path) -> None:
    refused(tar_gz(entry("a.txt", b"1"), entry("a.txt", b"2")), tmp_path, r"'a.txt': appears twice")
    refused(tar_gz(entry("a", b"1"), entry("a/b.txt", b"2")), tmp_path, r"'a/b.txt': .*'a' is a file")
    refused(tar_gz(entry("d", b"1"), entry("d", kind=tarfile.DIRTYPE)), tmp_path, r"'d': appears twice")


def test_names_the_filesystem_cannot_hold_are_422_not_500(tmp_path: Path) -> None:
    refused(tar_gz(entry("x" * 300, b"1")), tmp_path, r"'x{20}.*': cannot be created")


def test_not_an_archive(tmp_path: Path) -> None:
    refused(b"not gzip at all", tmp_path, r"not a valid \.tar\.gz")
    refused(gzip.compress(b"\x01" * 4096), tmp_path, r"not a valid \.tar\.gz")
    refused(tar_gz(entry("a.txt", b"1"))[:-30], tmp_path, r"not a valid \.tar\.gz")


# ---- what is kept -----------------------------------------------------------------------------------------------
def test_a_good_archive_unpacks_with_safe_modes(tmp_path: Path) -> None:
    raw = tar_gz(entry("./run.sh", b"#!/bin/sh\n", mode=0o4755), entry("pkg/", kind=tarfile.DIRTYPE, mode=0o777),
                 entry("pkg/mod.py", b"x = 1\n", mode=0o666), entry("./", kind=tarfile.DIRTYPE))  # fmt: skip
    got = unpack(raw, tmp_path / "w")
    w = tmp_path / "w"
    assert (w / "run.sh").read_bytes() == b"#!/bin/sh\n" and (w / "pkg" / "mod.py").read_bytes() == b"x = 1\n"
    assert stat.S_IMODE(os.lstat(w / "run.sh").st_mode) == 0o755, "setuid dropped"
    assert stat.S_IMODE(os.lstat(w / "pkg" / "mod.py").st_mode) == 0o644, "no group or other write"
    assert stat.S_IMODE(os.lstat(w / "pkg").st_mode) == 0o755
    assert got.files == 3 and got.bytes == 3 * 4096


def test_the_client_packs_what_the_server_accepts(tmp_path: Path) -> None:
    """Hard-linked files go up as plain files (the server refuses links); a symlink is refused by the client,
    naming it, before anything is sent."""
    root = tmp_path / "proj"
    (root / "d").mkdir(parents=True)
    (root / "a.txt").write_text("same")
    os.link(root / "a.txt", root / "d" / "b.txt")
    got = unpack(pack_workdir(root), tmp_path / "w")
    assert (tmp_path / "w" / "d" / "b.txt").read_text() == "same" and got.files == 3
    (root / "latest").symlink_to("a.txt")
    with pytest.raises(ValueError, match=r"latest is a symbolic link"):
        pack_workdir(root)

"""The hub's storage adapter: the Hugging Face cache layout as huggingface_hub itself reads it, stored once and
read-only, checksums, an unreachable Hub said in words, and repository ids that would escape the layout."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from suanli.storage.hub import HubError, HubStore, check_repo_id
from tests.hub_fixtures import make_dataset, need


def _tree(src: Path) -> Path:
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text('{"model_type": "llama"}')
    (src / "weights.bin").write_bytes(b"\x00\x01" * 5000)
    (src / "sub" / "copy.bin").write_bytes(b"\x00\x01" * 5000)  # the same content: one blob
    (src / "README.md").write_text("---\nlicense: MIT\n---\n# x\n")
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return src


def test_a_directory_is_stored_once_read_only_in_the_layout_huggingface_hub_reads(tmp_path: Path) -> None:
    need("huggingface_hub")
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache

    store = HubStore(tmp_path / "hub")
    s = store.add_dir("model", "acme/tiny", _tree(tmp_path / "src"))
    assert s.folder == "hub/models--acme--tiny" and len(s.revision) == 40
    assert [f.path for f in s.files] == ["README.md", "config.json", "sub/copy.bin", "weights.bin"]  # .git left out
    assert s.license == "mit"  # from the card
    assert s.size_bytes == sum((tmp_path / "src" / f.path).stat().st_size for f in s.files)
    for f in s.files:
        assert f.sha256 == hashlib.sha256((tmp_path / "src" / f.path).read_bytes()).hexdigest()
    # huggingface_hub's own readers find it: the scan, and a file by repo id at revision main
    (repo,) = scan_cache_dir(tmp_path / "hub" / "hub").repos
    assert (repo.repo_id, repo.repo_type, [r.commit_hash for r in repo.revisions]) == ("acme/tiny", "model",
                                                                                       [s.revision])  # fmt: skip
    found = try_to_load_from_cache("acme/tiny", "sub/copy.bin", cache_dir=tmp_path / "hub" / "hub")
    assert isinstance(found, str) and Path(found).read_bytes() == b"\x00\x01" * 5000
    root = tmp_path / "hub" / "hub" / "models--acme--tiny"
    blobs = sorted(p.name for p in (root / "blobs").iterdir())
    assert len(blobs) == 3  # four files, two identical: stored once
    link = root / "snapshots" / s.revision / "sub" / "copy.bin"
    assert link.is_symlink() and not os.path.isabs(os.readlink(link))  # relative: still resolves when bound elsewhere
    for p in (root / "blobs").iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o444
    assert stat.S_IMODE(root.stat().st_mode) == 0o555
    assert store.verify(s.folder, s.revision, s.files) == []
    # the same content makes the same revision; a second add of the repository is refused
    again = HubStore(tmp_path / "other").add_dir("model", "acme/tiny", tmp_path / "src")
    assert again.revision == s.revision
    with pytest.raises(HubError, match="already in the hub"):
        store.add_dir("model", "acme/tiny", tmp_path / "src")
    store.remove(s.folder)
    assert not root.exists()


def test_a_changed_file_fails_verification(tmp_path: Path) -> None:
    need("huggingface_hub")
    store = HubStore(tmp_path / "hub")
    s = store.add_dir("model", "acme/tiny", _tree(tmp_path / "src"))
    blob = next(p for p in (tmp_path / "hub" / "hub" / "models--acme--tiny" / "blobs").iterdir()
                if p.stat().st_size == 10000)  # fmt: skip
    blob.chmod(0o644)
    blob.write_bytes(b"\x00\x02" * 5000)  # same size, other content
    assert store.verify(s.folder, s.revision, s.files) == ["sub/copy.bin", "weights.bin"]


def test_an_unreachable_hugging_face_hub_is_said_in_words_and_leaves_nothing(tmp_path: Path) -> None:
    need("huggingface_hub")
    store = HubStore(tmp_path / "hub")
    with pytest.raises(HubError, match=r"cannot fetch hf://acme/tiny@main from the Hugging Face Hub .*--from DIR"):
        store.add_hf("model", "acme/tiny", endpoint="http://127.0.0.1:9")  # nothing listens on port 9
    assert not (tmp_path / "hub" / "hub").exists()
    assert list((tmp_path / "hub" / ".staging").iterdir()) == []


@pytest.mark.parametrize(
    "repo_id",
    ["../etc", "acme/../x", "acme/..", "acme", "acme/a/b", "/abs/x", "acme--x/y", "acme/x--y", "acme/.hidden",
     "acme/x\x00", "a" * 97 + "/x", "acme/x/", ""],
)  # fmt: skip
def test_repository_ids_that_would_leave_the_layout_are_refused(tmp_path: Path, repo_id: str) -> None:
    with pytest.raises(HubError, match="must be ORG/NAME"):
        check_repo_id(repo_id)
    with pytest.raises(HubError):
        HubStore(tmp_path / "hub").add_dir("model", repo_id, tmp_path)
    assert not (tmp_path / "hub" / "hub").exists()


def test_a_hub_folder_path_never_leaves_the_hub_directory(tmp_path: Path) -> None:
    store = HubStore(tmp_path / "hub")
    for bad in ("../x", "hub/../../x", "/etc", "hub", "hub/a/b", "other/x", "hub/.."):
        with pytest.raises(HubError):
            store.path(bad)
    assert store.path("hub/models--a--b") == tmp_path / "hub" / "hub" / "models--a--b"


def test_a_dataset_is_prepared_for_load_dataset_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need("datasets")
    store = HubStore(tmp_path / "hub")
    s = store.add_dir("dataset", "acme/Tiny-DS", make_dataset(tmp_path / "src"))
    assert (s.folder, s.prepared, s.license) == ("hub/datasets--acme--Tiny-DS", "datasets/acme___tiny-ds", "cc-by-4.0")
    prepared = tmp_path / "hub" / "datasets" / "acme___tiny-ds"
    assert [p.name for p in prepared.rglob("*.arrow")] == ["tiny-ds-train.arrow"]
    assert not list(prepared.rglob("*.lock"))
    store.remove(s.folder, s.prepared)
    assert not prepared.exists() and not (tmp_path / "hub" / "hub" / "datasets--acme--Tiny-DS").exists()


def test_files_that_are_not_datasets_are_refused_and_leave_nothing(tmp_path: Path) -> None:
    need("datasets")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "notes.bin").write_bytes(b"\xff" * 10)
    store = HubStore(tmp_path / "hub")
    with pytest.raises(HubError, match="datasets cannot prepare acme/junk"):
        store.add_dir("dataset", "acme/junk", tmp_path / "src")
    assert not (tmp_path / "hub" / "hub" / "datasets--acme--junk").exists()
    assert not (tmp_path / "hub" / "datasets").exists() or not list((tmp_path / "hub" / "datasets").iterdir())


def test_a_link_out_of_the_source_directory_is_refused_not_published(tmp_path: Path) -> None:
    # An untrusted repository checked out on the server could carry `secrets -> ~/.ssh/id_rsa`: copying what
    # it points at would publish a host file to every tenant.
    need("huggingface_hub")
    secret = tmp_path / "host-secret"
    secret.write_text("operator's private key")
    src = _tree(tmp_path / "src")
    (src / "tokenizer.json").symlink_to(secret)
    store = HubStore(tmp_path / "hub")
    with pytest.raises(HubError, match=r"tokenizer\.json: a link out of the directory"):
        store.add_dir("model", "acme/tiny", src)
    assert not (tmp_path / "hub" / "hub" / "models--acme--tiny").exists()
    (src / "tokenizer.json").unlink()
    (src / "linked-dir").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(HubError, match="linked-dir: a link to a directory"):
        store.add_dir("model", "acme/tiny", src)


def test_a_snapshot_of_another_hugging_face_cache_is_taken_through_its_links(tmp_path: Path) -> None:
    need("huggingface_hub")
    first = HubStore(tmp_path / "one").add_dir("model", "acme/tiny", _tree(tmp_path / "src"))
    snap = tmp_path / "one" / "hub" / "models--acme--tiny" / "snapshots" / first.revision
    again = HubStore(tmp_path / "two").add_dir("model", "acme/tiny", snap)  # links into ../../blobs
    assert again.files == first.files and again.revision == first.revision

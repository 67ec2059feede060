"""The pure rules of volumes: names, `name@N`, sizes, paths inside a volume, mount paths, the spec's `volumes:`,
and the diff of two manifests (tables and a property)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from suanli.workloads.spec import SpecError, parse_spec
from suanli.workloads.volumes import Ref, VolumeRuleError, clean_path, diff, parse_ref, parse_size

GOOD_SIZES = [("200Gi", 200 << 30), ("500G", 500 * 10**9), ("1Ti", 1 << 40), ("1048576", 1 << 20), (1 << 20, 1 << 20),
              (" 2 Mi ", 2 << 20)]  # fmt: skip
BAD_SIZES = ["", "-1", "1Ki", "2Pi", "1.5Gi", "Gi", "1e9", "9" * 40, True, None, 1.0, [], "1 Gibibyte"]


@pytest.mark.parametrize(("text", "want"), GOOD_SIZES)
def test_sizes(text: object, want: int) -> None:
    assert parse_size(text) == want


@pytest.mark.parametrize("text", BAD_SIZES)
def test_bad_sizes_are_refused(text: object) -> None:
    with pytest.raises(VolumeRuleError):
        parse_size(text)


def test_refs() -> None:
    assert parse_ref("data") == Ref("data") and parse_ref("data@3") == Ref("data", 3) and str(Ref("d", 2)) == "d@2"
    for bad in ("data@", "data@0", "data@-1", "data@1.5", "data@99999999", "Data", "../x", "a@b@c", "", 7):
        with pytest.raises(VolumeRuleError):
            parse_ref(bad)


@pytest.mark.parametrize(("path", "want"), [("a/b", "a/b"), ("/a//b/", "a/b"), ("./a/./b", "a/b"), ("", "")])
def test_paths_are_normalised(path: str, want: str) -> None:
    assert clean_path(path) == want


@pytest.mark.parametrize("path", ["..", "a/../b", "a\x00b", "a\\b", ".suanli-x", "x/" * 65, "a" * 256, "a" * 1025])
def test_paths_that_leave_or_break_the_volume_are_refused(path: str) -> None:
    with pytest.raises(VolumeRuleError):
        clean_path(path)


@given(st.text(max_size=80))
def test_a_clean_path_never_climbs_out(path: str) -> None:
    try:
        out = clean_path(path)
    except VolumeRuleError:
        return
    assert ".." not in out.split("/") and not out.startswith("/") and "\x00" not in out


def spec(volumes: object) -> dict[str, object]:
    return {"name": "j", "command": "true", "volumes": volumes}


@pytest.mark.parametrize(
    ("volumes", "field"),
    [
        ({"name": "d", "path": "/d"}, "volumes"),
        ([{"name": "d", "path": "/proc/x"}], "volumes.0.path"),
        ([{"name": "d", "path": "/workspace/d"}], "volumes.0.path"),
        ([{"name": "d", "path": "/hub"}], "volumes.0.path"),  # where the hub's models and datasets are mounted
        ([{"name": "d", "path": "/"}], "volumes.0.path"),
        ([{"name": "d", "path": "/a/../etc"}], "volumes.0.path"),
        ([{"name": "d", "path": "/d:ro"}], "volumes.0.path"),
        ([{"name": "D", "path": "/d"}], "volumes.0.name"),
        ([{"name": "d", "path": "/d", "rw": True}], "volumes.0.rw"),
        ([{"name": "d", "path": "/d", "read_only": "yes"}], "volumes.0.read_only"),
        ([{"name": "a", "path": "/d"}, {"name": "b", "path": "/d"}], "volumes"),
        ([{"name": "a", "path": "/d"}, {"name": "b", "path": "/d/e"}], "volumes"),
        ([{"name": f"v{i}", "path": f"/v{i}"} for i in range(17)], "volumes"),
    ],
)
def test_the_specs_volumes_are_checked_naming_the_field(volumes: object, field: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_spec(spec(volumes))
    assert any(err["field"] == field for err in e.value.errors), e.value.errors


def test_a_good_specs_volumes_round_trip() -> None:
    s = parse_spec(spec([{"name": "data", "path": "/data", "read_only": True}, {"name": "ckpt@2", "path": "/mnt/c"}]))
    assert [(m.ref, m.writable) for m in s.volumes] == [(Ref("data"), False), (Ref("ckpt", 2), False)]
    assert parse_spec(s.model_dump(mode="json", exclude_none=True)) == s


def test_diff_of_manifests() -> None:
    a = {"x": ("1", 1), "y": ("2", 1), "z": ("3", 1)}
    b = {"x": ("1", 1), "y": ("9", 1), "w": ("4", 1)}
    d = diff(a, b)
    assert (d.added, d.removed, d.changed) == (("w",), ("z",), ("y",))

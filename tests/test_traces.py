"""Trace readers (one small committed fixture per format), the FORMAT:PATH dispatcher, slicing and synthetic jobs."""

from __future__ import annotations

import gzip
import io
import itertools
import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suanli.sim.slicing import first_n, rebase, scale_load, time_window
from suanli.sim.synthetic import synthetic_jobs
from suanli.sim.workload import TraceJob
from suanli.traces import (
    FORMATS,
    PolluxProfile,
    TraceError,
    open_text_file,
    read_alibaba_openb,
    read_csv,
    read_gavel,
    read_philly,
    read_pollux,
    read_shockwave,
    read_trace,
    read_trace_result,
)
from suanli.traces.gavel import DEFAULT_STEPS_PER_S
from suanli.traces.pollux import REFERENCE_DURATION_S, placement_id, profile_duration

FIX = Path(__file__).parent / "fixtures" / "traces"
GAVEL_TRACE = FIX / "gavel" / "msr" / "seed=0" / "11cb48.trace"

SPECS = {
    "csv": FIX / "generic.csv",
    "philly": FIX / "philly" / "philly_excerpt.csv",
    "alibaba-openb": FIX / "alibaba-openb" / "openb_pod_list_synthetic.csv",
    "pollux": FIX / "pollux" / "workloads" / "workload-1.csv",
    "gavel": GAVEL_TRACE,
    "gavel-physical": FIX / "gavel" / "physical_cluster" / "small_test.trace",
    "tiresias": FIX / "tiresias" / "60_job_excerpt.csv",
    "shockwave": FIX / "shockwave" / "120_job_excerpt.trace",
}
EXPECTED_JOBS = {
    "csv": 6,
    "philly": 30,
    "alibaba-openb": 13,
    "pollux": 29,
    "gavel": 25,
    "gavel-physical": 20,
    "tiresias": 30,
    "shockwave": 30,
}


def _v100(job_type: str, scale: int) -> float:
    table = json.loads((FIX / "gavel" / "simulation_throughputs.json").read_text())["v100"]
    return table[str((job_type, scale))]["null"]


def _lines(text: str) -> list[str]:
    return io.StringIO(text).readlines()


# --- every format -------------------------------------------------------------------------------------


def test_every_format_has_a_fixture() -> None:
    assert set(SPECS) == set(FORMATS)


@pytest.mark.parametrize("fmt", list(SPECS))
def test_fixture_is_sorted_rebased_unique(fmt: str) -> None:
    jobs = read_trace(f"{fmt}:{SPECS[fmt]}")
    assert len(jobs) == EXPECTED_JOBS[fmt]
    assert jobs[0].submit_time_s == 0.0
    assert all(a.submit_time_s <= b.submit_time_s for a, b in itertools.pairwise(jobs))
    assert len({j.job_id for j in jobs}) == len(jobs)
    assert all(j.num_gpus >= 1 and j.duration_s > 0 for j in jobs)


def test_gzip_is_detected_by_content(tmp_path: Path) -> None:
    gz = tmp_path / "philly.csv.gz"
    gz.write_bytes(gzip.compress(SPECS["philly"].read_bytes()))
    assert read_trace(f"philly:{gz}") == read_trace(f"philly:{SPECS['philly']}")
    with open_text_file(gz) as f:
        assert f.readline().startswith("timestamp,duration")


# --- dispatcher ---------------------------------------------------------------------------------------


def test_unknown_format_lists_the_formats() -> None:
    with pytest.raises(TraceError) as e:
        read_trace("parquet:x.parquet")
    assert "unknown trace format 'parquet'" in str(e.value)
    for fmt in FORMATS:
        assert fmt in str(e.value)


def test_spec_without_format_is_rejected() -> None:
    with pytest.raises(TraceError, match="FORMAT:PATH"):
        read_trace("just-a-path.csv")


def test_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot open"):
        read_trace(f"csv:{tmp_path / 'nope.csv'}")


def test_open_text_is_injected() -> None:
    files = {"mem/jobs.csv": "submit_time_s,num_gpus,duration_s\n10,2,5\n4,1,7\n"}
    opened: list[str] = []

    def fake_open(path: str) -> io.StringIO:
        opened.append(path)
        return io.StringIO(files[path])

    jobs = read_trace("csv:mem/jobs.csv", fake_open)
    assert opened == ["mem/jobs.csv"]
    assert [(j.job_id, j.submit_time_s, j.num_gpus) for j in jobs] == [("job-000002", 0.0, 1), ("job-000001", 6.0, 2)]


def test_reader_errors_are_prefixed_with_the_path() -> None:
    def fake_open(path: str) -> io.StringIO:
        return io.StringIO("submit_time_s,num_gpus,duration_s\n0,1,abc\n")

    with pytest.raises(TraceError, match=r"^bad\.csv: line 2: duration_s: "):
        read_trace("csv:bad.csv", fake_open)


# --- generic CSV --------------------------------------------------------------------------------------


def test_generic_fixture_fields() -> None:
    result = read_trace_result(f"csv:{SPECS['csv']}")
    assert result.skipped == {"zero_gpus": 1}
    jobs = {j.job_id: j for j in result.jobs}
    assert [j.job_id for j in result.jobs] == ["train-b", "train-c", "train-a", "sweep-f", "train-e", "infer-d"]
    assert [j.submit_time_s for j in result.jobs] == [0, 0, 90, 150, 210, 270]
    assert jobs["train-b"].gpu_fraction == 0.5 and jobs["train-b"].priority == "spot"
    assert (jobs["train-c"].priority, jobs["train-c"].min_gpus, jobs["train-c"].max_gpus) == ("on-demand", 2, 16)
    assert jobs["train-c"].duration_s == 1800.5 and jobs["train-c"].model == "resnet50"
    assert (jobs["train-a"].priority, jobs["train-a"].gpu_type, jobs["train-a"].tenant) == (
        "reserved",
        "h100",
        "team-a",
    )
    assert (jobs["infer-d"].tenant, jobs["infer-d"].priority, jobs["infer-d"].gpu_type) == ("default", "spot", None)
    assert jobs["train-e"].priority == "reserved" and jobs["sweep-f"].priority == "spot"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("submit_time_s,num_gpus,duration_s\n0,1,5\n0,1,abc\n", "line 3: duration_s: must be a number >= 0, got 'abc'"),
        ("submit_time_s,num_gpus,duration_s\n-1,1,5\n", "line 2: submit_time_s: must be a number >= 0, got '-1'"),
        ("submit_time_s,num_gpus,duration_s\n0,1.5,5\n", "line 2: num_gpus: must be an integer >= 0, got '1.5'"),
        ("submit_time_s,num_gpus,duration_s\n0,1,nan\n", "line 2: duration_s: must be a number >= 0, got 'nan'"),
        ("submit_time_s,num_gpus,duration_s,priority\n0,1,5,urgent\n", "line 2: priority: must be one of reserved"),
        ("submit_time_s,num_gpus,duration_s,gpu_fraction\n0,1,5,1.5\n", "line 2: gpu_fraction: must be in (0, 1]"),
        ("submit_time_s,num_gpus,duration_s,gpu_fraction\n0,2,5,0.5\n", "line 2: gpu_fraction: a fraction < 1 needs"),
        ("submit_time_s,num_gpus,duration_s,min_gpus\n0,2,5,4\n", "line 2: min_gpus: must be <= num_gpus (2)"),
        ("submit_time_s,num_gpus,duration_s\n0,1,5,9\n", "line 2: expected 3 fields, got 4"),
        ("job_id,submit_time_s,num_gpus,duration_s\na,0,1,5\n\na,1,1,5\n", "line 4: job_id: duplicate job id 'a'"),
        ("submit_time_s,num_gpus\n0,1\n", "line 1: missing required column(s) duration_s"),
        ("submit_time_s,num_gpus,duration_s,cpu_milli\n0,1,5,-1\n", "line 2: cpu_milli: must be an integer >= 0"),
        (
            "submit_time_s,num_gpus,duration_s,memory_mib\n0,1,5,1e30\n",
            "line 2: memory_mib: must be an integer >= 0 and",
        ),
    ],
)
def test_generic_errors_name_line_and_column(text: str, message: str) -> None:
    with pytest.raises(TraceError) as e:
        read_csv(_lines(text))
    assert str(e.value).startswith(message)


def test_generic_host_columns_are_optional() -> None:
    text = "submit_time_s,num_gpus,duration_s,cpu_milli,memory_mib\n0,2,60,16000,65536\n5,1,60,,\n"
    jobs = read_trace_result("csv:mem.csv", lambda _: io.StringIO(text)).jobs
    assert [(j.cpu_milli, j.memory_mib) for j in jobs] == [(16000, 65536), (0, 0)]


def test_generic_unknown_column_lists_the_allowed_ones() -> None:
    with pytest.raises(TraceError) as e:
        read_csv(_lines("submit_time_s,num_gpus,duration_s,colour\n0,1,5,red\n"))
    assert "unknown column(s) 'colour'" in str(e.value)
    assert "allowed: submit_time_s, num_gpus, duration_s, job_id, tenant" in str(e.value)


def test_generic_empty_file_has_no_jobs() -> None:
    assert read_csv([]).jobs == []
    assert read_csv(["submit_time_s,num_gpus,duration_s\n"]).jobs == []


# --- Philly -------------------------------------------------------------------------------------------


def test_philly_fixture() -> None:
    jobs = read_trace(f"philly:{SPECS['philly']}")
    # Row 3 (2017-09-29 07:58:32) is the earliest; row 12 (2017-10-09 04:44:14) comes 9 d 20:45:42 later.
    assert (jobs[0].job_id, jobs[0].duration_s, jobs[0].tenant) == ("philly-000003", 860662.0, "6c71a0")
    assert (jobs[1].job_id, jobs[1].submit_time_s) == ("philly-000012", 9 * 86400 + 20 * 3600 + 45 * 60 + 42)
    assert {j.tenant for j in jobs} == {"6c71a0", "6214e9", "11cb48"}
    assert sum(j.tenant == "11cb48" for j in jobs) == 4


def test_philly_skips_and_counts() -> None:
    text = (
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:00:00,60.0,1,60.0,a\n"
        "2017-10-09 07:00:05,60.0,0,0.0,a\n"
        "2017-10-09 07:00:10,0.0,2,0.0,b\n"
        "2017-10-09 07:00:20,-3.0,2,-6.0,b\n"
        "2017-10-09 06:59:00,30.0,8,240.0,b\n"
    )
    result = read_philly(_lines(text))
    assert [(j.job_id, j.submit_time_s, j.num_gpus) for j in result.jobs] == [
        ("philly-000005", 0, 8),
        ("philly-000001", 60, 1),
    ]
    assert result.skipped == {"non_positive_duration": 2, "zero_gpus": 1}
    assert result.n_skipped == 3


def test_philly_start_end_columns_and_user_tenant() -> None:
    text = (
        "jobid,user,vc,submitted_time,start_time,end_time,num_gpu\n"
        "app_1,alice,vc1,2017-10-03 03:00:00,2017-10-03 03:10:00,2017-10-03 04:10:00,4\n"
        "app_2,bob,vc2,2017-10-03 03:05:00,2017-10-03 03:06:00,None,1\n"
    )
    result = read_philly(_lines(text))
    assert [(j.job_id, j.tenant, j.duration_s, j.num_gpus) for j in result.jobs] == [("app_1", "alice", 3600.0, 4)]
    assert result.skipped == {"no_duration": 1}


def test_philly_bad_timestamp_names_line_and_column() -> None:
    with pytest.raises(
        TraceError, match=r"line 3: timestamp: must be a date-time or seconds, got '2017-13-45 00:00:00'"
    ):
        read_philly(_lines("timestamp,duration,num_gpus\n2017-10-09 07:00:00,5,1\n2017-13-45 00:00:00,5,1\n"))


def test_philly_needs_its_columns() -> None:
    with pytest.raises(TraceError, match="not a Philly CSV"):
        read_philly(_lines("a,b\n1,2\n"))


# --- Alibaba openb ------------------------------------------------------------------------------------


def test_openb_fixture() -> None:
    result = read_trace_result(f"alibaba-openb:{SPECS['alibaba-openb']}")
    assert result.skipped == {"cpu_only": 2, "non_positive_duration": 1}
    assert result.notes == {"never_scheduled": 1, "running_at_trace_end": 3}
    jobs = {j.job_id: j for j in result.jobs}
    first = result.jobs[0]  # synth-pod-0008, created at 90: the earliest
    assert (first.job_id, first.num_gpus, first.gpu_type, first.priority) == ("synth-pod-0008", 4, "P100", "reserved")
    assert first.duration_s == 50000 - 95
    assert (jobs["synth-pod-0001"].submit_time_s, jobs["synth-pod-0001"].duration_s) == (70, 3560)
    assert jobs["synth-pod-0006"].duration_s == 125  # never scheduled: deletion - creation
    assert jobs["synth-pod-0003"].gpu_type == "V100M16|V100M32" and jobs["synth-pod-0003"].gpu_fraction == 1.0
    assert jobs["synth-pod-0005"].priority == "on-demand" and jobs["synth-pod-0004"].priority == "spot"
    fractional = {j.job_id: j.gpu_fraction for j in result.jobs if j.gpu_fraction < 1}
    assert fractional == {
        "synth-pod-0001": 0.5,
        "synth-pod-0004": 0.25,
        "synth-pod-0006": 0.46,
        "synth-pod-0010": 0.75,
        "synth-pod-0012": 0.1,
        "synth-pod-0014": 0.46,
    }
    assert all(jobs[k].num_gpus == 1 for k in fractional)
    assert jobs["synth-pod-0004"].gpu_seconds == pytest.approx(0.25 * 590)
    assert (jobs["synth-pod-0001"].cpu_milli, jobs["synth-pod-0001"].memory_mib) == (4000, 8192)  # its host ask


def test_openb_untimed_variant_needs_a_duration() -> None:
    path = FIX / "alibaba-openb" / "openb_pod_list_untimed_synthetic.csv"
    with pytest.raises(TraceError, match="untimed_duration_s"):
        read_trace(f"alibaba-openb:{path}")
    result = read_trace_result(f"alibaba-openb:{path}", untimed_duration_s=600.0)
    assert [j.submit_time_s for j in result.jobs] == [0, 1, 3, 4, 5]
    assert {j.duration_s for j in result.jobs} == {600.0}
    assert result.skipped == {"cpu_only": 1} and result.notes == {"untimed": 5}


def test_openb_bad_gpu_milli() -> None:
    text = "name,num_gpu,gpu_milli,creation_time,deletion_time\np,1,0,0,10\n"
    with pytest.raises(TraceError, match=r"line 2: gpu_milli: must be in 1\.\.1000"):
        read_alibaba_openb(_lines(text))


# --- Pollux -------------------------------------------------------------------------------------------


def test_pollux_fixture_durations_from_profiles() -> None:
    result = read_trace_result(f"pollux:{SPECS['pollux']}")
    jobs = {j.job_id: j for j in result.jobs}
    # ncf 1 × 32768: 10 epochs → 1548 iterations × step time of placement "1" at local batch 32768.
    assert jobs["ncf-2"].duration_s == pytest.approx(1548 * 0.02131553226047092)
    # bert 12 × 384: local 32 > 12 → 2 accumulation steps of 11; placement "444" at 11; 2 epochs → 480 iterations.
    step, sync = 1.6889024674892426, 0.8779327430725098
    assert jobs["bert-27"].duration_s == pytest.approx(480 * (step + 2 * (step - sync)))
    # No cifar10/deepspeech2/imagenet profiles in the fixture: reference durations, counted.
    assert jobs["cifar10-0"].duration_s == REFERENCE_DURATION_S["cifar10"]
    assert result.notes == {"duration_reference": 16}
    assert (jobs["cifar10-0"].submit_time_s, jobs["ncf-2"].submit_time_s) == (0, 28)
    assert jobs["cifar10-4"].model == "cifar10" and jobs["cifar10-4"].num_gpus == 16
    assert (jobs["cifar10-4"].min_gpus, jobs["cifar10-4"].max_gpus) == (1, 64)
    assert (jobs["ncf-2"].min_gpus, jobs["ncf-2"].max_gpus) == (1, 4)


def test_pollux_without_profiles_uses_reference_durations() -> None:
    result = read_pollux(SPECS["pollux"].read_text().splitlines(keepends=True))
    assert result.notes == {"duration_reference": 29}
    assert {j.duration_s for j in result.jobs} <= set(REFERENCE_DURATION_S.values())


@pytest.mark.parametrize(
    ("replicas", "expected"), [(1, "1"), (4, "4"), (6, "24"), (10, "244"), (13, "1444"), (16, "4444")]
)
def test_pollux_placement_ids(replicas: int, expected: str) -> None:
    assert placement_id(replicas) == expected


def test_pollux_large_jobs_use_scalability_rows() -> None:
    profile = PolluxProfile(
        placements={},
        scalability={(6, 24): ((10.0, 1.0, 0.5), (30.0, 3.0, 0.5))},
        iterations={480: 100.0},
        max_local_bsz=40.0,
    )
    assert profile_duration(profile, 24, 480) == pytest.approx(100 * 2.0)  # local 20: halfway between the rows
    assert profile_duration(profile, 32, 480) is None  # no (8, 32) rows
    assert profile_duration(profile, 24, 960) is None  # no validation file for 960


def test_pollux_unknown_application_without_profile() -> None:
    with pytest.raises(TraceError, match="line 2: application: no profile"):
        read_pollux(_lines("name,time,application,num_replicas,batch_size\nx-0,0,gpt5,8,64\n"))


# --- Gavel and Shockwave ------------------------------------------------------------------------------


def test_gavel_fixture_converts_steps_with_throughputs() -> None:
    result = read_trace_result(f"gavel:{GAVEL_TRACE}")
    jobs = result.jobs
    assert jobs[0].job_id == "gavel-11cb48-000001" and {j.tenant for j in jobs} == {"11cb48"}
    assert jobs[0].duration_s == pytest.approx(1109 / _v100("Recommendation (batch size 1024)", 1))
    big = next(j for j in jobs if j.num_gpus == 64)  # ResNet-18 at 64 GPUs: measured only up to 8
    assert big.duration_s == pytest.approx(55335 / (_v100("ResNet-18 (batch size 128)", 8) * 8))
    assert result.notes == {"throughput_extrapolated": 5}
    tied = [j.job_id for j in jobs if j.submit_time_s == 3611733 - 3545511]
    assert tied == ["gavel-11cb48-000019", "gavel-11cb48-000020"]


def test_gavel_default_throughput_is_counted() -> None:
    result = read_gavel(GAVEL_TRACE.read_text().splitlines(), throughputs={})
    assert result.notes == {"throughput_default": 25}
    assert result.jobs[0].duration_s == pytest.approx(1109 / DEFAULT_STEPS_PER_S)


def test_gavel_without_throughputs_file(tmp_path: Path) -> None:
    lone = tmp_path / "a" / "b" / "c" / "d" / "vc.trace"
    lone.parent.mkdir(parents=True)
    shutil.copy(GAVEL_TRACE, lone)
    with pytest.raises(TraceError, match="no Gavel throughputs file found"):
        read_trace(f"gavel:{lone}")
    jobs = read_trace(f"gavel:{lone}", throughputs={("CycleGAN", 1): 2.0})
    assert len(jobs) == 25 and jobs[0].tenant == "vc"


def test_gavel_physical_fixture() -> None:
    jobs = read_trace(f"gavel-physical:{SPECS['gavel-physical']}")
    assert {j.submit_time_s for j in jobs} == {0.0}
    assert (jobs[0].job_id, jobs[0].model, jobs[0].num_gpus) == ("gavel-000001", "Transformer (batch size 128)", 2)
    assert jobs[0].duration_s == pytest.approx(346 / _v100("Transformer (batch size 128)", 2))
    assert {j.priority for j in jobs} == {"on-demand"}


def test_shockwave_fixture_uses_its_durations() -> None:
    jobs = read_trace(f"shockwave:{SPECS['shockwave']}")
    assert (jobs[0].model, jobs[0].duration_s, jobs[0].submit_time_s) == ("LM (batch size 10)", 1418.0, 0.0)
    lm5 = next(j for j in jobs if j.model == "LM (batch size 5)")
    assert (lm5.num_gpus, lm5.duration_s, lm5.submit_time_s) == (4, 16778.0, 1106.0)


def test_gavel_field_count_is_checked() -> None:
    with pytest.raises(TraceError, match="line 1: expected 7 fields, got 12"):
        read_gavel(SPECS["shockwave"].read_text().splitlines(), throughputs={})
    with pytest.raises(TraceError, match="line 1: arrival_time: must be a number >= 0, got 'soon'"):
        read_shockwave(["LM\tc\tw\t--steps\t1\t100\t1\tgns\t1\t-1\t50\tsoon\n"])


# --- Tiresias -----------------------------------------------------------------------------------------


def test_tiresias_fixture() -> None:
    jobs = read_trace(f"tiresias:{SPECS['tiresias']}")
    assert (jobs[0].job_id, jobs[0].model, jobs[0].duration_s, jobs[0].num_gpus) == ("0", "vgg19", 164.0, 1)
    assert (jobs[1].job_id, jobs[1].num_gpus, jobs[1].submit_time_s) == ("1", 8, 30.0)


# --- slicing ------------------------------------------------------------------------------------------


@st.composite
def job_lists(draw: st.DrawFn, max_size: int = 40) -> list[TraceJob]:
    times = draw(st.lists(st.floats(0, 1e7, allow_nan=False), max_size=max_size))
    return [TraceJob(job_id=f"j{i}", submit_time_s=t, num_gpus=1, duration_s=10.0) for i, t in enumerate(times)]


def _gaps(jobs: list[TraceJob]) -> list[float]:
    return [b.submit_time_s - a.submit_time_s for a, b in itertools.pairwise(jobs)]


@settings(max_examples=200, deadline=None)
@given(job_lists(), st.floats(0.01, 100))
def test_scale_load_keeps_order_and_count_and_shrinks_the_span(jobs: list[TraceJob], factor: float) -> None:
    out = scale_load(jobs, factor)
    ordered = sorted(jobs, key=lambda j: j.submit_time_s)
    assert [j.job_id for j in out] == [j.job_id for j in ordered]
    assert all(a.submit_time_s <= b.submit_time_s for a, b in itertools.pairwise(out))
    if jobs:
        span = ordered[-1].submit_time_s - ordered[0].submit_time_s
        new_span = out[-1].submit_time_s - out[0].submit_time_s
        assert new_span == pytest.approx(span / factor, rel=1e-9, abs=1e-6)
        assert out[0].submit_time_s == ordered[0].submit_time_s


@settings(max_examples=200, deadline=None)
@given(job_lists(), st.floats(0, 1e7), st.floats(0, 1e7))
def test_time_window_keeps_jobs_inside_and_rebases(jobs: list[TraceJob], a: float, b: float) -> None:
    start, end = min(a, b), max(a, b)
    out = time_window(jobs, start, end)
    inside = sorted((j for j in jobs if start <= j.submit_time_s < end), key=lambda j: j.submit_time_s)
    assert [j.job_id for j in out] == [j.job_id for j in inside]
    if out:
        assert out[0].submit_time_s == 0.0
        assert _gaps(out) == pytest.approx(_gaps(inside), abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(job_lists(), st.integers(0, 50))
def test_first_n_takes_the_earliest(jobs: list[TraceJob], n: int) -> None:
    out = first_n(jobs, n)
    assert len(out) == min(n, len(jobs))
    rest = sorted(jobs, key=lambda j: j.submit_time_s)[len(out) :]
    if out and rest:
        assert out[-1].submit_time_s <= rest[0].submit_time_s


@settings(max_examples=100, deadline=None)
@given(job_lists())
def test_rebase_starts_at_zero_and_keeps_gaps(jobs: list[TraceJob]) -> None:
    out = rebase(jobs)
    assert len(out) == len(jobs)
    if out:
        assert out[0].submit_time_s == 0.0
        assert _gaps(out) == pytest.approx(_gaps(sorted(jobs, key=lambda j: j.submit_time_s)), abs=1e-6)


def test_slicing_rejects_bad_arguments() -> None:
    jobs = synthetic_jobs(5, 0)
    with pytest.raises(ValueError, match="factor"):
        scale_load(jobs, 0)
    with pytest.raises(ValueError, match="factor"):
        scale_load(jobs, math.inf)
    with pytest.raises(ValueError, match="n must be"):
        first_n(jobs, -1)
    with pytest.raises(ValueError, match="start_s <= end_s"):
        time_window(jobs, 10, 5)


# --- synthetic ----------------------------------------------------------------------------------------


def test_synthetic_is_deterministic() -> None:
    assert synthetic_jobs(200, 7, mean_interarrival_s=30) == synthetic_jobs(200, 7, mean_interarrival_s=30)
    assert synthetic_jobs(200, 7) != synthetic_jobs(200, 8)


def test_synthetic_shape() -> None:
    jobs = synthetic_jobs(2000, 1, mean_interarrival_s=10, tenants=3, spot_fraction=0.25, elastic_fraction=0.2)
    assert [j.job_id for j in jobs[:2]] == ["syn-000001", "syn-000002"] and jobs[-1].job_id == "syn-002000"
    assert jobs[0].submit_time_s == 0.0
    assert all(a.submit_time_s <= b.submit_time_s for a, b in itertools.pairwise(jobs))
    assert {j.num_gpus for j in jobs} <= {1, 2, 4, 8, 16, 32, 64}
    assert {j.tenant for j in jobs} == {"tenant-0", "tenant-1", "tenant-2"}
    assert 0.2 < sum(j.priority == "spot" for j in jobs) / 2000 < 0.3
    elastic = [j for j in jobs if j.min_gpus is not None]
    assert 0.15 < len(elastic) / 2000 < 0.25
    assert all(j.min_gpus == 1 and j.max_gpus is not None and j.num_gpus <= j.max_gpus <= 64 for j in elastic)
    assert jobs[-1].submit_time_s / 1999 == pytest.approx(10, rel=0.1)


@settings(max_examples=50, deadline=None)
@given(
    st.integers(0, 60),
    st.integers(0, 2**32 - 1),
    st.lists(st.integers(1, 128), min_size=1, max_size=6, unique=True),
)
def test_synthetic_sizes_within_gpu_sizes(n: int, seed: int, sizes: list[int]) -> None:
    jobs = synthetic_jobs(n, seed, gpu_sizes=sizes)
    assert len(jobs) == n
    assert all(j.num_gpus in sizes for j in jobs)
    assert all(j.duration_s >= 1.0 for j in jobs)


def test_synthetic_rejects_bad_weights() -> None:
    with pytest.raises(ValueError, match="size_weights"):
        synthetic_jobs(10, 0, gpu_sizes=(1, 2), size_weights=(1.0,))
    with pytest.raises(ValueError, match="spot_fraction"):
        synthetic_jobs(10, 0, spot_fraction=1.5)

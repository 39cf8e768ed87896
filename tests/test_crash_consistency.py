"""Run directories survive a crash at any instant (issue 17): each state a kill can leave behind resumes to the
uninterrupted numbers. The states are made by hand, from the code's own order of writes: a round's metrics row is
appended, then the checkpoint is written to `checkpoint.safetensors.tmp` and renamed; a comparison writes its root
config, then each member's config and federation."""

import json

import pytest

from manytask.config import validate
from manytask.run import resume, run_config
from manytask.rundir import RunDir
from tests.conftest import small_config_dict

COMPARISON = small_config_dict(method=["fedavg", "local"], rounds=3)
TIMED = ("wall_seconds", "client_seconds", "energy_joules")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("full") / "run"
    return run_config(validate(COMPARISON), out), out


def _rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def _same(resumed, uninterrupted, out):
    summaries, full = uninterrupted
    for label in ("fedavg", "local"):
        assert resumed[label]["tasks"] == summaries[label]["tasks"], label
        assert resumed[label]["bytes_up"] == summaries[label]["bytes_up"], label
        assert [r["round"] for r in _rows(out / label)] == [1, 2, 3]
        assert _numbers(out / label) == _numbers(full / label), label


def _numbers(run_dir):
    """The rows without what a clock measured."""
    return [{k: v for k, v in row.items() if k not in TIMED} for row in _rows(run_dir)]


def test_a_kill_between_the_first_row_and_the_first_checkpoint_resumes_to_the_same_numbers(tmp_path, uninterrupted):
    out = tmp_path / "run"
    run_config(validate(COMPARISON), out, stop_after=1)
    member = out / "fedavg"
    (member / "checkpoint.safetensors").rename(member / "checkpoint.safetensors.tmp")  # written, not yet renamed
    _same(resume(out), uninterrupted, out)
    assert not list(member.glob("*.tmp"))


def test_a_torn_last_metrics_line_is_dropped_and_its_round_run_again(tmp_path, uninterrupted):
    out = tmp_path / "run"
    run_config(validate(COMPARISON), out, stop_after=2)
    metrics = out / "fedavg" / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text(lines[0] + lines[1][: len(lines[1]) // 2])  # round 2's row cut mid-write
    (out / "fedavg" / "checkpoint.safetensors").unlink()
    assert [r["round"] for r in RunDir(out / "fedavg").read_metrics()] == [1]
    _same(resume(out), uninterrupted, out)


@pytest.mark.parametrize("left", ["nothing", "empty directory", "config only", "config temporary"])
def test_a_comparison_killed_while_creating_its_members_resumes(tmp_path, uninterrupted, left):
    out = tmp_path / "run"
    run_config(validate(COMPARISON), out, stop_after=1)
    member = out / "local"
    for path in member.iterdir():
        if not (left == "config only" and path.name == "config.yaml"):
            path.unlink()
    if left == "nothing":
        member.rmdir()
    if left == "config temporary":
        (member / "config.yaml.tmp").write_text("method: loc")  # cut short before its rename
    _same(resume(out), uninterrupted, out)

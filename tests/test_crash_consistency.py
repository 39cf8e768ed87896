"""Run directories survive a crash at any instant (issue 17): each state a kill can leave behind resumes to the
uninterrupted numbers. The states are made by hand, from the code's own order of writes: a round's metrics row is
appended, then the checkpoint is written to `checkpoint.safetensors.tmp` and renamed; a comparison writes its root
config, then each member's config and federation."""

import json

import pytest

from manytask.config import validate
from manytask.launch import resume, run_config
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


def test_a_run_killed_while_writing_its_first_file_starts_again_in_the_same_directory(tmp_path, uninterrupted):
    """The kill campaign's finding: a kill while the root config.yaml is written leaves only its temporary. Resume
    says to start again; starting again into the same --out works (the temporary is cleared)."""
    from manytask.errors import ManytaskError

    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml.tmp").write_text("name: sm")
    with pytest.raises(ManytaskError, match="stopped before its config was written: start it again with manytask "
                                            "run CONFIG --out"):
        resume(out)
    _same(run_config(validate(COMPARISON), out), uninterrupted, out)
    assert not (out / "config.yaml.tmp").exists()


def test_safetensors_own_temporaries_are_removed_on_resume(tmp_path, uninterrupted):
    """safetensors writes through `.tmpXXXXXX` before its rename: a kill there leaves one behind."""
    out = tmp_path / "run"
    run_config(validate(COMPARISON), out, stop_after=2)
    stray = out / "fedavg" / ".tmpa1B2c3"
    stray.write_bytes(b"\0" * 100)
    _same(resume(out), uninterrupted, out)
    assert not stray.exists()

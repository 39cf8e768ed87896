"""The speed work (issue 16) changes how fast the engine runs, never what it computes: the default job, shortened to
4 rounds, gives every method's per-task test accuracy and loss exactly as the code before that work did
(`default_job_golden.json` was written by manytask at fb13495 with `manytask run rounds=4 eval_every=2`)."""

import json
from pathlib import Path

import pytest

from manytask.config import default_config, validate
from manytask.run import run_config

GOLDEN = json.loads((Path(__file__).parent / "default_job_golden.json").read_text())


@pytest.mark.slow
def test_the_default_jobs_table_is_unchanged_bit_for_bit(tmp_path):
    summaries = run_config(validate({**default_config(), "rounds": 4, "eval_every": 2}), tmp_path / "default")
    tasks = {label: {t: {k: m[k] for k in ("accuracy", "loss")} for t, m in s["tasks"].items()}
             for label, s in summaries.items()}
    assert tasks == GOLDEN["tasks"]

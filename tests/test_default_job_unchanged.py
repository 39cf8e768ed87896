"""The speed work (issue 16) changes how fast the engine runs, never what it computes: the default job, shortened to
4 rounds, gives every method's per-task test accuracy and loss as the code before that work did
(`default_job_golden.json` was written by manytask at fb13495 with `manytask run rounds=4 eval_every=2`).

On the machine that wrote the file the numbers are equal bit for bit. Another CPU takes other kernel paths (MKL on
AMD and on Intel round differently), so the test allows float rounding on the losses: relative 1e-4, where an AMD
EPYC differs by at most 3.0e-5. Accuracies must be equal: they count test samples, and a changed computation
moves them."""

import json
from pathlib import Path

import pytest

from manytask.config import validate
from manytask.config_sources import default_config
from manytask.launch import run_config

GOLDEN = json.loads((Path(__file__).parent / "default_job_golden.json").read_text())
# the default job's per-task FedAvg was labelled plain `fedavg` when the file was written
GOLDEN["tasks"] = {"fedavg-per-task" if label == "fedavg" else label: table for label, table in GOLDEN["tasks"].items()}


LOSS_RTOL = 1e-4


@pytest.mark.slow
def test_the_default_jobs_table_is_unchanged(tmp_path):
    summaries = run_config(validate({**default_config(), "rounds": 4, "eval_every": 2}), tmp_path / "default")
    tasks = {label: s["tasks"] for label, s in summaries.items()}
    assert {label: {t: m["accuracy"] for t, m in table.items()} for label, table in tasks.items()} == {
        label: {t: m["accuracy"] for t, m in table.items()} for label, table in GOLDEN["tasks"].items()}
    for label, table in GOLDEN["tasks"].items():
        for task, golden in table.items():
            assert tasks[label][task]["loss"] == pytest.approx(golden["loss"], rel=LOSS_RTOL), (label, task)

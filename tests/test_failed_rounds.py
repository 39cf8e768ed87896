"""A run whose round cannot complete is not lost (issue 17): the summary and report of the rounds that did are
written, the error says which round and why, and the run can still be resumed."""

import json

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from manytask.cli import app
from manytask.config import validate
from manytask.engine.client_runner import ClientRunner
from manytask.engine.local import InProcessTransport
from manytask.engine.loop import FitOutcome, RoundFailed, RoundLoop
from manytask.experiment import Experiment
from manytask.messages import Message, as_message, encode
from manytask.report import write_report
from manytask.rundir import RunDir
from tests.conftest import small_config_dict


class DivergingFrom:
    """The local transport whose every reply, from round `first` on, holds NaN (every client diverged)."""

    def __init__(self, experiment: Experiment, first: int) -> None:
        self.inner, self.first = InProcessTransport(ClientRunner(experiment)), first

    def fit(self, round_index, payloads, simulated_drops) -> FitOutcome:
        outcome = self.inner.fit(round_index, payloads, simulated_drops)
        if round_index >= self.first:
            for client, data in outcome.replies.items():
                reply = as_message(data)  # the client's own message in-process: copied, never written into
                arrays = dict(reply.arrays)
                name = next(k for k, a in arrays.items() if a.dtype.kind == "f")
                arrays[name] = np.full_like(arrays[name], np.nan)
                outcome.replies[client] = encode(Message(arrays, dict(reply.scalars)))
        return outcome

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_round_where_every_client_diverges_leaves_the_summary_and_report_of_the_rounds_before(tmp_path):
    experiment = Experiment.build(validate(small_config_dict(rounds=3, eval_every=1)))
    run_dir = RunDir(tmp_path / "run")
    run_dir.start("", experiment.federation.to_json())
    with pytest.raises(RoundFailed) as caught:
        RoundLoop(experiment, run_dir, DivergingFrom(experiment, 1)).run()
    message = str(caught.value)
    assert message.startswith("round 2 failed: 0 of 4 sampled clients replied")
    assert "4 clients: reply has non-finite values (diverged training)" in message
    assert message.endswith("training diverged: lower train.lr.")
    summary = json.loads(run_dir.summary.read_text())
    assert summary["stopped"] == {"round": 2, "rounds_completed": 1, "reason": message}
    assert summary["tasks"] == run_dir.read_metrics()[0]["eval"]  # the model after round 1, evaluated again
    assert not run_dir.is_finished()  # a stopped run can be resumed
    report = write_report(run_dir.path).read_text()
    assert "**This run stopped in round 2.**" in report and "after the 1 rounds that completed" in report


def test_the_cli_names_the_round_and_writes_the_report_when_training_diverges(tmp_path):
    config = tmp_path / "diverging.yaml"
    config.write_text(yaml.safe_dump(small_config_dict(rounds=3, train={"lr": 1e30, "local_steps": 5,
                                                                          "batch_size": 32})))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(config), "--out", str(out), "--quiet"])
    assert result.exit_code == 2, result.output
    assert "round 1 failed" in result.output and "lower train.lr" in result.output
    assert str(out / "report.md") in result.output.replace("\n", "")
    assert "stopped in round 1" in (out / "report.md").read_text()


def test_a_failed_member_does_not_stop_the_comparison(tmp_path):
    """One member diverges (its own lr): the others still run, the comparison's summary and report cover all of
    them, and the CLI names the failed member and exits 2."""
    methods = [{"name": "fedavg", "label": "wild", "train": {"lr": 1e30}}, {"name": "fedavg", "label": "tame"}]
    config = tmp_path / "comparison.yaml"
    config.write_text(yaml.safe_dump(small_config_dict(method=methods, rounds=2, reference=None)))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(config), "--out", str(out), "--quiet"])
    assert result.exit_code == 2, result.output
    assert "wild: round 1 failed" in result.output
    tame = json.loads((out / "tame" / "summary.json").read_text())
    assert "stopped" not in tame and [r["round"] for r in RunDir(out / "tame").read_metrics()] == [1, 2]
    assert json.loads((out / "wild" / "summary.json").read_text())["stopped"]["round"] == 1
    report = (out / "report.md").read_text()
    assert "### tame" in report and "**This run stopped in round 1.**" in report

"""The cross-evaluation oracle: every client's final model on every client's test data, its communities and their
ARI against the true clusters, shown in the report."""

from __future__ import annotations

import json

import pytest
from sklearn.metrics import adjusted_rand_score
from typer.testing import CliRunner

from manytask.cli import app
from manytask.config import validate
from manytask.cross_eval import oracle
from manytask.errors import ManytaskError
from manytask.launch import run_config
from manytask.report import write_report
from tests.conftest import small_config_dict
from tests.test_sfmtl import PERSONAL

CONFIG = small_config_dict(**{**PERSONAL, "benchmark": {**PERSONAL["benchmark"], "clusters": 2}},
                           method="sfmtl-graph", rounds=3)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("oracle") / "run"
    run_config(validate(CONFIG), out)
    return out


def test_the_diagonal_is_each_clients_own_final_score_and_the_ari_is_of_its_communities(finished):
    found = oracle(finished)
    summary = json.loads((finished / "summary.json").read_text())
    holdings = json.loads((finished / "federation.json").read_text())["clients"]
    tasks = [next(iter(held)) for held in holdings]  # each client's one task
    matrix = found["matrix"]
    assert len(matrix) == 6 and all(len(row) == 6 for row in matrix)
    assert [matrix[i][i] for i in range(6)] == pytest.approx([summary["tasks"][t]["accuracy"] for t in tasks])
    assert found["own"] == pytest.approx(sum(matrix[i][i] for i in range(6)) / 6)
    label = {c: n for n, group in enumerate(found["communities"]) for c in group}
    truth = [summary["task_groups"][t] for t in tasks]
    assert found["ari"] == pytest.approx(adjusted_rand_score(truth, [label[c] for c in range(6)]))
    assert json.loads((finished / "cross_evaluation.json").read_text()) == found
    text = write_report(finished).read_text()
    assert f"- cross-evaluation oracle (a ceiling): ARI {found['ari']:.2f}" in text


def test_the_command_reports_each_run_and_refuses_unfinished_or_multi_task_runs(finished, tmp_path):
    shown = CliRunner().invoke(app, ["cross-eval", str(finished)])
    assert shown.exit_code == 0 and "oracle communities" in shown.output
    run_config(validate(CONFIG), tmp_path / "cut", stop_after=1)
    with pytest.raises(ManytaskError, match="not a finished run"):
        oracle(tmp_path / "cut")
    run_config(validate(small_config_dict(rounds=1)), tmp_path / "multi")
    with pytest.raises(ManytaskError, match="one task per client"):
        oracle(tmp_path / "multi")

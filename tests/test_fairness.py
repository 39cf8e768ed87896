import json
import math

import pytest

from manytask.config import validate
from manytask.fairness import fairness, worst_fraction_mean
from manytask.launch import run_config
from tests.conftest import small_config_dict


def test_fairness_by_hand():
    scores = [0.9, 0.5, 0.7, 0.3, 1.0, 0.8, 0.6, 0.4, 0.2, 0.1]
    stats = fairness(scores)
    assert stats["mean"] == pytest.approx(0.55)
    assert stats["worst_10"] == pytest.approx(0.1)  # ceil(1.0) = the single worst client
    assert stats["worst_20"] == pytest.approx(0.15)  # mean of 0.1 and 0.2
    assert stats["std"] == pytest.approx(math.sqrt(sum((s - 0.55) ** 2 for s in scores) / 10))
    assert worst_fraction_mean([0.4, 0.2, 0.9], 0.1) == pytest.approx(0.2)  # at least one client
    with pytest.raises(ValueError):
        fairness([])


@pytest.mark.parametrize("method", ["fedavg", "local"])
def test_every_evaluation_records_per_client_scores_and_fairness(tmp_path, method):
    summary = run_config(validate(small_config_dict(method=method, rounds=2)), tmp_path / "run")[method]
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    fed = json.loads((tmp_path / "run" / "federation.json").read_text())["clients"]
    assert set(row["clients"]) == {str(c) for c in range(len(fed))}
    if method == "fedavg":  # one global model: a client's score is the mean of its tasks' server-side accuracies
        for client, tasks in enumerate(fed):
            expected = sum(row["eval"][t]["accuracy"] for t in tasks) / len(tasks)
            assert row["clients"][str(client)] == pytest.approx(expected)
    assert row["fairness"] == pytest.approx(fairness(list(row["clients"].values())))
    assert summary["fairness"] == row["fairness"]

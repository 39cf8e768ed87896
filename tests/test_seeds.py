"""`seeds:` runs every member once per seed; reports and `compare` show mean ± std, the per-seed values, and mark
differences within one standard deviation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from manytask.cli import app
from manytask.config import validate
from manytask.errors import ManytaskError
from manytask.launch import resume, run_config
from manytask.report import write_report
from manytask.report.runs import RunRecord, load_runs
from manytask.report.seeds import WITHIN_NOISE, mean_std, seed_groups, seed_table, within_noise
from tests.conftest import small_config_dict

SEEDED = small_config_dict(method=["fedavg", "local"], seeds=[3, 5], reference="local")


@pytest.mark.parametrize("seeds, message", [([], "seed list is empty"), ([1, 1], "appears twice"),
                                            ([-2], "greater than or equal to 0")])
def test_bad_seed_lists_are_refused_in_one_sentence(seeds, message):
    with pytest.raises(ManytaskError, match=message):
        validate(small_config_dict(seeds=seeds))


def test_each_seed_gives_the_numbers_of_a_run_with_that_seed(tmp_path):
    summaries = run_config(validate(SEEDED), tmp_path / "seeded")
    assert list(summaries) == ["fedavg@seed3", "local@seed3", "fedavg@seed5", "local@seed5"]
    alone = run_config(validate(small_config_dict(seed=5)), tmp_path / "alone")["fedavg"]
    assert summaries["fedavg@seed5"]["tasks"] == alone["tasks"]
    assert summaries["fedavg@seed5"]["bytes_up"] == alone["bytes_up"]
    assert summaries["fedavg@seed3"]["tasks"] != alone["tasks"]  # the seed reaches the run
    root = json.loads((tmp_path / "seeded" / "summary.json").read_text())
    assert root["seeds"] == [3, 5] and root["order"] == list(summaries)
    for seed in (3, 5):  # normalized by the reference run of the same seed
        fedavg, local = summaries[f"fedavg@seed{seed}"], summaries[f"local@seed{seed}"]
        ratios = [fedavg["tasks"][t]["accuracy"] / local["tasks"][t]["accuracy"] for t in fedavg["tasks"]]
        assert fedavg["normalized_average"] == pytest.approx(sum(ratios) / len(ratios))
        assert json.loads((tmp_path / "seeded" / f"fedavg@seed{seed}" / "summary.json").read_text())["seed"] == seed


def test_a_stopped_seeded_comparison_resumes_to_the_same_numbers(tmp_path):
    whole = run_config(validate(SEEDED), tmp_path / "whole")
    assert run_config(validate(SEEDED), tmp_path / "cut", stop_after=2) is None
    resumed = resume(tmp_path / "cut")
    assert {k: v["tasks"] for k, v in resumed.items()} == {k: v["tasks"] for k, v in whole.items()}
    assert json.loads((tmp_path / "cut" / "summary.json").read_text())["order"] == list(whole)


def test_mean_and_sample_std_by_hand():
    mean, std = mean_std([0.80, 0.84, 0.88])
    assert mean == pytest.approx(0.84) and std == pytest.approx(0.04)  # sqrt((.0016 + 0 + .0016) / 2)
    assert mean_std([0.5]) == (0.5, 0.0)
    assert within_noise([0.80, 0.84, 0.88], [0.86, 0.87, 0.88])  # |0.84 - 0.87| = .03 <= .04
    assert not within_noise([0.80, 0.81, 0.82], [0.86, 0.87, 0.88])  # .06 > .01


def _record(label: str, seed: int, average: float, tasks: dict[str, float]) -> RunRecord:
    summary = {"label": label, "seed": seed, "average": average, "main_metric": {t: "accuracy" for t in tasks},
               "tasks": {t: {"accuracy": v} for t, v in tasks.items()}, "bits_per_task_per_round": 1000.0}
    return RunRecord(Path(f"{label}@seed{seed}"), summary, seeded=True)


def test_the_seed_table_by_hand():
    records = [_record("a", 0, 0.80, {"x": 0.8}), _record("b", 0, 0.86, {"x": 0.86}),
               _record("c", 0, 0.70, {"x": 0.7}), _record("a", 1, 0.84, {"x": 0.84}),
               _record("b", 1, 0.87, {"x": 0.87}), _record("c", 1, 0.71, {"x": 0.71}),
               _record("a", 2, 0.88, {"x": 0.88}), _record("b", 2, 0.88, {"x": 0.88}),
               _record("c", 2, 0.72, {"x": 0.72})]
    assert [g.label for g in seed_groups(records)] == ["a", "b", "c"]
    headers, rows = seed_table(records, base="c")
    table = {row[0]: dict(zip(headers, row, strict=True)) for row in rows}
    assert table["a"]["average"] == "84.0 ± 4.0%" and table["a"]["per seed"] == "80.0 / 84.0 / 88.0"
    assert table["b"]["vs best"] == "best" and table["a"]["vs best"] == WITHIN_NOISE
    assert table["c"]["vs best"] == "-16.0 pts"  # 0.71 - 0.87, outside max(0.01, 0.01)
    # Δ% against c seed by seed: (0.80/0.70 - 1, 0.84/0.71 - 1, 0.88/0.72 - 1) x 100
    gains = [100 * (0.80 / 0.70 - 1), 100 * (0.84 / 0.71 - 1), 100 * (0.88 / 0.72 - 1)]
    mean = sum(gains) / 3
    std = math.sqrt(sum((g - mean) ** 2 for g in gains) / 2)
    assert table["a"]["Δ% vs c"] == f"{mean:+.2f} ± {std:.2f}"
    assert table["a"]["seeds"] == "0, 1, 2" and table["a"]["bits/task/round"] == "1.00 kb"


def test_no_seed_table_without_seeds():
    assert seed_table([RunRecord(Path("a"), {"label": "a", "average": 0.5})]) is None


def test_report_and_compare_show_the_spread(tmp_path):
    run_config(validate(SEEDED), tmp_path / "run")
    text = write_report(tmp_path / "run").read_text()
    assert "## Over seeds" in text and "- seeds: 3, 5" in text and "| fedavg | 3, 5 |" in text
    assert (tmp_path / "run" / "plots" / "seeds_accuracy_vs_round.png").stat().st_size > 1000
    assert [r.label for r in load_runs([tmp_path / "run"])][:2] == ["fedavg@seed3", "local@seed3"]
    shown = CliRunner().invoke(app, ["compare", str(tmp_path / "run"), "--base", "local"], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    assert "over seeds" in shown.output and "Δ% vs local" in shown.output and "fedavg@seed5" in shown.output

"""The task-similarity trajectory of MaTU runs: per-round off-diagonal statistics, its plot and the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from manytask.report import write_report
from manytask.report.figures import _similarity_plots
from manytask.report.plots import plot_similarity_trajectory, similarity_trajectory
from manytask.report.runs import RunRecord
from tests.test_report import PNG_MAGIC, make_run

TASKS = ("digit", "parity", "sum")
# Off-diagonal S per round for the pairs (digit, parity), (digit, sum), (parity, sum).
OFF_DIAGONAL = {1: (0.6, 0.9, 0.5), 3: (0.7, 0.55, 0.8), 4: (0.95, 0.9, 0.92)}


def _fit(digit_parity: float, digit_sum: float, parity_sum: float) -> dict[str, float]:
    """A symmetric similarity matrix as `fit` scalars, diagonal 1, plus an unrelated scalar."""
    off = {("digit", "parity"): digit_parity, ("digit", "sum"): digit_sum, ("parity", "sum"): parity_sum}
    fit = {f"similarity/{a}/{b}": 1.0 if a == b else off[min(a, b), max(a, b)] for a in TASKS for b in TASKS}
    return {"loss": 0.25, **fit}


def _rows() -> list[dict[str, Any]]:
    """Rounds 1-4; round 2 logged no similarity (only a loss)."""
    return [
        {"round": 1, "fit": _fit(*OFF_DIAGONAL[1])},
        {"round": 2, "fit": {"loss": 0.2}},
        {"round": 3, "fit": _fit(*OFF_DIAGONAL[3])},
        {"round": 4, "fit": _fit(*OFF_DIAGONAL[4])},
    ]


def _record(tmp_path: Path, rows: list[dict[str, Any]], **params: Any) -> RunRecord:
    return RunRecord(tmp_path / "run", {"method": "matu", "method_params": params}, rows)


def test_trajectory_is_min_median_max_of_off_diagonal_pairs(tmp_path: Path) -> None:
    found = similarity_trajectory(_record(tmp_path, _rows()))
    assert found is not None
    rounds, stats = found
    assert rounds == [1, 3, 4]
    assert stats["min"] == pytest.approx([0.5, 0.55, 0.9])
    assert stats["median"] == pytest.approx([0.6, 0.7, 0.92])
    assert stats["max"] == pytest.approx([0.9, 0.8, 0.95])


def test_trajectory_is_none_without_similarity(tmp_path: Path) -> None:
    rows = [{"round": 1, "fit": {"loss": 0.3}}, {"round": 2}]
    assert similarity_trajectory(_record(tmp_path, rows)) is None
    assert similarity_trajectory(_record(tmp_path, [])) is None


def test_plot_writes_png_and_skips_runs_without_similarity(tmp_path: Path) -> None:
    path = plot_similarity_trajectory(_record(tmp_path, _rows(), eps=0.7), tmp_path / "plots" / "t.png")
    assert path == tmp_path / "plots" / "t.png"
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5_000
    without_eps = plot_similarity_trajectory(_record(tmp_path, _rows()), tmp_path / "no_eps.png")
    assert without_eps is not None and without_eps.stat().st_size > 5_000
    assert plot_similarity_trajectory(_record(tmp_path, [{"round": 1}]), tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_similarity_plots_add_the_trajectory_after_the_heatmap(tmp_path: Path) -> None:
    plots = _similarity_plots([_record(tmp_path, _rows(), eps=0.7), _record(tmp_path, [])], tmp_path)
    assert [(title, path.name) for title, path in plots] == [
        ("Task similarity (matu)", "task_similarity_matu.png"),
        ("Task similarity over rounds (matu)", "task_similarity_rounds_matu.png"),
    ]


def test_report_of_a_matu_run_includes_the_trajectory(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", "matu", method_params={"eps": 0.7, "cross_task": "all"})
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row, extra in zip(rows, _rows(), strict=False):
        row["fit"] = extra["fit"]
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    text = write_report(run).read_text()
    assert "![Task similarity over rounds (matu)](plots/task_similarity_rounds_matu.png)" in text
    assert (run / "plots" / "task_similarity_rounds_matu.png").read_bytes()[:8] == PNG_MAGIC


def test_report_of_a_run_without_similarity_has_no_trajectory(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", "fedavg")
    assert "task_similarity_rounds_" not in write_report(run).read_text()
    assert not (run / "plots" / "task_similarity_rounds_fedavg.png").exists()

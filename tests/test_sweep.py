"""Sweeps (`--sweep KEY=V1,V2`, `sweep:` in a config) run a grid as members of one comparison; `manytask compare
--format` writes the comparison table as Markdown, CSV, LaTeX or JSON, and `manytask.compare` returns its numbers."""

from __future__ import annotations

import csv
import io
import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner, Result

import manytask
from manytask.api import compare_frame
from manytask.cli import SIGINT_AFTER_ROUND, app
from manytask.config import validate
from manytask.engine.checkpoint import config_hash
from manytask.errors import ManytaskError
from manytask.launch import plan, run_config

TINY = {
    "name": "tiny",
    "method": "fedavg",
    "benchmark": {"name": "synthetic", "num_tasks": 2, "num_groups": 2, "dim": 8, "train_per_task": 120,
                  "test_per_task": 60},
    "federation": {"num_clients": 4, "tasks": {"kind": "one-per-client"}, "samples": {"kind": "label-skew"}},
    "model": {"backbone": "mlp", "hidden": [16], "pretrained": False},
    "train": {"lr": 0.05, "batch_size": 32},
    "rounds": 2,
    "reference": None,
    "device": "cpu",
}
GRID = ["--sweep", "train.lr=0.01,0.1", "--sweep", "federation.samples.zeta=0.1,1.0"]
LABELS = ["fedavg lr=0.01 zeta=0.1", "fedavg lr=0.01 zeta=1.0", "fedavg lr=0.1 zeta=0.1", "fedavg lr=0.1 zeta=1.0"]
ACCURACY_COLUMNS = ["task0 (acc)", "task1 (acc)", "average"]


def cli(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, list(args), env=env)


def tiny_config(tmp_path: Path, **values: Any) -> str:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**TINY, **values}))
    return str(path)


def tasks(run_dir: Path) -> dict[str, Any]:
    return {name: run["tasks"] for name, run in json.loads((run_dir / "summary.json").read_text())["runs"].items()}


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2 × 2 sweep, run through the CLI."""
    root = tmp_path_factory.mktemp("sweep")
    result = cli("run", tiny_config(root), *GRID, "--out", str(root / "grid"), "--quiet")
    assert result.exit_code == 0, result.output
    return root / "grid"


@pytest.fixture
def ctrl_c() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt here, as in a terminal (a shell may start pytest with it ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_2x2_sweep_runs_four_labelled_members_with_the_swept_values(swept):
    assert sorted(p.name for p in swept.iterdir() if p.is_dir() and p.name != "plots") == LABELS
    assert list(tasks(swept)) == LABELS
    configs = {label: validate(yaml.safe_load((swept / label / "config.yaml").read_text())) for label in LABELS}
    assert [(c.train.lr, c.federation.samples["zeta"]) for c in configs.values()] == [
        (0.01, 0.1), (0.01, 1.0), (0.1, 0.1), (0.1, 1.0)]
    assert [c.method["label"] for c in configs.values()] == LABELS
    assert len({config_hash(c) for c in configs.values()}) == 4
    assert validate(yaml.safe_load((swept / "config.yaml").read_text())).sweep == {
        "train.lr": [0.01, 0.1], "federation.samples.zeta": [0.1, 1.0]}


def test_the_csv_table_has_one_row_of_numbers_per_member(swept):
    result = cli("compare", str(swept), "--format", "csv")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [row["run"] for row in rows] == LABELS
    assert all(0 <= float(row[column]) <= 1 for row in rows for column in ACCURACY_COLUMNS)
    assert rows[0]["normalized"] == ""  # no reference: an empty cell


def test_api_compare_returns_the_summaries_numbers(swept):
    rows = manytask.compare(swept)
    for row, label in zip(rows, LABELS, strict=True):
        summary = json.loads((swept / label / "summary.json").read_text())
        assert row["run"] == label and row["average"] == summary["average"]
        assert row["task0 (acc)"] == summary["tasks"]["task0"]["accuracy"]
        assert isinstance(row["total bytes"], int) and row["normalized"] is None
    assert compare_frame(swept)["average"].tolist() == [row["average"] for row in rows]


def test_compare_frame_without_pandas_says_to_install_it(swept, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ManytaskError, match="pip install pandas"):
        compare_frame(swept)


def test_the_json_table_is_a_list_of_rows_of_numbers(swept, tmp_path):
    out = tmp_path / "table.json"
    assert cli("compare", str(swept), "--output", str(out)).exit_code == 0  # the format from the suffix
    rows = json.loads(out.read_text())
    assert rows == manytask.compare(swept)
    assert all(isinstance(row[column], float) for row in rows for column in ACCURACY_COLUMNS)


def test_the_latex_table_escapes_percent_underscore_and_ampersand(tmp_path):
    run_config(validate({**TINY, "method": {"name": "fedavg", "label": "fed_avg & co"}}), tmp_path / "run")
    result = cli("compare", str(tmp_path / "run"), "--format", "latex")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == r"\begin{tabular}{l" + "r" * 10 + "}" and lines[-1] == r"\end{tabular}"
    row = next(line for line in lines if line.startswith("fed"))
    assert row.startswith(r"fed\_avg \& co & ") and r"\%" in row and row.endswith(r" \\")


def test_runs_that_share_a_label_are_told_apart_by_their_directories(tmp_path):
    for lr in ("0.01", "0.1"):
        assert cli("run", tiny_config(tmp_path), f"train.lr={lr}", "--out", str(tmp_path / f"lr{lr}"),
                   "--quiet").exit_code == 0
    result = cli("compare", str(tmp_path / "lr0.01"), str(tmp_path / "lr0.1"), "--format", "md")
    assert result.exit_code == 0, result.output
    labels = [line.split(" | ")[0] for line in result.stdout.splitlines()[2:]]
    assert labels == ["| fedavg (lr0.01)", "| fedavg (lr0.1)"]


@pytest.mark.parametrize("sweep", ["train.lrr=0.01,0.1", "federation.samples.zetta=0.1,1.0", "seed=0,1"])
def test_a_sweep_over_a_key_the_config_lacks_is_refused_before_anything_is_written(sweep, tmp_path):
    result = cli("run", tiny_config(tmp_path), "--sweep", sweep, "--out", str(tmp_path / "out"), "--quiet")
    assert result.exit_code == 2
    message = result.stderr.strip()
    assert message.startswith("error: ") and "\n" not in message and message.endswith(".")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("override, hint", [("train.lr=[0.01,0.1]", "--sweep train.lr=0.01,0.1"),
                                            ("federation.samples.zeta=[0.1,1.0]", "--sweep KEY=0.1,1.0")])
def test_a_list_given_as_one_value_is_refused_with_a_pointer_to_sweep(override, hint, tmp_path):
    result = cli("run", tiny_config(tmp_path), override, "--out", str(tmp_path / "out"), "--quiet")
    assert result.exit_code == 2 and hint in result.stderr, result.output


def test_an_interrupted_sweep_resumes_to_the_uninterrupted_numbers(swept, tmp_path, ctrl_c):
    cut = tmp_path / "cut"
    stopped = cli("run", tiny_config(tmp_path), *GRID, "--out", str(cut), "--quiet",
                  env={SIGINT_AFTER_ROUND: str(TINY["rounds"])})  # the first member's last round
    assert stopped.exit_code == 130, stopped.output
    assert not (cut / "summary.json").exists() and not (cut / LABELS[1] / "metrics.jsonl").exists()
    resumed = cli("run", "--resume", str(cut), "--quiet")
    assert resumed.exit_code == 0, resumed.output
    assert tasks(cut) == tasks(swept)


def test_each_method_is_crossed_with_the_grid_and_normalized_by_the_reference_at_its_point(tmp_path):
    config = validate({**TINY, "method": ["fedavg", "local"], "reference": "local", "sweep": {"train.lr": [0.01, 0.1]}})
    summaries = run_config(config, tmp_path / "grid")
    assert list(summaries) == ["fedavg lr=0.01", "local lr=0.01", "fedavg lr=0.1", "local lr=0.1"]
    assert summaries["local lr=0.1"]["normalized_average"] == pytest.approx(1.0)
    assert summaries["fedavg lr=0.1"]["reference"] == "local lr=0.1"


def test_a_sweep_over_the_benchmark_builds_each_points_own_benchmark():
    config = validate({**TINY, "sweep": {"benchmark.num_tasks": [2, 3]}})
    assert [sorted(exp.benchmark.tasks) for exp in plan(config)] == [["task0", "task1"], ["task0", "task1", "task2"]]
    assert [exp.federation.num_clients for exp in plan(config)] == [4, 4]

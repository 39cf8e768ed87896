"""examples/: a method and a benchmark of the user's own, named in a config's `imports`, through every path that
rebuilds an experiment from its config — the CLI, --resume in a new process from another folder, workers, tune —
and from Python (`manytask.run`). Flower's simulation runs it in tests/test_flower_simulation.py."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import manytask
from manytask.cli import SIGINT_AFTER_ROUND, app

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom.yaml"
CLEARLY_LEARNED = {"shape": 1 / 3 + 0.25, "size": 1 / 2 + 0.25}  # chance + 25 points, after the 10 rounds


def learned(tasks_of_a_run: dict) -> bool:
    return all(tasks_of_a_run[task]["accuracy"] > bar for task, bar in CLEARLY_LEARNED.items())


def cli(*args: str, cwd: Path, env: dict | None = None, python_script: bool = False) -> subprocess.CompletedProcess:
    """`manytask ARGS` (or `python SCRIPT ARGS`) in a new process."""
    command = [sys.executable, *args] if python_script else [sys.executable, "-m", "manytask.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd,
                          timeout=600, env={**os.environ, **(env or {})},
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def tasks(run_dir: Path) -> dict:
    return {name: run["tasks"] for name, run in json.loads((run_dir / "summary.json").read_text())["runs"].items()}


@pytest.mark.slow
def test_the_example_stops_and_resumes_in_new_processes_to_the_numbers_python_gets(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cut = cli("run", str(EXAMPLE), "--out", str(tmp_path / "cut"), "--quiet", cwd=tmp_path,
              env={SIGINT_AFTER_ROUND: "4"})
    assert cut.returncode == 130, cut.stderr
    resumed = cli("run", "--resume", str(tmp_path / "cut"), "--quiet", cwd=elsewhere)
    assert resumed.returncode == 0, resumed.stderr
    whole = manytask.run(EXAMPLE, tmp_path / "whole")
    assert set(whole.summaries) == {"fedavgm-prox", "fedavg"}
    assert tasks(tmp_path / "cut") == tasks(whole.path)
    assert all(learned(s["tasks"]) for s in whole.summaries.values()), whole.summaries
    assert [row["round"] for row in whole.metrics("fedavgm-prox")] == list(range(1, 11))
    assert manytask.load(tmp_path / "cut").config.imports == whole.config.imports
    rows = manytask.compare(whole, tmp_path / "cut")  # the comparison table's numbers, every column
    assert [row["run"] for row in rows] == [f"{label} ({run})" for run in ("whole", "cut")
                                            for label in ("fedavgm-prox", "fedavg")]
    timed = {"run", "wall s", "client compute s", "energy"}  # seconds differ from run to run; the numbers may not
    assert all(rows[0][h] == rows[2][h] for h in rows[0] if h not in timed)


@pytest.mark.slow
def test_the_example_runs_on_workers_that_rebuild_it_from_its_config(tmp_path):
    result = CliRunner().invoke(app, ["run", str(EXAMPLE), "workers=2", "--out", str(tmp_path / "run"), "--quiet"])
    assert result.exit_code == 0, result.output
    assert all(learned(run) for run in tasks(tmp_path / "run").values())


@pytest.mark.slow
def test_the_example_tunes_and_its_tuned_config_keeps_the_imports(tmp_path):
    result = CliRunner().invoke(app, ["tune", str(EXAMPLE), "method=[fedavgm-prox]", "rounds=2", "--trials", "2",
                                      "--out", str(tmp_path / "tune")])
    assert result.exit_code == 0, result.output
    tuning = json.loads((tmp_path / "tune" / "tuning.json").read_text())
    assert tuning["members"]["fedavgm-prox"]["trials"]["complete"] == 2
    assert set(tuning["members"]["fedavgm-prox"]["best"]) == {"train.lr", "mu", "beta"}
    assert str(EXAMPLE.parent / "custom_method.py") in (tmp_path / "tune" / "tuned.yaml").read_text()


@pytest.mark.slow
def test_the_hf_example_saves_a_dataset_with_save_to_disk_and_runs_on_it(tmp_path):
    pytest.importorskip("datasets")
    done = cli(str(EXAMPLE.parent / "hf_dataset.py"), str(tmp_path), cwd=tmp_path, python_script=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "shapes-hf" / "dataset_dict.json").is_file()  # what save_to_disk writes
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert learned(summary["tasks"]), summary["tasks"]

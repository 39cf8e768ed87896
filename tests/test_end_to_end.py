"""Whole runs that must beat a bar: the default job, the other benchmarks, and a real Ctrl-C + resume."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from manytask.cli import SIGINT_AFTER_ROUND
from manytask.config import resolve, validate
from manytask.engine.checkpoint import load_checkpoint
from manytask.launch import run_config
from tests.conftest import small_config_dict

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_foundation_comparison_centralized_beats_fedavg_and_local_and_every_task_beats_chance(tmp_path):
    summaries = run_config(resolve(str(ROOT / "configs" / "foundation.yaml"), []), tmp_path / "foundation")
    central = summaries["centralized"]["average"]
    assert summaries["fedavg"]["average"] < central
    assert summaries["local"]["average"] < central
    assert summaries["local"]["average"] < summaries["fedavg"]["average"]  # collaboration pays off here
    for label, summary in summaries.items():
        for task, metrics in summary["tasks"].items():
            assert metrics["accuracy"] > summary["chance"][task] + 0.2, (label, task, metrics)


@pytest.mark.parametrize(
    ("benchmark", "federation", "model", "bar"),  # bars: 2x chance (synthetic, 4 classes), 4x (mnist1d)
    [
        ({"name": "synthetic", "num_tasks": 4, "num_groups": 2},
         {"num_clients": 8, "tasks": {"kind": "one-per-client"}}, {"backbone": "mlp", "hidden": [64]}, 0.5),
        ({"name": "mnist1d", "num_samples": 3000},
         {"num_clients": 6, "tasks": {"kind": "all"}, "samples": {"kind": "dirichlet", "zeta": 1.0}},
         {"backbone": "cnn", "channels": [16, 32], "hidden": 64}, 0.4),
    ],
)
def test_fedavg_learns_the_other_benchmarks(tmp_path, benchmark, federation, model, bar):
    train = {"lr": 0.05, "local_epochs": 3, "batch_size": 32}
    data = small_config_dict(benchmark=benchmark, federation=federation, rounds=12, model=model, train=train)
    summary = run_config(validate(data), tmp_path / "run")["fedavg"]
    assert summary["average"] > bar, summary["tasks"]


def _manytask(*args: str) -> list[str]:
    return [sys.executable, "-m", "manytask.cli", *args]


def _deliver_sigint() -> None:
    """Start the CLI the way a terminal does, with SIGINT delivered: a test run as a background job of a script
    (CI, `make test &`) inherits SIGINT ignored, and the CLI would then never see its Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_then_resume_gives_the_uninterrupted_numbers(tmp_path):
    """A real SIGINT to the CLI process, delivered right after round 3 is checkpointed (a hook the CLI honours, so
    no timer races the run), stops it with exit code 130; `--resume` then ends with the uninterrupted numbers."""
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(small_config_dict(rounds=8, train={"lr": 0.05, "local_epochs": 1})))
    run_dir = tmp_path / "cut"
    cut = subprocess.run(_manytask("run", str(config), "--out", str(run_dir), "--quiet"), capture_output=True,
                         text=True, timeout=300, env={**os.environ, SIGINT_AFTER_ROUND: "3"},
                         preexec_fn=_deliver_sigint)
    assert cut.returncode == 130, cut.stderr
    assert "--resume" in cut.stderr
    assert not (run_dir / "summary.json").exists()
    assert load_checkpoint(run_dir / "checkpoint.safetensors").round == 3
    assert [json.loads(line)["round"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    done = subprocess.run(_manytask("run", "--resume", str(run_dir), "--quiet"), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    full = subprocess.run(_manytask("run", str(config), "--out", str(tmp_path / "full"), "--quiet"),
                          capture_output=True, text=True, timeout=300)
    assert full.returncode == 0, full.stderr
    resumed = json.loads((run_dir / "summary.json").read_text())
    uninterrupted = json.loads((tmp_path / "full" / "summary.json").read_text())
    assert resumed["tasks"] == uninterrupted["tasks"]
    assert resumed["bytes_up"] == uninterrupted["bytes_up"]


def test_default_job_is_the_matu_table(tmp_path):
    """The built-in default: MaTU, FedAvg, MaT-FL and Individual; every task learned; MaTU's masks travel as bits,
    so its upload per task is well below FedAvg's one-adapter-per-task upload."""
    summaries = run_config(resolve(None, []), tmp_path / "default")
    assert list(summaries) == ["matu", "fedavg-per-task", "matfl", "individual"]
    assert summaries["individual"]["normalized_average"] == pytest.approx(1.0)
    for label, summary in summaries.items():
        for task, metrics in summary["tasks"].items():
            assert metrics["accuracy"] > summary["chance"][task] + 0.2, (label, task, metrics)
    assert summaries["matu"]["bits_per_task_per_round"] < 0.5 * summaries["fedavg-per-task"]["bits_per_task_per_round"]
    assert "pretrained" in summaries["matu"]["pretraining"]

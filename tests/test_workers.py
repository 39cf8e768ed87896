"""`workers: N` spreads a round's clients over N processes and gives one process's numbers, bit for bit."""

import json

import pytest

from manytask.config import validate
from manytask.errors import ManytaskError
from manytask.experiment import Experiment
from manytask.run import resume, run_config

pytestmark = pytest.mark.slow  # spawns worker processes that import torch and rebuild the benchmark

CONFIG = {
    "name": "workers", "rounds": 3, "seed": 0, "reference": None, "participation": 0.5, "dropout": 0.2,
    # FedAvg, FedProx, a plug-in over FedAvg, and two methods with client state (FedPer's local block, FedDyn's g)
    "method": ["fedavg", {"name": "fedprox", "mu": 0.1},
               {"name": "fedavg", "label": "fedavg+dea", "plugin": {"name": "dea", "rho": 0.3}}, "fedper", "feddyn"],
    "benchmark": {"name": "digits-tasks", "tasks": ["digit", "parity", "rotated"]},
    "federation": {"num_clients": 6, "tasks": {"kind": "dirichlet", "zeta": 0.5}, "samples": {"kind": "iid"}},
    "model": {"backbone": "mlp", "hidden": [32]},
    "train": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "local_epochs": 1, "batch_size": 32},
    "execution": "sequential",  # worker processes run clients one after another; batched equals it within rounding
}
LABELS = ["fedavg", "fedprox", "fedavg+dea", "fedper", "feddyn"]


def _rows(run_dir):
    kept = ("round", "sampled", "dropped", "bytes_up", "bytes_down", "fit", "eval", "average")
    return [{k: row.get(k) for k in kept} for row in map(json.loads, run_dir.read_text().splitlines())]


def test_two_workers_give_one_process_numbers_and_resume_the_same(tmp_path):
    one = run_config(validate(CONFIG), tmp_path / "one")
    two = run_config(validate({**CONFIG, "workers": 2}), tmp_path / "two")
    for label in LABELS:
        assert two[label]["tasks"] == one[label]["tasks"], label
        assert _rows(tmp_path / "two" / label / "metrics.jsonl") == _rows(tmp_path / "one" / label / "metrics.jsonl")
        assert two[label]["client_compute_seconds"] > 0
    stateful = {**CONFIG, "workers": 2, "method": ["fedper", "feddyn"]}  # client states travel back and are resumed
    assert run_config(validate(stateful), tmp_path / "cut", stop_after=2) is None
    resumed = resume(tmp_path / "cut")
    for label in ("fedper", "feddyn"):
        assert resumed[label]["tasks"] == one[label]["tasks"], label
        assert _rows(tmp_path / "cut" / label / "metrics.jsonl") == _rows(tmp_path / "one" / label / "metrics.jsonl")


def test_workers_are_for_the_local_engine_only():
    with pytest.raises(ManytaskError, match="set workers: 1"):
        Experiment.build(validate({**CONFIG, "method": "fedavg", "workers": 2, "engine": "flower-sim"}))

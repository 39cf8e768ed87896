"""`workers: N` spreads a round's clients over N processes and gives one process's numbers, bit for bit (sequential
execution); batched, each worker batches its share, within the executor's tolerance."""

import json

import pytest

from manytask.config import validate
from manytask.errors import ManytaskError
from manytask.experiment import Experiment
from manytask.launch import resume, run_config

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


def test_workers_batch_their_shares_of_a_round_and_resume_the_same(tmp_path, capfd):
    """Under execution auto every worker trains its share of the round as batched computations (a worker prints
    the one-line notice where it cannot: GradNorm's learned weights); the numbers are the sequential ones within the
    batched tolerance, and a run stopped and resumed gives the same numbers as one that was not."""
    config = {**CONFIG, "execution": "auto", "workers": 2, "method": ["feddyn", "gradnorm"], "dropout": 0.0,
              "rounds": 2}
    sequential = run_config(validate({**config, "execution": "sequential", "workers": 1}), tmp_path / "seq")
    capfd.readouterr()
    batched = run_config(validate(config), tmp_path / "auto")
    notices = [line for line in capfd.readouterr().err.splitlines() if "one after another" in line]
    assert notices and all("gradnorm" in line for line in notices), notices
    for label, summary in sequential.items():
        for task, metrics in summary["tasks"].items():
            assert batched[label]["tasks"][task]["loss"] == pytest.approx(metrics["loss"], rel=1e-4), (label, task)
    assert run_config(validate({**config, "method": ["feddyn"]}), tmp_path / "cut", stop_after=1) is None
    resumed = resume(tmp_path / "cut")
    assert resumed["feddyn"]["tasks"] == batched["feddyn"]["tasks"]


def test_workers_are_for_the_local_engine_only():
    with pytest.raises(ManytaskError, match="set workers: 1"):
        Experiment.build(validate({**CONFIG, "method": "fedavg", "workers": 2, "engine": "flower-sim"}))


def test_a_rounds_clients_are_shared_by_their_work():
    """Largest first, each to the lightest share (ties: the first): 10 → A, 8 → B, 5 → B (13), 5 → A (15),
    1 → B (14)."""
    from manytask.engine.pool import shares

    assert shares([4, 3, 2, 1, 0], {0: 10, 1: 8, 2: 5, 3: 5, 4: 1}, 2) == [[0, 3], [1, 2, 4]]
    assert shares([7], {7: 3}, 2) == [[7]]  # no empty share

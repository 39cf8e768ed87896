"""`manytask tune`: equal Optuna budgets per member over declared search spaces, scored on a validation split of the
training data (never the test set), stored in SQLite so a killed study resumes to the uninterrupted result."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import optuna
import pytest
import torch
import yaml
from typer.testing import CliRunner

from manytask.cli import app
from manytask.config import validate
from manytask.errors import ManytaskError
from manytask.experiment import make_benchmark
from manytask.search_space import log_range, uniform
from manytask.tune import STUDY, TUNED, member_space, repeat_score, tune, validation_benchmark, with_values
from tests.conftest import small_config_dict

TINY = small_config_dict(method=["fedavg", "fedprox"], rounds=3, seeds=[0, 1],
                         tune={"trials": 4, "startup_trials": 2})


def _quiet(_: str) -> None:
    pass


def test_each_member_tunes_its_declared_space_and_the_learning_rate():
    config = validate(small_config_dict(method=["fedavg", "fedprox", {"name": "fedavg", "plugin": "dea"}]))
    spaces = [member_space(config, entry) for entry in config.methods]
    lr = log_range(0.05 / 10, 0.05 * 3)  # around the config's own rate
    assert spaces[0] == {"train.lr": lr}
    assert spaces[1] == {"train.lr": lr, "mu": log_range(1e-3, 1.0)}
    assert spaces[2] == {"train.lr": lr, "plugin.rho": uniform(0.05, 0.9)}


def test_a_config_overrides_or_drops_dimensions():
    config = validate(small_config_dict(method="fedprox", tune={"space": {"fedprox": {
        "mu": {"low": 0.1, "high": 0.2}, "train.lr": None, "train.momentum": {"choices": [0.0, 0.9]}}}}))
    space = member_space(config, config.methods[0])
    assert space == {"mu": uniform(0.1, 0.2), "train.momentum": space["train.momentum"]}
    assert space["train.momentum"].choices == (0.0, 0.9)
    bad = validate(small_config_dict(method="fedprox", tune={"space": {"fedprox": {"mu": {"low": 1, "high": 0}}}}))
    with pytest.raises(ManytaskError, match=r"fedprox\.mu: a range needs low < high"):
        member_space(bad, bad.methods[0])


def test_tuned_values_go_where_they_belong():
    entry = {"name": "fedavg", "plugin": "dea", "train": {"batch_size": 8}}
    tuned = with_values(entry, {"train.lr": 0.1, "plugin.rho": 0.3, "guard": 5})
    assert tuned == {"name": "fedavg", "plugin": {"name": "dea", "rho": 0.3}, "train": {"batch_size": 8, "lr": 0.1},
                     "guard": 5}
    assert entry == {"name": "fedavg", "plugin": "dea", "train": {"batch_size": 8}}  # untouched


def test_the_validation_split_is_carved_from_training_data_only():
    benchmark = make_benchmark(validate(small_config_dict()))
    carved = validation_benchmark(benchmark, 0.25, seed=3)
    for name, task in benchmark.tasks.items():
        held = carved.tasks[name]
        assert len(held.y_test) == round(0.25 * len(task.y_train))
        assert len(held.y_train) + len(held.y_test) == len(task.y_train)
        rows = {(*tuple(x.flatten().tolist()), int(y)) for x, y in zip(task.x_train, task.y_train, strict=True)}
        for x, y in zip(held.x_test, held.y_test, strict=True):  # every validation sample is a training sample
            assert (*tuple(x.flatten().tolist()), int(y)) in rows
    again = validation_benchmark(benchmark, 0.25, seed=3)
    assert all(torch.equal(again.tasks[n].x_test, carved.tasks[n].x_test) for n in benchmark.tasks)


def test_no_test_sample_is_used_in_tuning(tmp_path, monkeypatch):
    clean = yaml.safe_load((tune(validate(TINY), tmp_path / "clean", progress=_quiet)).read_text())

    def poisoned(config):
        benchmark = make_benchmark(config)
        for task in benchmark.tasks.values():
            task.x_test = torch.full_like(task.x_test, float("nan"))
            task.y_test = torch.randint_like(task.y_test, 0, 2)
        return benchmark

    monkeypatch.setattr("manytask.tune.make_benchmark", poisoned)
    dirty = yaml.safe_load((tune(validate(TINY), tmp_path / "dirty", progress=_quiet)).read_text())
    assert dirty["method"] == clean["method"]
    assert dirty["tuned"]["members"] == clean["tuned"]["members"]


def test_the_tuned_config_carries_the_budget_and_runs_over_the_seeds(tmp_path):
    path = tune(validate(TINY), tmp_path / "t", progress=_quiet)
    tuned = validate(yaml.safe_load(path.read_text()))
    assert tuned.seeds == [0, 1] and [e["name"] for e in tuned.methods] == ["fedavg", "fedprox"]
    record = tuned.tuned
    assert record["trials"] == 4 and set(record["members"]) == {"fedavg", "fedprox"}
    for label, member in record["members"].items():
        finished = member["trials"]["complete"] + member["trials"]["pruned"]
        assert finished == 4, label  # the same budget for every member
        study = optuna.load_study(study_name=label, storage=f"sqlite:///{tmp_path / 't' / STUDY}")
        assert study.best_params == member["best"] and study.best_value == member["validation_score"]
    fedprox = tuned.methods[1]
    assert fedprox["mu"] == record["members"]["fedprox"]["best"]["mu"]
    assert fedprox["train"]["lr"] == record["members"]["fedprox"]["best"]["train.lr"]
    assert not (tmp_path / "t" / "trials").exists()  # no trial's checkpoints left behind


KILLER = textwrap.dedent("""
    import os, signal, sys
    from manytask.config import validate
    from manytask.tune import tune
    from tests.test_tune import TINY

    class Killer:  # SIGKILLs this process in round 2 of the third trial: driven by the round counter, not a clock
        trials = 0
        def started(self, label, total, done):
            Killer.trials += 1
        def finished_round(self, row):
            if Killer.trials == 3 and row["round"] == 2:
                os.kill(os.getpid(), signal.SIGKILL)

    tune(validate(TINY), sys.argv[1], observer=Killer(), progress=lambda line: None)
""")


@pytest.mark.slow
def test_a_killed_study_resumes_from_sqlite_to_the_uninterrupted_best(tmp_path):
    whole = tune(validate(TINY), tmp_path / "whole", progress=_quiet)
    killed = subprocess.run([sys.executable, "-c", KILLER, str(tmp_path / "cut")], capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    assert not (tmp_path / "cut" / TUNED).exists()
    study = optuna.load_study(study_name="fedavg", storage=f"sqlite:///{tmp_path / 'cut' / STUDY}")
    assert [t.state.name for t in study.trials][-1] == "RUNNING" and len(study.trials) == 3
    said: list[str] = []
    resumed = tune(validate(TINY), tmp_path / "cut", progress=said.append)
    assert "fedavg: 1 trial(s) cut off by an interruption are drawn again." in said
    first, second = yaml.safe_load(whole.read_text()), yaml.safe_load(resumed.read_text())
    assert second["method"] == first["method"]
    for label, member in first["tuned"]["members"].items():
        again = second["tuned"]["members"][label]
        assert (again["best"], again["validation_score"]) == (member["best"], member["validation_score"])
    assert second["tuned"]["members"]["fedavg"]["trials"]["failed"] == 1


def test_the_command_tunes_resumes_and_refuses_another_config(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(TINY))
    runner = CliRunner()
    first = runner.invoke(app, ["tune", str(config), "--trials", "2", "--out", str(tmp_path / "t")])
    assert first.exit_code == 0, first.output
    assert "fedprox: trial 2/2" in first.output and f"manytask run {tmp_path / 't' / TUNED}" in first.output
    again = runner.invoke(app, ["tune", "--resume", str(tmp_path / "t")])
    assert again.exit_code == 0 and ": trial " not in again.output  # the budget is spent: no new trial
    other = runner.invoke(app, ["tune", str(config), "--trials", "3", "--out", str(tmp_path / "t")])
    assert other.exit_code == 2 and "holds the tuning of another config" in other.output
    record = json.loads((tmp_path / "t" / "tuning.json").read_text())
    assert record["trials"] == 2


def test_the_rate_range_follows_the_members_own_rate():
    config = validate(small_config_dict(method=[{"name": "fedavg", "train": {"lr": 0.2}}]))
    lr = member_space(config, config.methods[0])["train.lr"]
    assert lr.log and (lr.low, lr.high) == pytest.approx((0.02, 0.6))


def _score(tmp_path, name, seed, repeats, score="mean"):
    config = small_config_dict(method="fedavg", seed=seed, rounds=2, tune={
        "trials": 1, "repeats": repeats, "pruning": False, "score": score,
        "space": {"fedavg": {"train.lr": {"choices": [0.05]}}}})
    tune(validate(config), tmp_path / name, progress=_quiet)
    return json.loads((tmp_path / name / "tuning.json").read_text())["members"]["fedavg"]["validation_score"]


def test_repeats_score_a_trial_by_the_mean_over_seeds(tmp_path):
    first, second = _score(tmp_path, "a", 7, 1), _score(tmp_path, "b", 8, 1)
    assert first != second
    assert _score(tmp_path, "both", 7, 2) == pytest.approx((first + second) / 2)
    assert _score(tmp_path, "worst", 7, 2, "worst") == pytest.approx(min(first, second))  # accuracy: higher is better


def test_the_worst_repeat_is_the_lowest_score_when_higher_is_better_else_the_highest():
    assert repeat_score([0.8, 0.2, 0.5], "worst", "maximize") == 0.2
    assert repeat_score([0.8, 0.2, 0.5], "worst", "minimize") == 0.8
    assert repeat_score([0.8, 0.2, 0.5], "mean", "minimize") == pytest.approx(0.5)

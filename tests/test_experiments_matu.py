"""MaTU's experiments: the normalized-accuracy, upload and task-relatedness measures on hand-made runs, the three
runners' units (labels, rounds, allocations) without running them, and the relatedness figure at smoke scale."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from manytask.engine.checkpoint import Checkpoint, save_checkpoint
from manytask.errors import ManytaskError
from manytask.experiments import matu
from manytask.experiments.catalogue import experiment_by_id
from manytask.experiments.runner import scale_config
from manytask.report.runs import RunRecord
from tests.test_docs import ROOT


def record(tasks: dict[str, float], label: str = "m", path: Path = Path("."), **summary) -> RunRecord:
    """A finished run whose tasks scored `tasks` (accuracy)."""
    return RunRecord(path, {"label": label, "tasks": {t: {"accuracy": a} for t, a in tasks.items()},
                            "main_metric": dict.fromkeys(tasks, "accuracy"), **summary})


def test_normalized_is_the_mean_ratio_to_individual_on_the_same_seed():
    reference = record({"a": 0.8, "b": 0.5}, "individual")
    member = record({"a": 0.6, "b": 0.5}, "matu")
    measure = matu.normalized()
    assert measure(member, {"matu": member, "individual": reference}) == pytest.approx(100 * (0.75 + 1.0) / 2)
    assert measure(reference, {"individual": reference}) == pytest.approx(100.0)
    assert measure(member, {"matu": member}) is None  # no reference on that seed


def test_upload_per_client_averages_rounds_and_clients_in_kb():
    rows = [{"round": 1, "bytes_up": {"0": 1000, "1": 3000}}, {"round": 2, "bytes_up": {"0": 2000}}]
    run = RunRecord(Path("."), {}, rows)
    assert matu.upload_per_client(run, {}) == pytest.approx(2.0)
    silent = RunRecord(Path("."), {}, [{"round": 1, "bytes_up": {"0": 0}}])
    assert matu.upload_per_client(silent, {}) is None  # Individual sends nothing


def test_pearson_by_hand():
    assert matu.pearson([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert matu.pearson([1, 1, 1], [1, 2, 3]) is None


def vectors_run(tmp_path: Path, groups: dict[str, int]) -> RunRecord:
    """A MaTU run whose server checkpointed three task vectors: S(a,b) = 0.75, S(a,c) = 0.25, S(b,c) = 0.5."""
    vectors = {"a": [2.0, 1.0, 1.0, 1.0], "b": [1.0, 1.0, 1.0, -1.0], "c": [-1.0, -1.0, 1.0, -1.0]}
    server = {f"vector/{t}": torch.tensor(v) for t, v in vectors.items()}
    save_checkpoint(tmp_path / "checkpoint.safetensors", Checkpoint(3, server, {}))
    return record(dict.fromkeys(vectors, 0.5), "matu", tmp_path, task_groups=groups)


def test_relatedness_measures_on_checkpointed_vectors_by_hand(tmp_path):
    run = vectors_run(tmp_path, {"a": 0, "b": 0, "c": 1})
    tasks, vectors = matu.task_vectors(run)
    assert sorted(tasks) == ["a", "b", "c"]
    order = [tasks.index(t) for t in "abc"]
    similarity = matu.sign_similarity(vectors)[order][:, order]
    assert matu.off_diagonal(similarity) == pytest.approx([0.75, 0.25, 0.5])
    # cos(a,b) = 3/(2√7), cos(a,c) = −3/(2√7), cos(b,c) = 0: S and cosine line up exactly
    assert matu.off_diagonal(matu.cosine_similarity(vectors)[order][:, order]) == pytest.approx(
        [3 / (2 * 7 ** 0.5), -3 / (2 * 7 ** 0.5), 0.0])
    assert matu.pearson_sign_against("cosine")(run, {}) == pytest.approx(1.0)
    assert matu.mean_sign_similarity(within=True)(run, {}) == pytest.approx(0.75)
    assert matu.mean_sign_similarity(within=False)(run, {}) == pytest.approx(0.375)
    assert matu.groups_recovered("sign")(run, {}) == pytest.approx(1.0)  # {a, b} | {c}


def test_groups_recovered_scores_a_wrong_grouping_below_zero(tmp_path):
    # the clustering {a, b} | {c} against the truth {a} | {b, c}: ARI = (0 − 1/3) / (1 − 1/3) = −1/2
    assert matu.groups_recovered("cosine")(vectors_run(tmp_path, {"a": 0, "b": 1, "c": 1}), {}) == pytest.approx(-0.5)
    assert matu.groups_recovered("sign")(record({"a": 1.0}), {}) is None  # no checkpoint: another method


def test_task_accuracy_reads_one_task_in_percent():
    run = record({"permuted": 0.75, "digit": 0.5})
    assert matu.task_accuracy("permuted")(run, {}) == pytest.approx(75.0)
    assert matu.task_accuracy("rotated")(run, {}) is None  # the run does not have the task


def test_sign_similarity_bound_gives_the_lowest_and_highest_pair(tmp_path):
    run = vectors_run(tmp_path, {"a": 0, "b": 0, "c": 1})  # S: 0.75, 0.25, 0.5
    assert matu.sign_similarity_bound(highest=False)(run, {}) == pytest.approx(0.25)
    assert matu.sign_similarity_bound(highest=True)(run, {}) == pytest.approx(0.75)
    assert matu.sign_similarity_bound(highest=True)(record({"a": 1.0}), {}) is None  # no checkpoint


def test_thirty_clients_analysis_runs_the_pages_four_members(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    todo = matu.units(scale_config(experiment_by_id("matu/analysis-thirty-clients").scale("cpu"), (0,)), tmp_path)
    assert [u.label for u in todo] == ["matu", "matu-none", "fedavg-per-task", "matfl"]
    config = yaml.safe_load(todo[1].config)
    assert config["federation"]["num_clients"] == 30 and config["federation"]["tasks"]["zeta"] == 0.1
    assert config["method"]["cross_task"] == "none"


def test_windows_cover_every_task_and_wrap():
    tasks = [f"t{i}" for i in range(6)]
    assert matu.windows(tasks, 2, 3) == [["t0", "t1", "t2"], ["t3", "t4", "t5"]]
    assert matu.windows(tasks, 2, 6)[1] == ["t3", "t4", "t5", "t0", "t1", "t2"]
    with pytest.raises(ManytaskError, match="divides"):
        matu.windows(tasks, 4, 3)


def planned(experiment_id: str, scale_name: str, monkeypatch, tmp_path) -> list:
    """The units an experiment's runner would run at a scale (nothing is run)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(matu, "run_with_estimate", lambda todo, workers, probe: None)
    experiment = experiment_by_id(experiment_id)
    scale = experiment.scale(scale_name)
    config = scale_config(scale, (0,))
    return matu.RUNNERS[experiment.runner](experiment, scale, config, tmp_path, None, False)


def test_tasks_per_client_runner_sweeps_k_and_runs_the_reference_once(monkeypatch, tmp_path):
    todo = planned("matu/fig5-tasks-per-client", "cpu", monkeypatch, tmp_path)
    labels = [unit.label for unit in todo]
    assert labels.count("individual") == 1
    assert {"matu k=3", "matu k=6", "matu k=15", "matu k=30", "matfl k=30", "fedavg-per-task k=3"} <= set(labels)
    assert len({unit.out for unit in todo}) == len(todo) == 13
    config = yaml.safe_load(next(u for u in todo if u.label == "matu k=6").config)
    groups = config["federation"]["tasks"]["groups"]
    assert config["federation"]["num_clients"] == 10 and all(len(group) == 6 for group in groups)
    assert len({task for group in groups for task in group}) == 30


def test_config_set_runner_labels_each_config_and_shares_individual(monkeypatch, tmp_path):
    todo = planned("matu/fig6a-conflict-groups", "cpu", monkeypatch, tmp_path)
    labels = [unit.label for unit in todo]
    assert labels.count("individual") == 1 and len(labels) == 13
    groups = {u.label: yaml.safe_load(u.config)["federation"]["tasks"]["groups"][0] for u in todo}
    assert groups["matu no conflict"] == ["permuted", "permuted-parity", "permuted-mod3"]
    assert groups["matu 3-conflict"] == ["permuted", "permuted2-parity", "permuted3-mod3"]


def test_paper_scale_gives_matfl_the_papers_300_rounds(monkeypatch, tmp_path):
    todo = planned("matu/table1-single-task", "paper", monkeypatch, tmp_path)
    configs = {u.label: yaml.safe_load(u.config) for u in todo}
    assert set(configs) == {"matu", "fedavg-per-task", "fedprox", "ntk-fedavg", "fedper", "matfl", "individual"}
    assert configs["matfl"]["rounds"] == 300 and configs["matu"]["rounds"] == 100
    assert configs["matu"]["federation"]["tasks"] == {"kind": "one-per-client"}
    assert configs["matu"]["participation"] == 0.2
    cpu = {u.label: yaml.safe_load(u.config)["rounds"] for u in planned("matu/table1-single-task", "cpu",
                                                                         monkeypatch, tmp_path)}
    assert set(cpu.values()) == {40}  # the stand-in gives every member the same rounds


@pytest.mark.slow
def test_task_relatedness_at_smoke_scale(tmp_path, monkeypatch):
    from manytask.experiments.reproduce import reproduce
    from manytask.report.plots import similarity_matrix
    from manytask.report.runs import load_run

    monkeypatch.chdir(ROOT)
    result, path = reproduce("matu/fig2-3-task-relatedness", "smoke", jobs=1, out=tmp_path, log=lambda _: None)
    assert path is None and set(result["values"]) == {"matu", "matu-none"}
    for cells in result["values"].values():
        (r,) = cells["r(S, cosine)"]
        assert -1 <= r <= 1
        assert all(-1 <= cells[c][0] <= 1 for c in ("ARI of S vs domains", "ARI of cosine vs domains"))
        assert all(0 <= cells[c][0] <= 1 for c in ("S within domains", "S across domains"))
    # the checkpointed vectors give the S the server logged in its last round
    run = load_run(tmp_path / "seed0" / "matu")
    logged_tasks, logged = similarity_matrix(run)
    tasks, vectors = matu.task_vectors(run)
    mine = matu.sign_similarity(vectors)
    for i, a in enumerate(tasks):
        for j, b in enumerate(tasks):
            assert float(mine[i, j]) == pytest.approx(logged[logged_tasks.index(a)][logged_tasks.index(b)], abs=1e-6)
    assert json.dumps(result["fingerprint"]["values"])  # every member's final losses are fingerprinted

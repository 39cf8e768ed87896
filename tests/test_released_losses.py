"""The task-grouping code's losses as choices (`train.losses`): "shifted-l1" for normals and "map-l1" for edge maps
against hand computations, their refusal where they do not fit, and a run that trains with them."""

import json

import pytest
import torch

from manytask.config import validate
from manytask.errors import ManytaskError
from manytask.experiment import Experiment
from manytask.launch import run_config
from manytask.tasks.task import TaskKind, TaskSpec

NORMALS = TaskSpec("normals", TaskKind.NORMALS, 3, "shifted-l1")
EDGES = TaskSpec("edge", TaskKind.EDGES, 1, "map-l1")


def _unit_x(n: int, size: int) -> torch.Tensor:
    """Normals (n, 3, size, size) that all point along x."""
    target = torch.zeros(n, 3, size, size)
    target[:, 0] = 1.0
    return target


def test_shifted_l1_on_a_constant_target_is_the_channel_mean_of_the_error():
    # output 0, target (1, 0, 0) everywhere: every shift sees |0 − 1| on one channel of three
    assert NORMALS.loss(torch.zeros(2, 3, 4, 4), _unit_x(2, 4)).item() == pytest.approx(1 / 3)
    # the raw output is compared (not normalized): 0.5 along x is 0.5 off, on one channel of three
    assert NORMALS.loss(torch.full((1, 3, 4, 4), 0.5) * _unit_x(1, 4), _unit_x(1, 4)).item() == pytest.approx(1 / 6)


def test_shifted_l1_forgives_a_one_pixel_shift_and_counts_unlabelled_pixels_as_zero():
    target = _unit_x(1, 6) * (torch.arange(6) < 3).view(1, 1, 1, 6)  # the left half labelled, the right unlabelled
    shifted = torch.roll(target, shifts=1, dims=3)  # the prediction one pixel to the right
    assert NORMALS.loss(shifted, target).item() == 0.0
    assert TaskSpec("n", TaskKind.NORMALS, 3).loss(shifted, target).item() > 0.1  # the kind's own loss is not
    # interior 4×4, labelled columns 1-2 (8 pixels), output 0: 8 pixels × 1 / (3 channels × 16 pixels)
    assert NORMALS.loss(torch.zeros(1, 3, 6, 6), target).item() == pytest.approx(8 / 48)


def test_shifted_l1_takes_each_samples_own_best_shift_and_averages_over_the_batch():
    target = _unit_x(2, 5)
    outputs = torch.stack([target[0], torch.zeros(3, 5, 5)])  # sample 0 exact, sample 1 off by 1/3 at every shift
    assert NORMALS.loss(outputs, target).item() == pytest.approx((0 + 1 / 3) / 2)


def test_map_l1_is_the_l1_of_the_predicted_map():
    targets = torch.tensor([1.0, 0.0, 0.0, 0.0]).view(1, 1, 2, 2)
    logits = torch.tensor([0.0, 0.0, 0.0, 0.0]).view(1, 1, 2, 2)  # σ = 0.5 everywhere
    assert EDGES.loss(logits, targets).item() == pytest.approx(0.5)
    big = torch.tensor([20.0, -20.0, -20.0, -20.0]).view(1, 1, 2, 2)  # σ ≈ the target
    assert EDGES.loss(big, targets).item() < 1e-8


def test_a_loss_that_does_not_fit_the_task_is_refused():
    with pytest.raises(ValueError, match="loss 'shifted-l1' is for normals tasks, not edges"):
        TaskSpec("edge", TaskKind.EDGES, 1, "shifted-l1")
    with pytest.raises(ValueError, match="unknown loss 'l2'"):
        TaskSpec("edge", TaskKind.EDGES, 1, "l2")
    with pytest.raises(ValueError, match="at least 3×3"):
        NORMALS.loss(torch.zeros(1, 3, 2, 2), _unit_x(1, 2))


def _config(losses: dict[str, str], execution: str = "sequential") -> dict:
    return {
        "name": "released", "method": "fedavg", "rounds": 2, "seed": 0, "eval_every": 2, "reference": None,
        "benchmark": {"name": "scenes", "tasks": "nyud-like", "size": 16, "train_per_task": 12, "test_size": 8,
                      "styles": 2},
        "federation": {"num_clients": 4, "tasks": {"kind": "one-per-client"}, "samples": {"kind": "iid"}},
        "model": {"backbone": "cnn", "channels": [4, 8], "norm": "batch", "decoder": {"width": 4}},
        "train": {"optimizer": "adamw", "lr": 0.001, "local_steps": 2, "batch_size": 4, "losses": losses},
        "execution": execution,
    }


def test_train_losses_name_tasks_the_benchmark_has_and_losses_that_fit_them():
    with pytest.raises(ManytaskError, match=r"unknown task in train\.losses .* 'normal'; valid choices: depth, edge"):
        Experiment.build(validate(_config({"normal": "shifted-l1"})))
    with pytest.raises(ManytaskError, match=r"train\.losses: task 'depth': loss 'shifted-l1' is for normals tasks"):
        Experiment.build(validate(_config({"depth": "shifted-l1"})))


def test_a_run_trains_with_the_chosen_losses_and_reports_them_in_its_eval_loss(tmp_path):
    released = {"normals": "shifted-l1", "edge": "map-l1"}
    experiment = Experiment.build(validate(_config(released)))
    assert {n: s.loss_choice for n, s in experiment.setup.specs.items()} == {
        "semseg": None, "depth": None, "normals": "shifted-l1", "edge": "map-l1"}
    assert experiment.benchmark.tasks["edge"].spec.loss_choice == "map-l1"  # evaluation reads the same spec
    runs = {name: run_config(validate(_config(losses)), tmp_path / name)
            for name, losses in [("default", {}), ("released", released)]}
    tasks = {name: json.loads((tmp_path / name / "summary.json").read_text())["tasks"] for name in runs}
    for task in ("normals", "edge"):
        assert tasks["default"][task]["loss"] != tasks["released"][task]["loss"]
    assert 0 < tasks["released"]["edge"]["loss"] <= 1  # the L1 of a map in [0, 1] against a {0, 1} target

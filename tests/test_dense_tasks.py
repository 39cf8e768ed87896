"""Dense task kinds: losses by hand, kinds' metrics and directions, encoder–decoder models, evaluation over a
whole test set, and the prediction recorder."""

import math

import pytest
import torch

from manytask.client.trainer import TrainConfig, Trainer, evaluate
from manytask.errors import ManytaskError
from manytask.models.multitask import build_model, state_keys
from manytask.tasks.dense_losses import balanced_bce_loss, depth_loss, normals_loss, segmentation_loss
from manytask.tasks.dense_metrics import IGNORE_INDEX
from manytask.tasks.predictions import record_prediction, recording_predictions
from manytask.tasks.task import TaskKind, TaskSpec

SEG = TaskSpec("seg", TaskKind.SEGMENTATION, 3)
DEPTH = TaskSpec("depth", TaskKind.DEPTH, 1)
NORMALS = TaskSpec("normals", TaskKind.NORMALS, 3)
EDGE = TaskSpec("edge", TaskKind.EDGES, 1)


def test_depth_loss_ignores_pixels_without_a_measurement():
    outputs = torch.tensor([[[[1.0, 5.0], [2.0, 9.0]]]])
    targets = torch.tensor([[[[2.0, 0.0], [4.0, 0.0]]]])  # 0 = no measurement
    assert float(depth_loss(outputs, targets)) == pytest.approx((1 + 2) / 2)


def test_normals_loss_normalizes_the_prediction_and_skips_unlabeled_pixels():
    outputs = torch.tensor([[3.0, 0.0], [0.0, 1.0], [0.0, 0.0]]).view(1, 3, 1, 2)  # pixel 0: (3,0,0), pixel 1: (0,1,0)
    targets = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]).view(1, 3, 1, 2)  # pixel 1 unlabeled
    assert float(normals_loss(outputs, targets)) == pytest.approx(0.0)
    targets[0, :, 0, 0] = torch.tensor([0.0, 1.0, 0.0])  # now |(1,0,0) − (0,1,0)| = 2 over 3 components
    assert float(normals_loss(outputs, targets)) == pytest.approx(2 / 3)


def test_balanced_bce_weighs_the_rare_class_up():
    logits = torch.zeros(1, 1, 1, 4)  # p = 0.5 everywhere: each BCE term is ln 2
    targets = torch.tensor([[[[1.0, 0.0, 0.0, 0.0]]]])  # positive fraction 1/4
    # (0.75·ln2 + 3·0.25·ln2) / 4
    assert float(balanced_bce_loss(logits, targets)) == pytest.approx(1.5 * math.log(2) / 4)


def test_segmentation_loss_skips_ignored_pixels_and_an_all_ignored_batch_is_zero():
    logits = torch.tensor([[[[4.0, 0.0]], [[0.0, 0.0]], [[0.0, 4.0]]]])  # (1, 3, 1, 2)
    targets = torch.tensor([[[0, IGNORE_INDEX]]])
    expected = -torch.log_softmax(torch.tensor([4.0, 0.0, 0.0]), 0)[0]
    assert float(segmentation_loss(logits, targets)) == pytest.approx(float(expected))
    logits.requires_grad_(True)
    empty = segmentation_loss(logits, torch.full((1, 1, 2), IGNORE_INDEX))
    empty.backward()
    assert float(empty.detach()) == 0.0 and logits.grad is not None


@pytest.mark.parametrize(("kind", "main", "higher"), [
    (TaskKind.SEGMENTATION, "miou", True), (TaskKind.DEPTH, "rmse", False), (TaskKind.NORMALS, "mean_angle", False),
    (TaskKind.EDGES, "odsf", True), (TaskKind.SALIENCY, "maxf", True), (TaskKind.HEATMAP, "l1", False),
    (TaskKind.RECONSTRUCTION, "l1", False), (TaskKind.CLASSIFICATION, "accuracy", True),
])
def test_each_kind_names_its_main_metric_and_direction(kind, main, higher):
    spec = TaskSpec("t", kind, 3)
    assert (spec.main_metric, spec.higher_is_better) == (main, higher)
    assert spec.is_dense == (kind not in (TaskKind.CLASSIFICATION, TaskKind.REGRESSION))


def _model(specs, **params):
    return build_model("cnn", {"channels": [4, 8], **params}, (3, 8, 8), {s.name: s for s in specs}, seed=0)


def test_a_dense_model_outputs_maps_at_the_input_resolution_and_drops_the_unused_projection():
    model = _model([SEG, DEPTH, NORMALS])
    x = torch.rand(2, 3, 8, 8)
    assert model(x, "seg").shape == (2, 3, 8, 8)
    assert model(x, "depth").shape == (2, 1, 8, 8)
    outputs, features = model.forward_with_features(x, "normals")
    assert outputs.shape == (2, 3, 8, 8) and features.shape == (2, 8)  # pooled deepest level (8 channels)
    assert not any(key.startswith("backbone.project") for key in state_keys(model))


def test_a_model_with_dense_and_vector_tasks_keeps_the_projection():
    model = _model([SEG, TaskSpec("label", TaskKind.CLASSIFICATION, 4)])
    assert model(torch.rand(2, 3, 8, 8), "label").shape == (2, 4)
    assert any(key.startswith("backbone.project") for key in state_keys(model))


def test_a_backbone_without_a_pyramid_refuses_dense_tasks():
    with pytest.raises(ManytaskError, match="dense tasks \\(seg\\) need an encoder"):
        build_model("mlp", {"hidden": [8]}, (3, 8, 8), {"seg": SEG}, seed=0)


def test_decoder_params_set_the_fused_width():
    model = build_model("cnn", {"channels": [4, 8]}, (3, 8, 8), {"seg": SEG}, seed=0, decoder={"width": 5})
    assert model.heads["seg"].predict.weight.shape == (3, 5, 1, 1)


def test_dense_evaluation_does_not_depend_on_the_batch_size():
    model = _model([SEG, EDGE])
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(7, 3, 8, 8, generator=generator)
    seg = torch.randint(0, 3, (7, 8, 8), generator=generator)
    seg[0, :2] = IGNORE_INDEX
    edge = (torch.rand(7, 1, 8, 8, generator=generator) > 0.8).float()
    for spec, y in ((SEG, seg), (EDGE, edge)):
        whole, pieces = evaluate(model, spec, x, y, batch_size=7), evaluate(model, spec, x, y, batch_size=2)
        whole.pop("loss"), pieces.pop("loss")  # the loss is a mean of batch means (as in training)
        assert whole == pytest.approx(pieces, rel=1e-6)


def test_training_a_dense_model_lowers_its_loss():
    specs = {"depth": DEPTH}
    model = build_model("cnn", {"channels": [8, 8]}, (3, 8, 8), specs, seed=0)
    x = torch.rand(32, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    y = x.mean(dim=1, keepdim=True) + 0.5  # depth from brightness: learnable by a conv net
    before = evaluate(model, DEPTH, x, y)["rmse"]
    Trainer(TrainConfig(optimizer="adamw", lr=0.01, local_steps=60, batch_size=16), specs).train(
        model, {"depth": (x, y)}, seed=0, round_index=0, total_rounds=1)
    assert evaluate(model, DEPTH, x, y)["rmse"] < 0.5 * before


def test_the_recorder_keeps_the_first_batch_of_each_dense_task_only_while_open():
    x, y, out = torch.rand(6, 3, 2, 2), torch.rand(6, 1, 2, 2), torch.rand(6, 1, 2, 2)
    record_prediction(DEPTH, x, y, out)  # no recorder open: nothing happens
    with recording_predictions(2) as recorder:
        record_prediction(DEPTH, x, y, out)
        record_prediction(DEPTH, x + 1, y, out)  # a second view of the task: ignored
        record_prediction(TaskSpec("label", TaskKind.CLASSIFICATION, 2), x, y, out)  # not dense: ignored
    assert list(recorder.examples) == ["depth"]
    assert torch.equal(recorder.examples["depth"]["inputs"], x[:2])
    assert sorted(recorder.flat()) == ["depth/inputs", "depth/outputs", "depth/targets"]


def test_a_linearized_dense_model_equals_the_model_at_its_start_and_moves_linearly():
    from manytask.models.linearized import Linearized

    model = _model([SEG, DEPTH])
    linear = Linearized(model)
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    assert torch.allclose(linear(x, "seg"), model(x, "seg"), atol=1e-6)
    start = {n: p.detach().clone() for n, p in model.backbone.named_parameters()}
    with torch.no_grad():
        for p in model.backbone.parameters():
            p.add_(1e-3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(4)))
    moved = linear(x, "depth")  # the first-order expansion stays close to the moved model for a small step
    assert torch.allclose(moved, model(x, "depth"), atol=1e-3) and not torch.allclose(moved, model(x, "depth"), atol=0)
    assert all(torch.equal(linear.start[n], start[n]) for n in start)


def test_a_linearized_backbone_with_batch_norm_is_refused():
    from manytask.models.linearized import Linearized

    with pytest.raises(ManytaskError, match="cannot have BatchNorm layers"):
        Linearized(_model([SEG], norm="batch"))

"""Encoder–decoder rounds batched: every task kind's row loss, and every alternative loss's, equals `TaskSpec.loss`
on a row's real samples, and a round of dense clients (a CNN or a ResNet encoder with BatchNorm, one FCN decoder per
task) trained batched gives each client its sequential result within `TOLERANCE`."""

import pytest
import torch
from torch.func import vmap

from manytask.client.trainer import TrainConfig, Trainer
from manytask.execution.batched import TOLERANCE, train_batched
from manytask.execution.budget import client_bytes
from manytask.execution.losses import ALTERNATIVE_ROW_LOSSES, ROW_LOSSES, row_loss
from manytask.execution.plan import ClientPlan, Unbatchable
from manytask.models.multitask import BUFFER_PREFIX, build_model
from manytask.tasks.dense_losses import ALTERNATIVES
from manytask.tasks.dense_metrics import IGNORE_INDEX
from manytask.tasks.task import TaskKind, TaskSpec
from tests.batched_support import before_norm

SIZE = 8
CHANNELS = {TaskKind.SEGMENTATION: 3, TaskKind.DEPTH: 1, TaskKind.NORMALS: 3, TaskKind.EDGES: 1,
            TaskKind.SALIENCY: 1, TaskKind.HEATMAP: 2, TaskKind.RECONSTRUCTION: 3}
SPECS = {kind.value: TaskSpec(kind.value, kind, channels) for kind, channels in CHANNELS.items()}
VECTOR = {"class": TaskSpec("class", TaskKind.CLASSIFICATION, 3), "reg": TaskSpec("reg", TaskKind.REGRESSION, 2)}
# the task-grouping code's losses in place of the kinds' own (`train.losses`)
RELEASED = {**SPECS, **{kind.value: TaskSpec(kind.value, kind, CHANNELS[kind], loss) for kind, loss in
                        [(TaskKind.NORMALS, "shifted-l1"), (TaskKind.EDGES, "map-l1"), (TaskKind.SALIENCY, "map-l1")]}}
ROW_SPECS = [*SPECS.values(), *VECTOR.values(), *(s for s in RELEASED.values() if s.loss_choice is not None)]


def _targets(kind: TaskKind, n: int, g: torch.Generator, labelled: bool = True) -> torch.Tensor:
    """Targets of the kind's contract (`tasks/dense_losses.py`), some pixels unlabelled; none with `labelled` off."""
    shape = (n, CHANNELS[kind], SIZE, SIZE)
    if kind is TaskKind.SEGMENTATION:
        y = torch.randint(0, CHANNELS[kind], (n, SIZE, SIZE), generator=g)
        hole = torch.rand(n, SIZE, SIZE, generator=g) < 0.3
        return torch.where(hole | (not labelled), IGNORE_INDEX, y)
    if kind is TaskKind.DEPTH:
        y = torch.rand(shape, generator=g) + 0.5
        return y * (torch.rand(shape, generator=g) > 0.2) * labelled
    if kind is TaskKind.NORMALS:
        y = torch.nn.functional.normalize(torch.randn(shape, generator=g), dim=1)
        return y * (torch.rand(n, 1, SIZE, SIZE, generator=g) > 0.2) * labelled
    if kind in (TaskKind.EDGES, TaskKind.SALIENCY):
        return (torch.rand(shape, generator=g) < 0.1).float()
    return torch.randn(shape, generator=g)


@pytest.mark.parametrize("spec", ROW_SPECS, ids=lambda s: s.kind.value + (f"-{s.loss_choice}" if s.loss_choice else ""))
def test_each_kinds_row_loss_is_its_loss_on_the_real_samples(spec):
    """Rows of 5 real samples padded to 8 (padding: copies of real samples, as the executor pads), one row with
    nothing labelled; the loss and its gradient against `TaskSpec.loss` on the real samples alone, under `vmap`."""
    assert set(ROW_LOSSES) == set(TaskKind) == {s.kind for s in ROW_SPECS}
    assert set(ALTERNATIVE_ROW_LOSSES) == set(ALTERNATIVES) == {s.loss_choice for s in ROW_SPECS} - {None}
    g = torch.Generator().manual_seed(7)
    kind = spec.kind
    channels = spec.num_outputs
    rows, batch, real = 3, 8, 5
    out_shape = (batch, channels, SIZE, SIZE) if spec.is_dense else (batch, channels)
    outputs = torch.randn(rows, *out_shape, generator=g, requires_grad=True)
    if spec.is_dense:
        targets = torch.stack([_targets(kind, batch, g, labelled=r != 2) for r in range(rows)])
    elif kind is TaskKind.CLASSIFICATION:
        targets = torch.randint(0, channels, (rows, batch), generator=g)
    else:
        targets = torch.randn(rows, batch, channels, generator=g)
    targets[:, real:] = targets[:, :1]  # padding points at a real sample
    weight = torch.cat([torch.full((rows, real), 1 / real), torch.zeros(rows, batch - real)], dim=1)
    got = vmap(row_loss(spec))(outputs, targets, weight)
    (got_grad,) = torch.autograd.grad(got.sum(), outputs)
    expected = torch.stack([spec.loss(outputs[r, :real], targets[r, :real]) for r in range(rows)])
    (expected_grad,) = torch.autograd.grad(expected.sum(), outputs)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_grad, expected_grad, rtol=1e-5, atol=1e-7)
    assert expected_grad[:, real:].abs().sum() == 0 and got_grad.abs().sum() > 0


ENCODERS = {  # (backbone, its params, the decoders' BatchNorm)
    "cnn-bn": ("cnn", {"channels": [4, 6], "norm": "batch"}, "none"),
    "resnet-bn": ("resnet18", {"width": 4, "norm": "batch"}, "none"),
    "cnn-bn-decoders-bn": ("cnn", {"channels": [4, 6], "norm": "batch"}, "batch"),  # FedDEA's Swin config's
}
FIRST_LAYER = {"cnn-bn": "backbone.features.0.weight", "resnet-bn": "backbone.conv1.weight",
               "cnn-bn-decoders-bn": "backbone.features.0.weight"}
# (seed, tasks and sizes, tasks label the same inputs): one task each, several tasks on shared or on own images,
# different step counts and last batches. A last batch of one sample (normalized with the running statistics where the
# ResNet's deepest maps are 1×1) only in one-task clients: see `MaskedBatchNorm`.
CLIENTS = [
    (1, {"segmentation": 11}, False), (2, {"depth": 6}, False), (3, {"normals": 9, "edges": 9}, True),
    (4, {"segmentation": 6, "depth": 10}, False), (5, {"edges": 14}, False), (6, {"saliency": 7}, False),
]


def _model(kind: str, specs: dict[str, TaskSpec], dtype: torch.dtype = torch.float32):
    backbone, params, norm = ENCODERS[kind]
    return build_model(backbone, params, (3, SIZE, SIZE), specs, seed=3, decoder={"width": 5, "norm": norm}).to(dtype)


def _data(seed: int, sizes: dict[str, int], shared: bool, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(max(sizes.values()), 3, SIZE, SIZE, generator=g)
    data = {task: (x[:n] if shared else torch.randn(n, 3, SIZE, SIZE, generator=g),
                   _targets(SPECS[task].kind, n, g)) for task, n in sizes.items()}
    return {task: (x.to(dtype), y.to(dtype) if y.is_floating_point() else y) for task, (x, y) in data.items()}


def _start(model, seed: int) -> dict[str, torch.Tensor]:
    state = {n: p.detach() + 0.01 * seed for n, p in model.named_parameters()}
    return {**state, **{n: b.detach().clone() for n, b in model.named_buffers()}}


SGD = {"momentum": 0.9, "weight_decay": 0.01, "grad_clip": 0.5, "local_epochs": 1}
ADAMW = {"optimizer": "adamw", "lr": 0.005, "weight_decay": 0.01, "local_steps": 3}


@pytest.mark.parametrize(("encoder", "train", "dtype", "specs"), [
    ("cnn-bn", SGD, torch.float32, SPECS), ("cnn-bn", ADAMW, torch.float32, SPECS),
    ("resnet-bn", SGD, torch.float32, SPECS),
    # Adam divides by the root of tiny second moments, which amplifies float32 rounding in this ResNet's 1×1 deepest
    # maps: sequential float32 training itself is 2e-3 off float64 here. So the two paths are compared in float64.
    ("resnet-bn", ADAMW, torch.float64, SPECS),
    ("cnn-bn", SGD, torch.float32, RELEASED),
    ("cnn-bn-decoders-bn", SGD, torch.float32, SPECS),  # each (client, task) pair's decoder statistics its own
], ids=["cnn-sgd-clip", "cnn-adamw", "resnet-sgd-clip", "resnet-adamw-float64", "cnn-sgd-released-losses",
        "cnn-sgd-decoders-bn"])
def test_a_dense_round_batched_gives_each_client_its_sequential_result(encoder, train, dtype, specs):
    trainer = Trainer(TrainConfig(**{"lr": 0.05, "batch_size": 4, **train}), specs)
    template, model = _model(encoder, specs, dtype), _model(encoder, specs, dtype)
    plans = [ClientPlan(template, trainer, 0, 10, {}, _data(seed, sizes, shared, dtype), _start(model, seed), seed,
                        []) for seed, sizes, shared in CLIENTS]
    results = train_batched(plans)
    noisy = before_norm(template) if trainer.config.optimizer == "adamw" and dtype == torch.float32 else set()
    for plan, result in zip(plans, results, strict=True):
        sequential = _model(encoder, specs, dtype)
        sequential.load_state_dict(plan.start, strict=False)
        report = trainer.train(sequential, plan.data, plan.seed, 0, 10)
        assert result.report.steps == report.steps
        for task in plan.data:
            assert result.report.mean_loss[task] == pytest.approx(report.mean_loss[task], rel=1e-4)
        expected = {**{n: p.detach() for n, p in sequential.named_parameters()},
                    **{BUFFER_PREFIX + n: b for n, b in sequential.named_buffers()}}
        for name, value in expected.items():
            if name in noisy:
                continue
            torch.testing.assert_close(result.params[name].to(value.dtype), value, **TOLERANCE, msg=name)
        first = FIRST_LAYER[encoder]
        assert not torch.equal(result.params[first], plan.start[first])


def test_a_round_mixing_dense_and_vector_tasks_is_refused():
    specs = {**SPECS, **VECTOR}
    trainer = Trainer(TrainConfig(batch_size=4, local_steps=1), specs)
    model = _model("cnn-bn", specs)
    g = torch.Generator().manual_seed(0)
    vector = {"class": (torch.randn(5, 3, SIZE, SIZE, generator=g), torch.randint(0, 3, (5,), generator=g))}
    plans = [ClientPlan(model, trainer, 0, 10, {}, _data(1, {"depth": 5}, False), _start(model, 1), 1, []),
             ClientPlan(model, trainer, 0, 10, {}, vector, _start(model, 2), 2, [])]
    with pytest.raises(Unbatchable, match="mixes dense tasks and vector tasks"):
        train_batched(plans)


def test_the_memory_estimate_counts_the_decoders_activations():
    """The CNN encoder (channels 4, 6, BatchNorm) on a 3×8×8 image, one FCN decoder (width 5, 3 classes), by hand,
    per sample in floats: encoder conv, BatchNorm, ReLU at 4×8×8 (3 × 256), pool 4×4×4 (64), conv, BatchNorm, ReLU
    at 6×4×4 (3 × 96); decoder laterals 5×8×8 and 5×4×4 (320 + 80), fuse conv and ReLU 5×8×8 (2 × 320), predict
    3×8×8 (192). Two tasks on images of their own are two passes."""
    trainer = Trainer(TrainConfig(batch_size=4, local_steps=1), SPECS)
    model = _model("cnn-bn", SPECS)
    start = _start(model, 1)
    parameters = sum(t.numel() * t.element_size() for t in start.values())
    per_sample = 4 * (3 * 256 + 64 + 3 * 96 + 320 + 80 + 2 * 320 + 192)
    one = ClientPlan(model, trainer, 0, 10, {}, _data(1, {"segmentation": 5}, False), start, 1, [])
    assert client_bytes(one) == 6 * parameters + 3 * 4 * per_sample
    two = ClientPlan(model, trainer, 0, 10, {}, _data(1, {"segmentation": 5, "edges": 5}, False), start, 1, [])
    edges_decoder = 4 * (320 + 80 + 2 * 320 + 64)  # predicts one channel: 1×8×8
    encoder = 4 * (3 * 256 + 64 + 3 * 96)
    assert client_bytes(two) == 6 * parameters + 3 * 4 * (per_sample + encoder + edges_decoder)

"""The batched executor trains a round's clients as one computation and gives each client its sequential result
within `TOLERANCE`: BatchNorm with each client's statistics, per-client gradient clipping, momentum, weight decay,
AdamW, parameter terms, clients holding different tasks and different numbers of steps."""

import pytest
import torch

from manytask.client.trainer import TrainConfig, Trainer
from manytask.execution.batched import TOLERANCE, train_batched
from manytask.execution.plan import ClientPlan, Unbatchable
from manytask.methods.hosts.feddyn import LinearTermHook
from manytask.methods.hosts.fedprox import ProximalHook
from manytask.models.multitask import BUFFER_PREFIX, build_model
from manytask.tasks.task import TaskKind, TaskSpec
from tests.batched_support import before_norm

SPECS = {"a": TaskSpec("a", TaskKind.CLASSIFICATION, 3), "b": TaskSpec("b", TaskKind.CLASSIFICATION, 4),
         "c": TaskSpec("c", TaskKind.CLASSIFICATION, 3), "r": TaskSpec("r", TaskKind.REGRESSION, 2)}
# (seed, tasks and sizes, tasks label the same inputs): different tasks, step counts and last batches. A last batch
# of one sample (normalized with the running statistics) only in one-task clients: see `MaskedBatchNorm`.
CLIENTS = [
    (1, {"a": 23}, False), (2, {"a": 10, "b": 40}, False), (3, {"b": 5}, False), (4, {"a": 30, "r": 30}, True),
    (5, {"r": 18, "b": 12, "a": 3}, False), (6, {"c": 19}, False), (7, {"a": 9}, False),
    (8, {"b": 70}, False),  # the longest: its last steps train it alone, after every client with several rows
]
MODELS = {
    "mlp": ("mlp", {"hidden": [8]}),
    "mlp-bn": ("mlp", {"hidden": [8, 6], "norm": "batch"}),
    "cnn-bn": ("cnn", {"channels": [3, 4], "hidden": 5, "norm": "batch"}),
}


def _data(seed, sizes, shared=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(max(sizes.values()), 8, generator=g)
    data = {}
    for task, n in sizes.items():
        xs = x[:n] if shared else torch.randn(n, 8, generator=g)
        y = torch.randn(n, 2, generator=g) if task == "r" else torch.randint(0, SPECS[task].num_outputs, (n,),
                                                                            generator=g)
        data[task] = (xs, y)
    return data


def _model(kind):
    backbone, params = MODELS[kind]
    return build_model(backbone, params, (8,), SPECS, seed=3)


def _start(model, seed):
    state = {n: p.detach() + 0.01 * seed for n, p in model.named_parameters()}
    return {**state, **{n: b.detach().clone() for n, b in model.named_buffers()}}


def _plan(template, trainer, data, start, seed, terms=()):
    return ClientPlan(template, trainer, 0, 10, {}, data, start, seed, list(terms))


def _sequential(kind, trainer, plan, terms=None):
    model = _model(kind)
    model.load_state_dict(plan.start, strict=False)
    hooks = [] if terms is None else terms(dict(model.named_parameters()), plan)
    report = trainer.train(model, plan.data, plan.seed, 0, 10, hooks=hooks)
    params = {n: p.detach() for n, p in model.named_parameters()}
    return {**params, **{BUFFER_PREFIX + n: b for n, b in model.named_buffers()}}, report


def _compare(kind, trainer, plans, terms=None, plain_chains=True):
    results = train_batched(plans, plain_chains)
    noisy = before_norm(_model(kind)) if trainer.config.optimizer == "adamw" else set()
    for plan, result in zip(plans, results, strict=True):
        expected, report = _sequential(kind, trainer, plan, terms)
        assert result.report.steps == report.steps
        for task in plan.data:
            assert result.report.mean_loss[task] == pytest.approx(report.mean_loss[task], rel=1e-4)
        assert set(result.params) == set(expected)
        for name, value in expected.items():
            if name in noisy:
                continue
            if name.startswith("heads.") and name.split(".")[1] not in plan.data:
                assert torch.equal(result.params[name], plan.start[name]), name  # a head it does not hold stays
            else:
                torch.testing.assert_close(result.params[name].to(value.dtype), value, **TOLERANCE, msg=name)
        moved = [n for n in plan.start if not torch.equal(result.params[n] if n in result.params else
                                                          result.params[BUFFER_PREFIX + n], plan.start[n])]
        assert any(n.startswith("backbone.") for n in moved)
    return results


@pytest.mark.parametrize("plain_chains", [True, False], ids=["chains", "vmap"])
@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("train", [
    {"momentum": 0.9, "weight_decay": 0.0, "local_epochs": 2},
    {"momentum": 0.9, "weight_decay": 0.01, "grad_clip": 0.5, "local_epochs": 1},
    {"optimizer": "adamw", "lr": 0.01, "weight_decay": 0.01, "local_steps": 4},
])
def test_batched_training_gives_each_client_its_sequential_result(kind, train, plain_chains):
    trainer = Trainer(TrainConfig(**{"lr": 0.1, "batch_size": 8, **train}), SPECS)
    model = _model(kind)
    # under AdamW, a one-sample batch's output reads the running mean, which follows the noise of `before_norm`
    clients = [c for c in CLIENTS if train.get("optimizer") != "adamw" or 1 not in {n % 8 for n in c[1].values()}]
    template = _model(kind)
    plans = [_plan(template, trainer, _data(seed, sizes, shared), _start(model, seed), seed)
             for seed, sizes, shared in clients]
    _compare(kind, trainer, plans, plain_chains=plain_chains)


def test_parameter_terms_are_stacked_over_clients():
    """FedProx's and FedDyn's terms, written once as per-parameter pieces, give the sequential result batched, where
    the executor adds their gradients in place (`LinearGradient`), on leaves whose every row the term covers and on
    head leaves where only some clients' proximal terms cover their heads."""
    trainer = Trainer(TrainConfig(lr=0.05, momentum=0.5, batch_size=4, local_epochs=1, grad_clip=1.0), SPECS)
    model = _model("cnn-bn")
    template = _model("cnn-bn")
    plans = []
    for seed, sizes, shared in CLIENTS:
        start = _start(model, seed)
        anchor = {n: v + 0.1 for n, v in start.items() if n.startswith("backbone.") and "running" not in n
                  and "num_batches" not in n}
        gradient = {n: torch.full_like(v, 0.05 * seed) for n, v in anchor.items()}
        held = {n: v for n, v in start.items() if n.startswith("heads.") and n.split(".")[1] in sizes and seed % 2}
        params = dict(model.named_parameters())
        plans.append(_plan(template, trainer, _data(seed, sizes, shared), start, seed,
                           [ProximalHook(params, {**anchor, **held}, 0.3), LinearTermHook(params, gradient)]))

    def terms(params, plan):
        return [ProximalHook(params, plan.terms[0].operands, 0.3), LinearTermHook(params, plan.terms[1].operands)]

    _compare("cnn-bn", trainer, plans, terms)


def test_dropout_and_mixed_trainers_are_refused_before_training():
    trainer = Trainer(TrainConfig(batch_size=4, local_steps=1), SPECS)
    model = _model("mlp")
    model.backbone.layers.append(torch.nn.Dropout(0.5))
    with pytest.raises(Unbatchable, match="dropout"):
        train_batched([_plan(model, trainer, _data(1, {"a": 5}), _start(model, 1), 1)])
    other = Trainer(TrainConfig(batch_size=4, local_steps=2), SPECS)
    model = _model("mlp")
    plans = [_plan(model, trainer, _data(1, {"a": 5}), _start(model, 1), 1),
             _plan(model, other, _data(2, {"a": 5}), _start(model, 2), 2)]
    with pytest.raises(Unbatchable, match="different models, optimizers or lr schedules"):
        train_batched(plans)


def test_batched_training_runs_float32_in_full_precision_and_restores_the_flags():
    """cuDNN may run float32 convolutions in TF32; the batched path turns that off inside, and leaves the user's
    settings as they were."""
    from manytask.execution.batched import ieee_float32

    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    try:
        with ieee_float32():
            assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def test_masked_batched_sgd_moves_each_row_as_sparse_sgdm_moves_its_client():
    """Under masks, `BatchedSGD` is `SparseSGDM` row by row: weight decay and momentum never move a masked entry,
    and rows that stop (a prefix trains) keep their state."""
    from manytask.client.optimizers import SparseSGDM
    from manytask.execution.steps import BatchedSGD

    generator = torch.Generator().manual_seed(0)
    start = torch.randn(3, 4, 5, generator=generator)
    masks = torch.rand(3, 4, 5, generator=generator) < 0.4
    grads = [torch.randn(3, 4, 5, generator=generator) for _ in range(3)]
    config = TrainConfig(optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=0.05)
    stacked = start.clone()
    batched = BatchedSGD(config, 0.1, [masks.float()])
    for step, grad in enumerate(grads):
        rows = 3 - step  # the last rows stop first
        batched.step([stacked[:rows]], [grad[:rows].clone()])
    for row in range(3):
        param = torch.nn.Parameter(start[row].clone())
        sparse = SparseSGDM([("w", param)], {"w": masks[row]}, lr=0.1, momentum=0.9, weight_decay=0.05)
        for grad in grads[: 3 - row]:
            param.grad = grad[row].clone()
            sparse.step()
        assert torch.allclose(stacked[row], param.detach(), rtol=1e-6, atol=1e-7)
        assert torch.equal(stacked[row][~masks[row]], start[row][~masks[row]])

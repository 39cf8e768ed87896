"""`execution: vectorized` trains a round's clients as one batched computation and gives the sequential numbers
within `TOLERANCE`; what cannot vectorize runs sequentially, exactly as before, after a one-line notice."""

import json

import pytest
import torch

from manytask.client.trainer import TrainConfig, Trainer
from manytask.client.vectorized import TOLERANCE, ClientJob, NotVectorizable, train_vectorized
from manytask.config import validate
from manytask.errors import ManytaskError
from manytask.experiment import Experiment
from manytask.methods.hosts.feddyn import LinearTermHook
from manytask.methods.hosts.fedprox import ProximalHook
from manytask.models.multitask import build_model
from manytask.run import run_config
from manytask.tasks.task import TaskKind, TaskSpec

SPECS = {"a": TaskSpec("a", TaskKind.CLASSIFICATION, 3), "b": TaskSpec("b", TaskKind.CLASSIFICATION, 4),
         "r": TaskSpec("r", TaskKind.REGRESSION, 2)}


def _data(seed, sizes, shared=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(max(sizes.values()), 6, generator=g)
    data = {}
    for task, n in sizes.items():
        xs = x[:n] if shared else torch.randn(n, 6, generator=g)
        y = torch.randn(n, 2, generator=g) if task == "r" else torch.randint(0, SPECS[task].num_outputs, (n,),
                                                                            generator=g)
        data[task] = (xs, y)
    return data


def _model(backbone="mlp", params=None):
    return build_model(backbone, params or {"hidden": [8]}, (6,), SPECS, seed=3)


def _sequential(model, trainer, job, hooks=()):
    model.load_state_dict(job.start, strict=False)
    report = trainer.train(model, job.data, job.seed, 0, 10, hooks=list(hooks))
    return {n: p.detach() for n, p in model.named_parameters()}, report


CLIENTS = [  # (seed, tasks and sizes, tasks label the same inputs): different tasks, step counts and last batches
    (1, {"a": 23}, False), (2, {"a": 9, "b": 40}, False), (3, {"b": 5}, False), (4, {"a": 30, "r": 30}, True),
    (5, {"r": 17, "b": 12, "a": 3}, False),
]


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_vectorized_training_gives_each_client_its_sequential_result(weight_decay):
    trainer = Trainer(TrainConfig(lr=0.1, momentum=0.9, weight_decay=weight_decay, batch_size=8, local_epochs=2),
                      SPECS)
    model = _model()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    jobs = [ClientJob(_data(seed, sizes, shared), {n: v + 0.01 * seed for n, v in start.items()}, seed)
            for seed, sizes, shared in CLIENTS]
    results = train_vectorized(_model(), trainer, jobs, 0, 10)
    for job, result in zip(jobs, results, strict=True):
        expected, report = _sequential(_model(), trainer, job)
        assert result.report.steps == report.steps
        for task in job.data:
            assert result.report.mean_loss[task] == pytest.approx(report.mean_loss[task], rel=1e-5)
        for name, value in expected.items():
            if name.startswith("heads.") and name.split(".")[1] not in job.data:
                assert torch.equal(result.params[name], job.start[name]), name  # a head it does not hold stays
            else:
                torch.testing.assert_close(result.params[name], value, **TOLERANCE)
        moved = [n for n in job.start if not torch.equal(result.params[n], job.start[n])]
        assert any(n.startswith("backbone.") for n in moved)


def test_vmap_path_for_other_models_and_parameter_terms():
    """A CNN goes through `functional_call` under `vmap`; FedProx's and FedDyn's terms are stacked over clients."""
    specs = {"a": SPECS["a"], "b": SPECS["b"]}
    trainer = Trainer(TrainConfig(lr=0.05, momentum=0.5, batch_size=4, local_steps=3), specs)

    def cnn():
        return build_model("cnn", {"channels": [2], "hidden": 5}, (1, 4, 4), specs, seed=1)

    g = torch.Generator().manual_seed(0)
    jobs = []
    for seed, tasks in ((1, ["a"]), (2, ["a", "b"]), (3, ["b"])):
        data = {t: (torch.randn(7, 1, 4, 4, generator=g), torch.randint(0, 3, (7,), generator=g)) for t in tasks}
        start = {n: p.detach() + 0.1 * seed for n, p in cnn().named_parameters()}
        anchor = {n: v - 0.05 for n, v in start.items() if not n.startswith("heads.") or n.split(".")[1] in tasks}
        gradient = {n: torch.full_like(v, 0.02 * seed) for n, v in anchor.items()}
        terms = [ProximalHook(start, anchor, 0.3), LinearTermHook(start, gradient)]
        jobs.append(ClientJob(data, start, seed, terms))
    results = train_vectorized(cnn(), trainer, jobs, 0, 1)
    for job, result in zip(jobs, results, strict=True):
        model = cnn()
        params = dict(model.named_parameters())
        hooks = [ProximalHook(params, job.terms[0].operands, 0.3), LinearTermHook(params, job.terms[1].operands)]
        expected, _ = _sequential(model, trainer, job, hooks)
        for name in job.terms[0].operands:
            torch.testing.assert_close(result.params[name], expected[name], **TOLERANCE)


def test_batched_terms_equal_the_sum_of_each_clients_term():
    p = {"w": torch.tensor([[1.0, 2.0], [3.0, -1.0]])}
    anchors = {"w": torch.tensor([[0.0, 1.0], [1.0, 1.0]])}
    present = {"w": torch.tensor([[1.0], [0.0]])}  # the second client's term does not cover w
    # client 0: 0.5·0.2·((1−0)² + (2−1)²) = 0.2; client 1 left out
    assert float(ProximalHook(p, anchors, 0.2).batched_loss(p, anchors, present)) == pytest.approx(0.2)
    # client 0: −(1·0 + 2·1) = −2
    assert float(LinearTermHook(p, anchors).batched_loss(p, anchors, present)) == pytest.approx(-2.0)


def test_models_with_buffers_or_other_optimizers_are_refused_before_training():
    job = ClientJob(_data(1, {"a": 5}), {n: p.detach() for n, p in _model().named_parameters()}, 1)
    with pytest.raises(NotVectorizable, match="buffers"):
        bn = build_model("mlp", {"hidden": [8], "norm": "batch"}, (6,), SPECS, seed=3)
        train_vectorized(bn, Trainer(TrainConfig(), SPECS), [job], 0, 1)
    with pytest.raises(NotVectorizable, match="adamw"):
        train_vectorized(_model(), Trainer(TrainConfig(optimizer="adamw"), SPECS), [job], 0, 1)


RUN = {
    "name": "vec", "rounds": 3, "seed": 0, "reference": None, "participation": 0.6, "dropout": 0.2, "eval_every": 1,
    "method": ["fedavg", {"name": "fedprox", "mu": 0.1},
               {"name": "fedavg", "label": "fedavg+dea", "plugin": {"name": "dea", "rho": 0.5}}, "feddyn", "fedper"],
    "benchmark": {"name": "digits-tasks", "tasks": ["digit", "parity", "rotated"]},
    "federation": {"num_clients": 12, "tasks": {"kind": "dirichlet", "zeta": 0.5}, "samples": {"kind": "iid"}},
    "model": {"backbone": "mlp", "hidden": [32]},
    "train": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4, "local_epochs": 1,
              "batch_size": 16},
}
LABELS = ["fedavg", "fedprox", "fedavg+dea", "feddyn", "fedper"]


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_vectorized_runs_give_the_sequential_numbers(tmp_path, capsys):
    sequential = run_config(validate(RUN), tmp_path / "seq")
    vectorized = run_config(validate({**RUN, "execution": "vectorized", "vector_clients": 4}), tmp_path / "vec")
    assert "trains these clients one after another" not in capsys.readouterr().err
    for label in LABELS:
        seq, vec = _rows(tmp_path / "seq" / label / "metrics.jsonl"), _rows(tmp_path / "vec" / label / "metrics.jsonl")
        for a, b in zip(seq, vec, strict=True):
            assert (a["sampled"], a["dropped"]) == (b["sampled"], b["dropped"])
            for key, loss in a["fit"].items():
                assert b["fit"][key] == pytest.approx(loss, rel=1e-4), (label, key)
            for task, metrics in a["eval"].items():
                assert b["eval"][task]["loss"] == pytest.approx(metrics["loss"], rel=1e-4), (label, task)
                assert b["eval"][task]["accuracy"] == pytest.approx(metrics["accuracy"], abs=0.01), (label, task)
        assert vectorized[label]["average"] == pytest.approx(sequential[label]["average"], abs=0.01), label


@pytest.mark.slow
def test_methods_that_cannot_vectorize_run_sequentially_with_one_notice(tmp_path, capsys):
    config = {**RUN, "method": ["moon", {"name": "fedavg", "per_task": True}]}
    sequential = run_config(validate(config), tmp_path / "seq")
    vectorized = run_config(validate({**config, "execution": "vectorized"}), tmp_path / "vec")
    notices = [line for line in capsys.readouterr().err.splitlines() if "one after another" in line]
    assert len(notices) == 2 and "hook" in notices[0] and "per_task" in notices[1], notices
    for label in ("moon", "fedavg"):
        assert vectorized[label]["tasks"] == sequential[label]["tasks"]
        seq = _rows(tmp_path / "seq" / label / "metrics.jsonl")
        vec = _rows(tmp_path / "vec" / label / "metrics.jsonl")
        assert [r["eval"] for r in vec] == [r["eval"] for r in seq]


def test_vectorized_is_for_the_local_engine_in_one_process():
    for other in ({"engine": "flower-sim"}, {"workers": 2}):
        with pytest.raises(ManytaskError, match="vectorized"):
            Experiment.build(validate({**RUN, "method": "fedavg", "execution": "vectorized", **other}))

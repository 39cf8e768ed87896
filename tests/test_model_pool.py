"""A host client's models are built once and reset between clients: a taken model is a fresh build, bit for bit."""

import torch

from manytask.methods.base import ClientContext
from manytask.methods.hosts.base import ModelPool
from manytask.models.multitask import build_model
from manytask.tasks import TaskKind, TaskSpec

SPECS = {"a": TaskSpec("a", TaskKind.CLASSIFICATION, 3), "b": TaskSpec("b", TaskKind.CLASSIFICATION, 2)}


def _build():
    model = build_model("mlp", {"hidden": [8], "norm": "batch"}, (5,), SPECS, seed=7)
    return model, model


def _context(client):
    return ClientContext(client, 0, {})


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_models_taken_for_one_client_are_distinct_and_reset_to_a_fresh_build_for_the_next():
    pool = ModelPool(_build)
    first = _context(0)
    a, _ = pool.take(first)
    b, _ = pool.take(first)
    assert a is not b  # both alive within one client call
    for model in (a, b):  # training changes values, BN statistics, flags and grads
        model.train()
        model(torch.randn(4, 5), "a").sum().backward()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        model.backbone.requires_grad_(False)
    c, _ = pool.take(_context(1))
    assert c is b or c is a  # reused, not rebuilt
    fresh = _build()[0]
    assert _state(c).keys() == _state(fresh).keys()
    assert all(torch.equal(_state(c)[k], v) for k, v in _state(fresh).items())
    assert all(p.requires_grad and p.grad is None for p in c.parameters())

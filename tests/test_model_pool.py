"""A host client's models are built once and reset between clients: a taken model is a fresh build, bit for bit."""

import torch

from manytask.methods.base import ClientContext
from manytask.methods.hosts.model_pool import ModelPool
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


def test_load_state_is_load_state_dict_with_one_copy_per_tensor():
    from manytask.models.multitask import BUFFER_PREFIX, load_state, state_keys, trainable_state

    source, fast, reference = _build()[0], _build()[0], _build()[0]
    with torch.no_grad():
        for p in source.parameters():
            p.add_(torch.randn_like(p))
    source.train()
    source(torch.randn(6, 5), "a")  # BN statistics move
    state = trainable_state(source)
    state[BUFFER_PREFIX + "backbone.layers.2.num_batches_tracked"] = torch.tensor([3])  # a scalar sent as (1,)
    state["heads.zzz.weight"] = torch.zeros(2)  # a key the model lacks
    assert load_state(fast, state) == ["heads.zzz.weight"]
    plain = {k.removeprefix(BUFFER_PREFIX): v for k, v in state.items()}
    assert reference.load_state_dict(plain, strict=False).unexpected_keys == ["heads.zzz.weight"]
    assert all(torch.equal(a, b) for a, b in zip(fast.state_dict().values(), reference.state_dict().values(),
                                                     strict=True))
    assert list(state_keys(fast)) == list(trainable_state(reference))
    bad = {next(iter(state)): torch.zeros(1, 1)}
    try:
        load_state(fast, bad)
    except RuntimeError as err:
        assert "size mismatch" in str(err)
    else:
        raise AssertionError("a wrong shape must not load")


def test_a_model_taken_with_a_state_is_a_fresh_build_with_that_state_loaded():
    from manytask.models.multitask import load_state, trainable_state

    pool = ModelPool(_build)
    used, _ = pool.take(_context(0))
    with torch.no_grad():
        for p in used.parameters():
            p.add_(1.0)  # every tensor moved, the ones the next state overwrites and the ones it does not
    sent = {k: v + 2.0 for k, v in trainable_state(_build()[0], ["a"]).items() if k.startswith("backbone.")}
    taken, _ = pool.take(_context(1), sent)
    assert taken is used
    expected = _build()[0]
    load_state(expected, sent)
    assert all(torch.equal(_state(taken)[k], v) for k, v in _state(expected).items())
    assert any(k.startswith("heads.") for k in _state(expected))  # the heads were reset, not loaded

"""FedU: the Laplacian step by hand, the server's per-client payloads, what travels, resume."""

import json

import pytest
import torch

from manytask.client.trainer import TrainConfig
from manytask.config import validate
from manytask.engine.checkpoint import load_checkpoint
from manytask.errors import ManytaskError
from manytask.launch import resume, run_config
from manytask.messages import Message
from manytask.methods.common.laplacian import laplacian_step
from manytask.methods.personalized.fedu import FeduParams, FeduServer, complete_graph
from tests.conftest import small_config_dict
from tests.test_pfedme import FULL_MODEL, tiny_setup
from tests.test_sfmtl import PERSONAL

WEIGHTS = torch.tensor([[0.0, 1.0, 0.5], [1.0, 0.0, 2.0], [0.5, 2.0, 0.0]])


def _models():
    return [{"w": torch.tensor(w), "b": torch.tensor(b)} for w, b in [([0.0, 0.0], 1.0), ([1.0, 0.0], 2.0),
                                                                      ([0.0, 2.0], 3.0)]]


def test_laplacian_step_on_three_clients_by_hand():
    models = _models()
    new = laplacian_step(models, WEIGHTS, [[0, 1, 2]], step=0.1, lam=1.0)
    # w0 − 0.1·(1·(w0 − w1) + 0.5·(w0 − w2)) = −0.1·([−1, 0] + [0, −1])
    assert torch.allclose(new[0]["w"], torch.tensor([0.1, 0.1])) and new[0]["b"].item() == pytest.approx(1.2)
    # w1 − 0.1·(1·(w1 − w0) + 2·(w1 − w2)) = [1, 0] − 0.1·[3, −4]
    assert torch.allclose(new[1]["w"], torch.tensor([0.7, 0.4])) and new[1]["b"].item() == pytest.approx(2.1)
    # w2 − 0.1·(0.5·(w2 − w0) + 2·(w2 − w1)) = [0, 2] − 0.1·[−2, 5]
    assert torch.allclose(new[2]["w"], torch.tensor([0.2, 1.5])) and new[2]["b"].item() == pytest.approx(2.7)
    assert torch.equal(models[0]["w"], torch.zeros(2))  # inputs untouched


def test_laplacian_step_stays_inside_groups():
    models = _models()
    new = laplacian_step(models, WEIGHTS, [[0, 1], [2]], step=0.1, lam=1.0)
    assert torch.allclose(new[0]["w"], torch.tensor([0.1, 0.0]))  # only the pull of client 1
    assert torch.equal(new[2]["w"], torch.tensor([0.0, 2.0])) and new[2] is not models[2]


def test_laplacian_step_pulls_floats_and_keeps_each_models_integer_counters():
    """A BatchNorm model's batch counter is an integer: the step leaves each model's own (the float pull of an
    integer tensor cannot be stored in it); the floats of a larger group follow the per-pair formula."""
    generator = torch.Generator().manual_seed(0)
    models = [{"w": torch.randn(3, 2, generator=generator), "n": torch.tensor(c + 10)} for c in range(5)]
    weights = torch.rand(5, 5, generator=generator)
    steps = [0.1, 0.2, 0.3, 0.4, 0.5]
    new = laplacian_step(models, weights, [[0, 2, 4], [1, 3]], step=steps, lam=0.7)
    for group in ([0, 2, 4], [1, 3]):
        for i in group:
            pull = sum(steps[i] * 0.7 * weights[i, j] * (models[i]["w"] - models[j]["w"]) for j in group if j != i)
            assert torch.allclose(new[i]["w"], models[i]["w"] - pull, atol=1e-6)
            assert new[i]["n"].item() == i + 10 and new[i]["n"].dtype == torch.int64


def test_server_pulls_participants_together_and_owes_each_its_model():
    assert torch.equal(complete_graph(3), WEIGHTS.ne(0).float())
    holdings = {0: {"a": 5}, 1: {"b": 5}, 2: {"a": 5}}
    setup = tiny_setup(holdings, train=TrainConfig(lr=0.1, local_epochs=2))  # η_g = 0.1·2
    server = FeduServer(setup, FeduParams(lam=0.5))
    assert server.configure_fit(0, [0, 1, 2]) == {0: None, 1: None, 2: None}  # nothing owed before round 1
    replies = {c: Message.from_tensors({"head.bias": torch.full((2,), value)}, scalars={f"n/{t}": 5, f"loss/{t}": 1.0})
               for c, t, value in [(0, "a", 0.0), (2, "a", 5.0)]}
    log = server.aggregate_fit(0, {0: replies[0], 1: None, 2: replies[2]})
    assert log == {"train_loss/a": 1.0}
    # 0 − 0.2·0.5·1·(0 − 5) = 0.5 and 5 − 0.1·(5 − 0) = 4.5; client 1 did not take part
    payloads = server.configure_fit(1, [0, 1, 2])
    assert torch.allclose(payloads[0].tensor("head.bias"), torch.full((2,), 0.5))
    assert torch.allclose(payloads[2].tensor("head.bias"), torch.full((2,), 4.5)) and payloads[1] is None
    assert server.configure_evaluate([0, 1]).keys() == {0, 1}
    restored = FeduServer(setup, FeduParams(lam=0.5))
    restored.load_state_dict(server.state_dict())
    assert torch.equal(restored.payload(2).tensor("head.bias"), payloads[2].tensor("head.bias"))


def test_the_server_step_follows_the_epochs_each_client_trained():
    """η_g = lr × local epochs; with `local_steps` the epochs are those steps over one epoch's batches of that
    client (it was lr × local_epochs whatever the steps)."""
    from manytask.methods.common.personal import graph_steps

    holdings = {0: {"a": 64}, 1: {"b": 16}}  # 2 batches and 1 batch of 32
    by_steps = tiny_setup(holdings, train=TrainConfig(lr=0.1, local_steps=4, batch_size=32))
    assert graph_steps(by_steps, 0, [0, 1]) == pytest.approx([0.1 * 4 / 2, 0.1 * 4 / 1])
    by_epochs = tiny_setup(holdings, train=TrainConfig(lr=0.1, local_epochs=3, batch_size=32))
    assert graph_steps(by_epochs, 0, [1, 0]) == pytest.approx([0.3, 0.3])
    new = laplacian_step(_models()[:2], WEIGHTS[:2, :2], [[0, 1]], step=[0.1, 0.2], lam=1.0)
    # w0 − 0.1·(w0 − w1) = [0.1, 0]; w1 − 0.2·(w1 − w0) = [0.8, 0]
    assert torch.allclose(new[0]["w"], torch.tensor([0.1, 0.0]))
    assert torch.allclose(new[1]["w"], torch.tensor([0.8, 0.0]))


def test_needs_one_task_per_client():
    with pytest.raises(ManytaskError, match="fedu needs one task per client; client 0 holds 2"):
        FeduServer(tiny_setup({0: {"a": 5, "b": 5}}), FeduParams())


@pytest.mark.slow
def test_whole_models_travel_both_ways(tmp_path):
    summary = run_config(validate(small_config_dict(method="fedu", rounds=3, **PERSONAL)), tmp_path / "r")["fedu"]
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert all(FULL_MODEL < b < FULL_MODEL + 800 for r in rows for b in r["bytes_up"].values())
    assert rows[0]["bytes_down"] == {str(c): 0 for c in range(6)}  # nothing owed before the first round
    assert all(FULL_MODEL < b < FULL_MODEL + 800 for r in rows[1:] for b in r["bytes_down"].values())
    assert all("train_loss/client00" in r["fit"] and "fairness" in r for r in rows)
    assert summary["fairness"]["worst_10"] <= summary["fairness"]["mean"]


@pytest.mark.slow
def test_client_models_persist_and_resume_exactly(tmp_path):
    data = small_config_dict(method="fedu", rounds=3, participation=0.5, **PERSONAL)  # state must carry over
    full = run_config(validate(data), tmp_path / "full")["fedu"]
    assert run_config(validate(data), tmp_path / "cut", stop_after=2) is None
    checkpoint = load_checkpoint(tmp_path / "cut" / "checkpoint.safetensors")
    trained = {str(c) for c, s in checkpoint.clients.items() if s}  # sampled at least once
    assert 0 < len(trained) < 6
    assert all("backbone.layers.1.weight" in s and len([k for k in s if k.startswith("heads.")]) == 2
               for s in checkpoint.clients.values() if s)  # backbone + the client's own head
    assert {k.split("/")[1] for k in checkpoint.server} == trained  # the server owes each its updated model
    assert resume(tmp_path / "cut")["fedu"]["tasks"] == full["tasks"]

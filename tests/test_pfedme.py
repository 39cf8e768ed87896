"""pFedMe: the inner step, the local update and the server's β average by hand; the programs end to end."""

import json

import pytest
import torch
from torch import Tensor, nn

from manytask.client.trainer import TrainConfig
from manytask.config import validate
from manytask.engine.checkpoint import load_checkpoint
from manytask.errors import ManytaskError
from manytask.launch import resume, run_config
from manytask.messages import Message
from manytask.methods.base import ClientContext, Setup
from manytask.methods.personalized.pfedme import (
    PfedmeClient,
    PfedmeParams,
    PfedmeServer,
    local_update,
    personal_step,
    server_beta_average,
    train_personalized,
)
from manytask.tasks import TaskKind, TaskSpec
from tests.conftest import small_config_dict
from tests.test_sfmtl import PERSONAL

FULL_MODEL = 4 * (64 * 16 + 16 + 16 * 10 + 10)  # mlp [16] on 8x8 digits + one 10-class head, float32


def tiny_setup(holdings, outputs=(2, 2), train=None) -> Setup:
    specs = {name: TaskSpec(name, TaskKind.CLASSIFICATION, n) for name, n in zip("ab", outputs, strict=True)}
    return Setup(specs, (2,), "mlp", {"hidden": [2]}, train or TrainConfig(), seed=0, rounds=1, holdings=holdings)


def test_inner_step_and_local_update_by_hand():
    theta, grad, w = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 1.0]), torch.zeros(2)
    # θ − 0.1·(g + 2·(θ − w)) = [1 − 0.1·2.5, −2 − 0.1·(1 − 4)]
    assert torch.allclose(personal_step(theta, grad, w, lr=0.1, lam=2.0), torch.tensor([0.75, -1.7]))
    # w − 0.1·2·(w − θ) = [1 − 0.2·1, 1 − 0.2·(−2)]
    assert torch.allclose(local_update(torch.ones(2), torch.tensor([0.0, 3.0]), lr=0.1, lam=2.0),
                          torch.tensor([0.8, 1.4]))


class Scale(nn.Module):
    """f(a; x=1, y=0) = (a·1 − 0)² = a², ∇f = 2a: easy to follow by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(1.0))

    def forward(self, x: Tensor, task: str) -> Tensor:
        return self.a * x


def test_client_round_k_inner_steps_per_batch_then_w_update_by_hand():
    model, w0 = Scale(), {"a": torch.tensor(1.0)}
    batch = (torch.tensor([[1.0]]), torch.tensor([0.0]))
    params = PfedmeParams(inner_steps=2, lam=1.0, personal_lr=0.1)
    w, loss = train_personalized(model, w0, [batch, batch], TaskSpec("t", TaskKind.REGRESSION, 1), 0.5, params)
    # batch 1: θ 1 → 1 − 0.1·2 = 0.8 → 0.8 − 0.1·(1.6 − 0.2) = 0.66; w 1 → 1 − 0.5·(1 − 0.66) = 0.83
    # batch 2: θ → 0.66 − 0.1·(1.32 − 0.17) = 0.545 → 0.545 − 0.1·(1.09 − 0.285) = 0.4645; w → 0.83 − 0.5·0.3655
    assert model.a.item() == pytest.approx(0.4645)
    assert w["a"].item() == pytest.approx(0.64725)
    assert loss == pytest.approx((1 + 0.64 + 0.4356 + 0.297025) / 4)  # f(θ) = θ² at each inner step
    assert w0["a"].item() == 1.0  # the received w is not edited


def test_server_beta_average_by_hand():
    previous, average = {"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, 6.0])}
    assert torch.equal(server_beta_average(previous, average, 1.0)["w"], average["w"])  # plain averaging
    assert torch.allclose(server_beta_average(previous, average, 0.5)["w"], torch.tensor([2.0, 4.0]))
    assert torch.allclose(server_beta_average(previous, average, 2.0)["w"], torch.tensor([5.0, 10.0]))  # 2·avg − prev


def test_server_weighs_clients_by_samples_then_mixes_with_beta():
    server = PfedmeServer(tiny_setup({0: {"a": 10}, 1: {"b": 30}}), PfedmeParams(beta=0.5))
    previous = dict(server.model.state)
    assert "head.weight" in previous and not any(k.startswith("heads.") for k in previous)  # one global model
    sent = server.configure_fit(0, [0, 1])
    assert sent[0].tensors().keys() == sent[1].tensors().keys() == previous.keys()
    replies = {c: Message.from_tensors({k: torch.full_like(v, value) for k, v in previous.items()},
                                       scalars={f"n/{task}": n, f"loss/{task}": 1.0})
               for c, task, n, value in [(0, "a", 10, 1.0), (1, "b", 30, 5.0)]}
    server.aggregate_fit(0, replies)
    for key, old in previous.items():  # average (10·1 + 30·5) / 40 = 4, then 0.5·old + 0.5·4
        assert torch.allclose(server.model.state[key], 0.5 * old + 2.0)
    assert server.evaluate({}) is None  # clients evaluate their own θ
    state = server.state_dict()
    assert state.keys() == previous.keys()  # the global model, nothing else
    with pytest.raises(ValueError, match="unknown server state 'part/x'"):
        server.load_state_dict({**state, "part/x": torch.zeros(1)})
    server.load_state_dict({k: v + 1 for k, v in state.items()})
    assert torch.equal(server.model.state["head.weight"], state["head.weight"] + 1)


def test_clients_start_from_one_common_model():
    setup = tiny_setup({0: {"a": 5}, 1: {"b": 5}})
    client = PfedmeClient(setup, PfedmeParams())
    head_a = client.model_for_evaluation(ClientContext(0, 0, {}), None).heads["a"].weight
    head_b = client.model_for_evaluation(ClientContext(1, 0, {}), None).heads["b"].weight
    assert torch.equal(head_a, head_b)


def test_needs_one_task_per_client_and_equal_heads():
    with pytest.raises(ManytaskError, match="pfedme needs one task per client; client 1 holds 2"):
        PfedmeServer(tiny_setup({0: {"a": 5}, 1: {"a": 5, "b": 5}}), PfedmeParams())
    with pytest.raises(ManytaskError, match="same number of outputs"):
        PfedmeServer(tiny_setup({0: {"a": 5}, 1: {"b": 5}}, outputs=(2, 3)), PfedmeParams())


@pytest.mark.slow
def test_full_models_travel_and_metrics_are_logged(tmp_path):
    summary = run_config(validate(small_config_dict(method="pfedme", rounds=3, **PERSONAL)), tmp_path / "r")["pfedme"]
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all("fairness" in r and "train_loss/client00" in r["fit"] for r in rows)
    assert all(FULL_MODEL < b < FULL_MODEL + 800 for r in rows for key in ("bytes_up", "bytes_down")
               for b in r[key].values())
    assert set(summary["tasks"]) == {f"client{c:02d}" for c in range(6)}


@pytest.mark.slow
def test_personal_models_persist_and_resume_exactly(tmp_path):
    data = small_config_dict(method="pfedme", rounds=3, participation=0.5, **PERSONAL)  # state must carry over
    full = run_config(validate(data), tmp_path / "full")["pfedme"]
    assert run_config(validate(data), tmp_path / "cut", stop_after=2) is None
    checkpoint = load_checkpoint(tmp_path / "cut" / "checkpoint.safetensors")
    trained = [theta for theta in checkpoint.clients.values() if theta]  # sampled at least once
    assert 0 < len(trained) < 6
    for theta in trained:
        assert len([k for k in theta if k.startswith("heads.")]) == 2  # θ: backbone + the client's own head
        assert not torch.equal(theta["backbone.layers.1.weight"], checkpoint.server["backbone.layers.1.weight"])
    assert resume(tmp_path / "cut")["pfedme"]["tasks"] == full["tasks"]

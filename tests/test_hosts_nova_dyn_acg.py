"""FedNova, FedDyn and FedACG: each server rule by hand on tiny tensors, the clients' local objectives, buffers,
plug-in adjustments, role form, resume, and short runs that must learn."""

from collections.abc import Mapping

import pytest
import torch

from manytask.client.trainer import StepContext, TrainConfig
from manytask.config import validate
from manytask.engine.checkpoint import load_checkpoint
from manytask.experiment import Experiment
from manytask.launch import resume, run_config
from manytask.messages import Message
from manytask.methods.base import ClientContext
from manytask.methods.common.updates import Update
from manytask.methods.hosts.base import TrainedCopy
from manytask.methods.hosts.fedacg import FedAcgParams, FedAcgServer
from manytask.methods.hosts.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from manytask.methods.hosts.feddyn import (
    GRADIENT_PREFIX,
    FedDynClient,
    FedDynParams,
    FedDynServer,
    dynamic_server_step,
    updated_gradients,
)
from manytask.methods.hosts.fednova import FedNovaServer, normalized_step, normalizing_factor
from manytask.methods.hosts.rules import Momentum, round_delta
from manytask.methods.hosts.server import HostServer
from manytask.models.multitask import trainable_state
from tests.conftest import small_config_dict
from tests.test_pfedme import tiny_setup
from tests.test_sfmtl import PERSONAL

HOSTS = ["fednova", "feddyn", "fedacg"]
SERVERS = {"fednova": (FedNovaServer, FedAvgParams), "feddyn": (FedDynServer, FedDynParams),
           "fedacg": (FedAcgServer, FedAcgParams)}
TWO_CLIENTS = {0: {"a": 10}, 1: {"a": 30}}  # FedAvg weights 10 and 30: p = 1/4, 3/4


def shifted_replies(server: HostServer, shifts: Mapping[int, float]) -> dict[int, Message]:
    """Each client replies with everything it was sent plus its shift, and its task sizes."""
    return {c: Message.from_tensors({k: v + shift for k, v in server.sent[c].items()},
                                    scalars={f"n/{t}": n for t, n in server.setup.holdings[c].items()})
            for c, shift in shifts.items()}


def parameters(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if not k.startswith("buffer/")}


# FedNova


def test_normalizing_factor_sums_the_momentum_weights_of_each_step():
    assert normalizing_factor(3, 0.0) == 3.0
    assert normalizing_factor(2, 0.5) == pytest.approx(1 + 1.5)  # a gradient is applied 1, then 1 + ρ times
    assert normalizing_factor(3, 0.5) == pytest.approx(1 + 1.5 + 1.75)


def test_normalized_step_by_hand_with_scalar_and_per_entry_weights():
    deltas = [{"w": torch.tensor([2.0, 2.0]), "head": torch.tensor([3.0])}, {"w": torch.tensor([3.0, 3.0])}]
    weights = [{"w": torch.tensor([1.0, 3.0]), "head": 2.0}, {"w": torch.tensor([1.0, 1.0])}]
    step = normalized_step(deltas, weights, factors=[1.0, 3.0])
    # entry 0: p = (1/2, 1/2): τ_eff = 2, Σ p Δ/a = 1 + 0.5 -> 3 (FedAvg: 2.5)
    # entry 1: p = (3/4, 1/4): τ_eff = 0.75 + 0.75, Σ p Δ/a = 1.5 + 0.25 -> 2.625
    assert torch.allclose(step["w"], torch.tensor([3.0, 2.625]))
    assert torch.allclose(step["head"], torch.tensor([3.0]))  # one holder: its own delta


def test_fednova_server_normalizes_unequal_steps_and_equals_fedavg_with_equal_steps():
    # batch 10, one epoch: client 0 does τ = 1 step, client 1 τ = 3; plain SGD so a = τ
    server = FedNovaServer(tiny_setup(TWO_CLIENTS, train=TrainConfig(momentum=0.0, batch_size=10)), FedAvgParams())
    before = dict(server.global_state)
    server.configure_fit(0, [0, 1])
    server.aggregate_fit(0, shifted_replies(server, {0: 1.0, 1: 6.0}))
    # Σ p Δ/a = 1/4·1 + 3/4·6/3 = 1.75, τ_eff = 1/4·1 + 3/4·3 = 2.5 -> 4.375 (FedAvg: 4.75)
    for key, old in before.items():
        expected = old if key.startswith("heads.b.") else old + 4.375
        assert torch.allclose(server.global_state[key], expected), key

    equal = tiny_setup(TWO_CLIENTS, train=TrainConfig(local_steps=5))
    nova, fedavg = FedNovaServer(equal, FedAvgParams()), FedAvgServer(equal, FedAvgParams())
    for server in (nova, fedavg):
        server.configure_fit(0, [0, 1])
        server.aggregate_fit(0, shifted_replies(server, {0: 1.0, 1: 6.0}))
    for key, value in fedavg.global_state.items():
        assert torch.allclose(nova.global_state[key], value), key


# FedDyn


def test_feddyn_local_terms_and_gradient_update_by_hand():
    setup = tiny_setup({0: {"a": 10, "b": 10}})
    model = setup.build_model()
    received = {k: torch.zeros_like(v) for k, v in trainable_state(model).items()}
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0)
    copy = TrainedCopy("a", ["a"], model, model, received, seed=0)  # a per-task copy: backbone + head a
    trained = {k for k in received if not k.startswith("heads.b.")}
    state = {f"a/{GRADIENT_PREFIX}{k}": torch.full_like(received[k], 0.5) for k in trained}
    client = FedDynClient(setup, FedDynParams(per_task=True, alpha=0.1))
    hooks = client.hooks(ClientContext(0, 0, {}, state), copy)
    loss = sum(hook.loss(StepContext(0, 0.1, model)) for hook in hooks)
    loss.backward()
    # per trained entry: −⟨g, θ⟩ + α/2 (θ − θ_sent)² = −0.5 + 0.05, gradient −g + α(θ − θ_sent) = −0.4
    entries = sum(received[k].numel() for k in trained)
    assert loss.item() == pytest.approx(-0.45 * entries)
    for name, p in model.named_parameters():  # head b is not this copy's: no term, no gradient
        assert p.grad is None if name.startswith("heads.b.") else torch.allclose(p.grad, torch.full_like(p, -0.4))
    ctx = ClientContext(0, 0, {}, state)
    update = client.state_update(ctx, copy)
    client.keep_state(ctx, copy, update, update.apply({k: p.detach() for k, p in model.named_parameters()}))
    assert {k.removeprefix(f"a/{GRADIENT_PREFIX}") for k in state} == trained
    assert all(torch.allclose(g, torch.full_like(g, 0.4)) for g in state.values())  # g − α(θ − θ_sent)
    assert torch.allclose(updated_gradients({"w": torch.ones(1)}, {"w": torch.tensor([3.0])},
                                            {"w": torch.tensor([1.0])}, 0.5)["w"], torch.tensor([0.0]))


def test_feddyn_client_one_sgd_step_moves_lr_times_g_beyond_fedavg():
    setup = tiny_setup({0: {"a": 8, "b": 8}}, train=TrainConfig(lr=0.1, momentum=0.0, local_steps=1, batch_size=8))
    generator = torch.Generator().manual_seed(0)
    data = {t: (torch.randn(8, 2, generator=generator), torch.randint(0, 2, (8,), generator=generator)) for t in "ab"}
    payload = FedAvgServer(setup, FedAvgParams()).configure_fit(0, [0])[0]
    sent = payload.tensors()
    g = {k: torch.full_like(v, 0.5) for k, v in sent.items()}
    state = {GRADIENT_PREFIX + k: v for k, v in g.items()}
    dyn = FedDynClient(setup, FedDynParams(alpha=0.2)).fit(ClientContext(0, 0, data, state, seed=3), payload).tensors()
    plain = FedAvgClient(setup, FedAvgParams()).fit(ClientContext(0, 0, data, seed=3), payload).tensors()
    for key, value in g.items():  # one step from θ_sent, where the quadratic term has no gradient: θ += lr·g
        assert torch.allclose(dyn[key] - plain[key], 0.1 * value, atol=1e-6), key
        assert torch.allclose(state[GRADIENT_PREFIX + key], value - 0.2 * (dyn[key] - sent[key]), atol=1e-6), key


def test_feddyn_per_task_copies_keep_their_own_g_over_their_own_keys():
    setup = tiny_setup({0: {"a": 8, "b": 8}}, train=TrainConfig(local_steps=2, batch_size=4))
    data = {t: (torch.randn(8, 2, generator=torch.Generator().manual_seed(1)), torch.zeros(8, dtype=torch.long))
            for t in "ab"}
    payload = FedAvgServer(setup, FedAvgParams()).configure_fit(0, [0])[0]
    state: dict[str, torch.Tensor] = {}
    FedDynClient(setup, FedDynParams(per_task=True)).fit(ClientContext(0, 0, data, state, seed=3), payload)
    backbone = {k for k in payload.tensors() if k.startswith("backbone.")}
    for task in "ab":
        keys = {k.removeprefix(f"{task}/{GRADIENT_PREFIX}") for k in state if k.startswith(f"{task}/")}
        assert keys == backbone | {f"heads.{task}.weight", f"heads.{task}.bias"}, (task, keys)
    assert not torch.equal(state[f"a/{GRADIENT_PREFIX}backbone.layers.1.weight"],
                           state[f"b/{GRADIENT_PREFIX}backbone.layers.1.weight"])


def test_dynamic_server_step_by_hand():
    theta = {"w": torch.tensor([1.0]), "head": torch.tensor([0.0]), "v": torch.zeros(2)}
    h = {"w": torch.tensor([0.5]), "head": torch.tensor([0.0]), "v": torch.zeros(2)}
    deltas = [{"w": torch.tensor([2.0]), "head": torch.tensor([1.0]), "v": torch.tensor([2.0, 2.0])},
              {"w": torch.tensor([-2.0]), "v": torch.tensor([-2.0, -2.0])}]
    weights = [{"w": 1.0, "head": 2.0, "v": torch.tensor([1.0, 3.0])}, {"w": 3.0, "v": torch.tensor([1.0, 1.0])}]
    new_theta, new_h = dynamic_server_step(theta, h, deltas, weights, {"w": 4, "head": 2, "v": 2}, alpha=0.1)
    # w: Σ p Δ = (2 − 6)/4 = −1, |P|/m = 2/4: h = 0.5 − 0.1·0.5·(−1) = 0.55, θ = 1 − 1 − 0.55/0.1
    # head: one holder of two: h = −0.1·(1/2)·1, θ = 0 + 1 + 0.5
    # v, per entry: Σ p Δ = [0, (6 − 2)/4], |P| = m: h = −0.1·[0, 1], θ = [0, 1] + [0, 1]
    expected_h = {"w": [0.55], "head": [-0.05], "v": [0.0, -0.1]}
    expected_theta = {"w": [-5.5], "head": [1.5], "v": [0.0, 2.0]}
    for key in theta:
        assert torch.allclose(new_h[key], torch.tensor(expected_h[key])), key
        assert torch.allclose(new_theta[key], torch.tensor(expected_theta[key])), key
    # equal weights: the paper's h ← h − (α/m) Σ Δ, θ ← mean θ_n − h/α
    paper_theta, paper_h = dynamic_server_step({"w": torch.tensor([1.0])}, {"w": torch.zeros(1)},
                                               [{"w": torch.tensor([2.0])}, {"w": torch.tensor([-4.0])}],
                                               [{"w": 1.0}, {"w": 1.0}], {"w": 5}, alpha=0.1)
    assert torch.allclose(paper_h["w"], torch.tensor([-0.1 / 5 * (2.0 - 4.0)]))
    assert torch.allclose(paper_theta["w"], torch.tensor([(3.0 - 3.0) / 2 - 0.04 / 0.1]))


def test_feddyn_counts_the_copies_that_hold_each_key():
    holdings = {0: {"a": 10}, 1: {"a": 10, "b": 10}, 2: {"b": 10}}
    joint = FedDynServer(tiny_setup(holdings), FedDynParams())
    per_task = FedDynServer(tiny_setup(holdings), FedDynParams(per_task=True))
    assert (joint.holders("backbone.layers.1.weight"), joint.holders("heads.a.weight")) == (3, 2)
    assert (per_task.holders("backbone.layers.1.weight"), per_task.holders("heads.b.bias")) == (4, 2)
    assert set(joint.parts["h"]) == set(joint.global_state) and not any(v.any() for v in joint.parts["h"].values())


# FedACG


def test_momentum_step_by_hand_with_per_entry_weights():
    theta, momentum = {"w": torch.zeros(2)}, {"w": torch.ones(2)}
    deltas = [{"w": torch.tensor([2.0, 2.0])}, {"w": torch.tensor([-2.0, -2.0])}]
    weights = [{"w": torch.tensor([1.0, 3.0])}, {"w": torch.tensor([1.0, 1.0])}]
    new_theta, state = Momentum(0.5).step(theta, {"momentum": momentum}, round_delta(deltas, weights))
    new_momentum = state["momentum"]
    # Δ = [0, 1]; m = 0.5·1 + Δ; θ = 0 + m
    assert torch.allclose(new_momentum["w"], torch.tensor([0.5, 1.5]))
    assert torch.allclose(new_theta["w"], torch.tensor([0.5, 1.5]))


def test_fedacg_sends_the_lookahead_and_steps_with_momentum_over_two_rounds():
    server = FedAcgServer(tiny_setup(TWO_CLIENTS), FedAcgParams(lam=0.5))
    theta0 = dict(server.global_state)
    server.configure_fit(0, [0, 1])
    assert all(torch.equal(server.sent[0][k], v) for k, v in theta0.items() if not k.startswith("heads.b."))
    server.aggregate_fit(0, shifted_replies(server, {0: 2.0, 1: 4.0}))  # Δ = (10·2 + 30·4)/40 = 3.5 = m
    payload = server.configure_fit(1, [0, 1])[0].tensors()
    assert payload.keys() == {k for k in theta0 if not k.startswith("heads.b.")}
    for key, tensor in payload.items():  # θ̃ = θ + λ m = θ0 + 3.5 + 0.5·3.5
        assert torch.allclose(tensor, theta0[key] + 5.25), key
    server.aggregate_fit(1, shifted_replies(server, {0: -1.0, 1: 1.0}))  # Δ = 0.5; m = 1.75 + 0.5; θ += m
    for key, value in theta0.items():
        assert torch.allclose(server.global_state[key], value if key.startswith("heads.b.") else value + 5.75), key
        assert torch.allclose(server.parts["momentum"][key], torch.full_like(value, 0 if "heads.b." in key else 2.25))
    model = server.global_model()  # evaluation uses θ, not the lookahead
    assert torch.equal(model.heads["a"].weight, server.global_state["heads.a.weight"])


# every host


@pytest.mark.parametrize("method", HOSTS)
def test_buffers_are_averaged_with_fedavg_weights_not_the_host_rule(method):
    server_cls, params = SERVERS[method]
    server = server_cls(tiny_setup(TWO_CLIENTS, train=TrainConfig(momentum=0.0, batch_size=10)), params())
    server.global_state["buffer/backbone.norm.running_mean"] = torch.tensor([1.0, 1.0])
    server.global_state["buffer/backbone.norm.num_batches_tracked"] = torch.tensor(4)
    server.configure_fit(0, [0, 1])
    assert torch.equal(server.sent[0]["buffer/backbone.norm.running_mean"], torch.tensor([1.0, 1.0]))
    replies = shifted_replies(server, {0: 1.0, 1: 3.0})
    for client, (mean, tracked) in {0: ([2.0, 6.0], 9), 1: ([4.0, 2.0], 13)}.items():
        replies[client].arrays["buffer/backbone.norm.running_mean"] = torch.tensor(mean).numpy()
        replies[client].arrays["buffer/backbone.norm.num_batches_tracked"] = torch.tensor(tracked).numpy()
    server.aggregate_fit(0, replies)
    # (10·[2, 6] + 30·[4, 2]) / 40 and (10·9 + 30·13) / 40
    assert torch.allclose(server.global_state["buffer/backbone.norm.running_mean"], torch.tensor([3.5, 3.0]))
    assert server.global_state["buffer/backbone.norm.num_batches_tracked"].item() == 12
    assert not any(k.startswith("buffer/") for part in server.parts.values() for k in part)


@pytest.mark.parametrize("method", HOSTS)
def test_the_rule_reads_the_updates_a_plugin_adjusted(method):
    """A plug-in that doubles every delta and turns the weights into per-entry tensors of the same values doubles
    each host's first step (linear in the deltas from a zero server state)."""
    server_cls, params = SERVERS[method]

    def double(_round: int, updates: list[Update]) -> list[Update]:
        doubled = [u.with_deltas({k: 2 * d for k, d in u.deltas().items()}) for u in updates]
        for u in doubled:
            u.weights = {k: torch.full_like(u.trained[k], float(w)) for k, w in u.weights.items()}
        return doubled

    steps = []
    for adjust in (None, double):
        server = server_cls(tiny_setup(TWO_CLIENTS, train=TrainConfig(momentum=0.0, batch_size=10)), params())
        before = dict(server.global_state)
        server.configure_fit(0, [0, 1])
        server.aggregate_replies(0, shifted_replies(server, {0: 1.0, 1: 6.0}), adjust)
        steps.append({k: server.global_state[k] - v for k, v in before.items()})
    for key, step in steps[0].items():
        assert torch.allclose(steps[1][key], 2 * step, atol=1e-5), key
    assert steps[0]["backbone.layers.1.weight"].abs().min() > 1  # the host did step


@pytest.mark.parametrize("method", HOSTS)
def test_role_form_round_keeps_one_shared_head(method):
    exp = Experiment.build(validate(small_config_dict(method={"name": method, "shared_head": True}, **PERSONAL)))
    server, client = exp.server_program(), exp.client_program()
    before = dict(server.global_state)
    assert {k for k in before if not k.startswith("backbone.")} == {"head.weight", "head.bias"}
    payloads = server.configure_fit(0, [0, 1, 2])
    replies = {c: client.fit(ClientContext(c, 0, exp.client_data(c), {}, seed=c), p) for c, p in payloads.items()}
    server.aggregate_fit(0, replies)
    assert server.global_state.keys() == before.keys()
    assert all(torch.isfinite(v).all() and not torch.equal(v, before[k]) for k, v in server.global_state.items())
    assert all(part.keys() == before.keys() for part in server.parts.values())
    if method == "feddyn":
        assert server.holders("head.weight") == 6  # the role head is every client's


@pytest.mark.slow
@pytest.mark.parametrize("per_task", [False, True])
@pytest.mark.parametrize("method", HOSTS)
def test_short_run_learns(tmp_path, method, per_task):
    # epochs, not local_steps: the clients' step counts differ (what FedNova normalizes)
    config = small_config_dict(method={"name": method, "per_task": per_task}, rounds=3,
                               train={"lr": 0.05, "batch_size": 32})
    summary = run_config(validate(config), tmp_path / "run")[method]
    assert summary["average"] > 0.7  # mean chance is (0.1 + 0.5 + 0.1) / 3
    for task, metrics in summary["tasks"].items():
        assert metrics["accuracy"] > summary["chance"][task] + 0.25, (task, metrics)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["feddyn", "fedacg"])
def test_resume_restores_client_and_server_state(tmp_path, method):
    data = small_config_dict(method=method, rounds=4, participation=0.5)  # state must carry over
    full = run_config(validate(data), tmp_path / "full")[method]
    assert run_config(validate(data), tmp_path / "cut", stop_after=2) is None
    checkpoint = load_checkpoint(tmp_path / "cut" / "checkpoint.safetensors")
    part = "part/h/" if method == "feddyn" else "part/momentum/"
    assert any(v.any() for k, v in checkpoint.server.items() if k.startswith(part))
    if method == "feddyn":
        assert any(k.startswith(GRADIENT_PREFIX) for state in checkpoint.clients.values() for k in state)
    assert resume(tmp_path / "cut")[method]["tasks"] == full["tasks"]

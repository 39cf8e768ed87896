"""The server step control (`server_lr` on every host) and DEA's `rule: paper | host`, against hand computations and
against each other on the same replies."""

import pytest
import torch

from manytask.config import validate
from manytask.experiment import Experiment
from manytask.methods.base import ClientContext
from manytask.methods.common.aggregation import scaled_step
from manytask.methods.common.updates import is_parameter
from tests.conftest import small_config_dict


def test_scaled_step_moves_theta_by_eta_times_the_rules_step_and_eta_one_is_the_rule_itself():
    before, after = {"w": torch.tensor([1.0, -2.0])}, {"w": torch.tensor([1.5, 0.0]), "new": torch.ones(1)}
    assert torch.equal(scaled_step(before, after, 3.0)["w"], torch.tensor([2.5, 4.0]))  # 1 + 3·0.5, −2 + 3·2
    assert scaled_step(before, after, 3.0)["new"] is after["new"]  # nothing to step from
    assert scaled_step(before, after, 1.0)["w"] is after["w"]


def one_round(method, plugin=None, replies=None):
    """A server of `method` (with `plugin`) after one round on `replies` (its own clients' when None): (server,
    replies, the global state before)."""
    entry = method if plugin is None else {**method, "plugin": plugin}
    exp = Experiment.build(validate(small_config_dict(method=entry)))
    server, clients = exp.server_program(), list(range(exp.federation.num_clients))
    before = dict(server.global_state) if hasattr(server, "global_state") else dict(server.host.global_state)
    payloads = server.configure_fit(0, clients)
    if replies is None:
        client = exp.client_program()
        replies = {c: client.fit(ClientContext(c, 0, exp.client_data(c), seed=c + 1), payloads[c]) for c in clients}
    server.aggregate_fit(0, replies)
    return server, replies, before


def test_server_lr_scales_fedavgs_step_on_the_parameters():
    plain, replies, before = one_round({"name": "fedavg"})
    doubled, _, _ = one_round({"name": "fedavg", "server_lr": 2.0}, replies=replies)
    for key, value in before.items():
        want = value + 2.0 * (plain.global_state[key] - value) if is_parameter(key, value) else plain.global_state[key]
        assert torch.allclose(doubled.global_state[key], want, atol=1e-6), key
    assert any(not torch.equal(plain.global_state[k], doubled.global_state[k]) for k in before)


def test_fedadams_server_lr_is_its_rules_eta_applied_once():
    """One FedAdam round from m₀ = 0, v₀ = τ²: θ ← θ + η m / (√v + τ), m = (1 − β₁)Δ, v = β₂τ² + (1 − β₂)Δ²."""
    fedavg, replies, before = one_round({"name": "fedavg"})
    adam, _, _ = one_round({"name": "fedadam", "server_lr": 0.1}, replies=replies)
    beta1, beta2, tau = 0.9, 0.99, 1e-3
    for key, value in before.items():
        if is_parameter(key, value):
            delta = (fedavg.global_state[key] - value).double()
            m, v = (1 - beta1) * delta, beta2 * tau ** 2 + (1 - beta2) * delta ** 2
            want = value.double() + 0.1 * m / (v.sqrt() + tau)
            assert torch.allclose(adam.global_state[key].double(), want, atol=1e-6), key


def test_dea_rule_paper_is_eq_6_in_place_of_a_stateful_hosts_rule_and_host_feeds_it_the_rescaled_deltas():
    dea = {"name": "dea", "rho": 0.5}
    paper, replies, before = one_round({"name": "feddyn"}, {**dea, "rule": "paper"})
    # FedAvg's rule on the same replies is eq. 6: θ + the weighted mean of Δ̃
    eq6, _, _ = one_round({"name": "fedavg"}, dea, replies=replies)
    host, _, _ = one_round({"name": "feddyn"}, dea, replies=replies)
    state = paper.host.global_state
    assert all(torch.equal(state[k], eq6.host.global_state[k]) for k in before)
    assert any(not torch.equal(state[k], host.host.global_state[k]) for k in before if is_parameter(k, before[k]))
    assert all(not h.any() for h in paper.host.parts["h"].values())  # FedDyn's rule never ran
    assert any(h.any() for h in host.host.parts["h"].values())


def test_dea_logs_the_rounds_mean_norm_inflation():
    exp = Experiment.build(validate(small_config_dict(method={"name": "fedavg", "plugin": {"name": "dea",
                                                                                          "rho": 0.25}})))
    server, client = exp.server_program(), exp.client_program()
    payloads = server.configure_fit(0, [0, 1, 2])
    replies = {c: client.fit(ClientContext(c, 0, exp.client_data(c), seed=c + 1), payloads[c]) for c in (0, 1, 2)}
    inflations = [r.scalars["dea/inflation"] for r in replies.values()]
    # the top ρ of the entries hold at least ρ of ‖Δ‖², times 1/ρ²: 1/√ρ ≤ c ≤ 1/ρ
    assert all(2.0 <= c <= 4.0 for c in inflations) and len(set(inflations)) == 3
    log = server.aggregate_fit(0, replies)
    assert log["dea/inflation"] == pytest.approx(sum(inflations) / 3)

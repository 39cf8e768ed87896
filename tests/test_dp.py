"""The `dp` plug-in (methods/plugins/dp.py): DP-FedAvg's clipping and noise against the equations, adaptive clipping's
step, the accountant against the Gaussian mechanism's Rényi DP, local DP's uploads, exact resume, and refusals."""

import math

import pytest
import torch

from manytask.config import validate
from manytask.errors import ManytaskError
from manytask.experiment import Experiment
from manytask.launch import resume, run_config
from manytask.messages import Message
from manytask.methods.base import ClientContext
from manytask.methods.common.updates import Update, delta
from manytask.methods.plugins.dp import (
    ORDERS,
    DPParams,
    client_scales,
    epsilon,
    next_bound,
    noised_mean,
    round_rdp,
    updates_noise_multiplier,
)
from manytask.report.report import write_report
from manytask.seeding import torch_generator
from tests.conftest import small_config_dict

pytest.importorskip("opacus")


def _dp(**params):
    return {"name": "fedavg", "plugin": {"name": "dp", **params}}


def test_the_noised_mean_adds_gaussian_noise_of_std_sigma_to_each_keys_sum_over_its_holders():
    deltas = [{"w": torch.full((3,), 1.0), "head": torch.tensor([2.0])}, {"w": torch.full((3,), 3.0)}]
    exact = noised_mean(deltas, 0.0, torch.Generator())
    assert torch.equal(exact["w"], torch.full((3,), 2.0, dtype=torch.float64))  # (1 + 3) / 2
    assert torch.equal(exact["head"], torch.tensor([2.0], dtype=torch.float64))  # one holder
    many = [{"w": torch.zeros(200_000)} for _ in range(4)]
    noised = noised_mean(many, 0.7, torch_generator(0, "dp", 1))["w"]
    assert float((noised * 4).std()) == pytest.approx(0.7, rel=0.01)  # the noise is on the sum: σ, not σ/m
    again = noised_mean(many, 0.7, torch_generator(0, "dp", 1))["w"]
    assert torch.equal(noised, again)


def test_clipping_scales_each_clients_whole_update_to_norm_c():
    reference = {"a": torch.zeros(2), "b": torch.zeros(1)}
    updates = [Update(0, {"t": 1}, reference, {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([4.0])}, {}, {}),
               Update(1, {"t": 1}, reference, {"a": torch.tensor([0.3, 0.0]), "b": torch.tensor([0.4])}, {}, {})]
    assert client_scales(updates, 1.0) == {0: pytest.approx(0.2), 1: 1.0}  # ‖(3, 0, 4)‖ = 5


def test_the_server_gives_every_holder_the_noised_mean_of_the_clipped_updates():
    experiment = Experiment.build(validate(small_config_dict(method=_dp(clip=1.0, noise_multiplier=0.3))))
    server = experiment.server_program()
    reference = {"w": torch.zeros(4)}
    trained = [torch.tensor([2.0, 0.0, 0.0, 0.0]), torch.tensor([0.0, 0.5, 0.0, 0.0])]
    updates = [Update(c, {"t": 10 * (c + 1)}, reference, {"w": t}, {"w": 10.0 * (c + 1)}, {})
               for c, t in enumerate(trained)]
    adjusted = server.adjust(4, updates)
    generator = torch_generator(experiment.config.seed, "dp", 4)
    clipped_sum = torch.tensor([1.0, 0.5, 0.0, 0.0], dtype=torch.float64)  # the first clipped from norm 2 to 1
    expected = (clipped_sum + torch.normal(0.0, 0.3, (4,), generator=generator, dtype=torch.float64)) / 2
    for update in adjusted:
        torch.testing.assert_close(update.trained["w"].double(), expected.float().double(), rtol=0, atol=1e-7)
    assert server.log["dp/unclipped"] == 0.5 and server.log["dp/clip"] == 1.0
    q = experiment.setup.clients_per_round / len(experiment.setup.holdings)
    assert server.log["dp/epsilon"] == pytest.approx(epsilon(round_rdp(q, 0.3), 1e-5))


def test_the_accountant_composes_the_gaussian_mechanisms_renyi_dp():
    z = 1.3
    full = round_rdp(1.0, z, rounds=5)
    torch.testing.assert_close(full, torch.tensor([5 * a / (2 * z * z) for a in ORDERS], dtype=torch.float64))
    # RDP composes by addition: five single rounds, five rounds at once
    torch.testing.assert_close(sum(round_rdp(0.1, z) for _ in range(5)), round_rdp(0.1, z, rounds=5))
    eps = epsilon(full, 1e-5)
    classic = min(r + math.log(1e5) / (a - 1) for r, a in zip(full.tolist(), ORDERS, strict=True))
    assert 0 < eps <= classic  # the conversion Opacus uses is at least as tight as Mironov's
    assert epsilon(round_rdp(0.1, z, rounds=5), 1e-5) < eps  # sampling amplifies


def test_adaptive_clipping_moves_c_geometrically_toward_the_quantile():
    zero_noise = torch_generator(0, "x")
    # every update unclipped (b = 1 > γ = 0.5): C shrinks by exp(−η (b̃ − γ)); b̃ carries N(0, σ_b²)
    draw = float(torch.normal(0.0, 0.5, (), generator=torch_generator(0, "x"), dtype=torch.float64))
    assert next_bound(2.0, 10, 10, 0.5, 0.2, 0.5, zero_noise) == pytest.approx(
        2.0 * math.exp(-0.2 * ((10 + draw) / 10 - 0.5)))
    assert updates_noise_multiplier(1.0, 1.0) == pytest.approx((1 - 0.25) ** -0.5)
    with pytest.raises(ManytaskError, match="count_noise > noise_multiplier / 2"):
        updates_noise_multiplier(1.0, 0.4)


def test_local_dp_uploads_the_clipped_update_plus_noise_of_std_zc():
    experiment = Experiment.build(validate(small_config_dict(method=_dp(clip=0.5, noise_multiplier=2.0,
                                                                        where="client"))))
    client = experiment.client_program()
    sent = {"backbone.w": torch.zeros(100_000)}
    reply = Message.from_tensors({"backbone.w": torch.full((100_000,), 0.01)}, scalars={"n/t": 3})
    ctx = ClientContext(0, 1, {}, {}, seed=11)
    upload = client.transform_reply(ctx, Message.from_tensors(sent), reply)
    noise = delta(sent, upload.tensors())["backbone.w"].double() - 0.5 / math.sqrt(100_000)  # clipped: norm 3.16 → 0.5
    assert float(noise.std()) == pytest.approx(1.0, rel=0.02) and abs(float(noise.mean())) < 0.01  # z·C = 1
    assert upload.scalars == reply.scalars


def test_a_run_with_dp_reports_epsilon_and_resumes_exactly(tmp_path):
    method = _dp(clip=0.5, noise_multiplier=1.1, adaptive=True, count_noise=1.0)
    data = small_config_dict(method=method, rounds=4, participation=0.5)
    full = run_config(validate(data), tmp_path / "full")["fedavg+dp"]
    assert full["privacy"]["after_round"] == 4 and full["privacy"]["where"] == "server"
    expected = epsilon(round_rdp(0.5, 1.1, rounds=4), 1e-5)
    assert full["privacy"]["epsilon"] == pytest.approx(expected)
    assert run_config(validate(data), tmp_path / "cut", stop_after=2) is None
    resumed = resume(tmp_path / "cut")["fedavg+dp"]
    assert resumed["tasks"] == full["tasks"] and resumed["privacy"] == full["privacy"]
    assert "central DP, z = 1.1" in write_report(tmp_path / "full").read_text()


@pytest.mark.parametrize(("overrides", "refusal"), [
    ({"model": {"backbone": "mlp", "hidden": [8], "norm": "batch"}}, "running statistics"),
    ({"method": {"name": "fedavg", "per_task": True, "plugin": {"name": "dp"}}}, "per_task"),
])
def test_what_dp_cannot_bound_is_refused_in_one_sentence(overrides, refusal):
    data = {**small_config_dict(method=_dp()), **overrides}
    with pytest.raises(ManytaskError, match=refusal):
        Experiment.build(validate(data)).server_program()
    with pytest.raises(ValueError, match="use where: server"):
        DPParams(adaptive=True, where="client")

"""MOON, FedBN, FedGA and the small backbones' `norm: batch`: the math by hand on tiny tensors, what each client
keeps and uploads, per-task copies under a plug-in, and short runs that learn and resume exactly."""

import math

import pytest
import torch
from torch import nn

import manytask.methods.hosts.fedbn  # noqa: F401  (registration)
from manytask.client.trainer import evaluate
from manytask.config import validate
from manytask.engine.checkpoint import load_checkpoint
from manytask.errors import ManytaskError
from manytask.experiment import Experiment
from manytask.launch import resume, run_config
from manytask.messages import Message
from manytask.methods.base import ClientContext
from manytask.methods.common.updates import Update
from manytask.methods.hosts.fedga import GAP, OWN_LOSS, generalization_adjustment
from manytask.methods.hosts.moon import PREVIOUS, model_contrastive_loss
from manytask.methods.plugins.base import PluginServer
from manytask.models.backbones import MLP, CNNParams, FeatureBatchNorm, MLPParams, SmallCNN
from manytask.models.multitask import load_state, trainable_state
from manytask.registry import Params
from tests.conftest import small_config_dict

BN_MODEL = {"backbone": "cnn", "norm": "batch", "channels": [8], "hidden": 32}
BN_KEYS = ("backbone.features.1.", "buffer/backbone.features.1.")  # the cnn's BatchNorm after its conv


def programs(**overrides):
    exp = Experiment.build(validate(small_config_dict(**overrides)))
    return exp, exp.server_program(), exp.client_program()


def fit(exp, client, program, payload, state, round_index=0):
    return program.fit(ClientContext(client, round_index, exp.client_data(client), state, seed=client), payload)


def learns(summary, margin=0.1):
    return all(m["accuracy"] > summary["chance"][t] + margin for t, m in summary["tasks"].items())


# --- norm: batch ---------------------------------------------------------------------------------------------------


def test_norm_none_builds_the_same_modules_and_weights_as_before_the_option():
    torch.manual_seed(3)
    mlp = MLP((8, 8), MLPParams(hidden=[16, 8]))
    torch.manual_seed(3)
    before = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU())
    assert [type(m) for m in mlp.layers] == [type(m) for m in before]
    assert all(torch.equal(a, b) for a, b in zip(mlp.layers.state_dict().values(), before.state_dict().values(),
                                                 strict=True))
    torch.manual_seed(3)
    cnn = SmallCNN((8, 8), CNNParams(channels=[4], hidden=8))
    torch.manual_seed(3)
    conv, linear = nn.Conv2d(1, 4, kernel_size=3, padding=1), nn.Linear(4 * 4 * 4, 8)
    assert [type(m) for m in cnn.features] == [nn.Conv2d, nn.ReLU, nn.MaxPool2d, nn.Flatten]
    assert torch.equal(cnn.features[0].weight, conv.weight) and torch.equal(cnn.project[0].weight, linear.weight)


def test_norm_batch_puts_batchnorm_between_each_hidden_layer_and_its_relu():
    mlp = MLP((8, 8), MLPParams(hidden=[16, 8], norm="batch"))
    assert [type(m) for m in mlp.layers] == [nn.Flatten, nn.Linear, FeatureBatchNorm, nn.ReLU,
                                             nn.Linear, FeatureBatchNorm, nn.ReLU]
    image = SmallCNN((8, 8), CNNParams(channels=[4], hidden=8, norm="batch"))
    assert [type(m) for m in image.features] == [nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.MaxPool2d, nn.Flatten]
    signal = SmallCNN((12,), CNNParams(channels=[4], hidden=8, norm="batch"))
    assert [type(m) for m in signal.features] == [nn.Conv1d, nn.BatchNorm1d, nn.ReLU, nn.MaxPool1d, nn.Flatten]
    assert signal(torch.randn(5, 12)).shape == (5, 8)
    assert {"buffer/features.1.running_mean", "buffer/features.1.running_var"} <= set(trainable_state(image))


def test_buffers_travel_and_the_server_averages_them_by_samples():
    exp, server, client = programs(model=BN_MODEL)
    initial = server.global_state["buffer/backbone.features.1.running_mean"].clone()
    payloads = server.configure_fit(0, [0, 1])
    replies = {c: fit(exp, c, client, payloads[c], {}) for c in (0, 1)}
    server.aggregate_fit(0, replies)
    sizes = [sum(len(y) for _, y in exp.client_data(c).values()) for c in (0, 1)]
    means = [replies[c].tensors()["buffer/backbone.features.1.running_mean"] for c in (0, 1)]
    expected = (sizes[0] * means[0].double() + sizes[1] * means[1].double()) / sum(sizes)
    averaged = server.global_state["buffer/backbone.features.1.running_mean"]
    assert torch.allclose(averaged, expected.float()) and not torch.equal(averaged, initial)


@pytest.mark.slow
def test_fedavg_with_batch_norm_learns_and_its_global_running_statistics_move(tmp_path):
    summary = run_config(validate(small_config_dict(model=BN_MODEL, rounds=3)), tmp_path / "r")["fedavg"]
    assert learns(summary)
    server = load_checkpoint(tmp_path / "r" / "checkpoint.safetensors").server
    assert server["buffer/backbone.features.1.running_mean"].abs().min() > 0  # initialized to 0
    assert (server["buffer/backbone.features.1.running_var"] - 1).abs().min() > 0  # initialized to 1
    assert server["buffer/backbone.features.1.num_batches_tracked"].item() > 0


# --- MOON ----------------------------------------------------------------------------------------------------------


def test_model_contrastive_loss_by_hand():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    z_glob = torch.tensor([[3.0, 0.0], [0.0, 1.0]])
    z_prev = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    # cos: sample 1 (1, 0), sample 2 (1, 1/√2); logits /0.5: −log(e^2 / (e^2 + e^{2c})) = log(1 + e^{2c − 2})
    expected = (math.log(1 + math.exp(-2)) + math.log(1 + math.exp(math.sqrt(2) - 2))) / 2
    assert model_contrastive_loss(z, z_glob, z_prev, 0.5).item() == pytest.approx(expected, rel=1e-6)
    assert model_contrastive_loss(z, z_glob, z_glob, 0.5).item() == pytest.approx(math.log(2))  # no preference


def test_moon_projection_head_is_seeded_shared_and_leaves_the_global_rng_alone():
    rng = torch.get_rng_state()
    _, server, client = programs(method="moon")
    assert torch.equal(torch.get_rng_state(), rng)
    assert server.global_state["projection.0.weight"].shape == (32, 32)  # mlp hidden [32] -> width 32
    assert server.global_state["projection.2.weight"].shape == (256, 32)
    assert torch.equal(client.build_model()[0].projection[2].weight, server.global_state["projection.2.weight"])


def test_moon_client_keeps_its_previous_model_and_contrasts_with_it():
    exp, server, client = programs(method="moon")
    _, _, no_term = programs(method={"name": "moon", "mu": 0.0})
    payload = server.configure_fit(0, [0])[0]
    state: dict[str, torch.Tensor] = {}
    first = fit(exp, 0, client, payload, state)
    # before its first round the previous model is the received one: the term has zero gradient
    baseline = fit(exp, 0, no_term, payload, {})
    assert all(torch.allclose(v, baseline.tensors()[k], atol=1e-6) for k, v in first.tensors().items())
    uploaded = first.tensors()
    kept = {k[len(PREVIOUS):]: v for k, v in state.items() if k.startswith(PREVIOUS)}
    assert set(kept) == {k for k in uploaded if not k.startswith("heads.")} and "projection.2.weight" in kept
    assert all(torch.equal(v, uploaded[k]) for k, v in kept.items())
    second, second_without = fit(exp, 0, client, payload, state, 1), fit(exp, 0, no_term, payload, {}, 1)
    assert not torch.allclose(second.tensors()["backbone.layers.1.weight"],
                              second_without.tensors()["backbone.layers.1.weight"], atol=1e-6)


@pytest.mark.slow
def test_moon_learns_and_resumes_exactly(tmp_path):
    data = small_config_dict(method="moon", rounds=4, participation=0.5)  # the previous models must carry over
    full = run_config(validate(data), tmp_path / "full")["moon"]
    assert learns(full, margin=0.05)
    assert run_config(validate(data), tmp_path / "cut", stop_after=2) is None
    clients = load_checkpoint(tmp_path / "cut" / "checkpoint.safetensors").clients
    assert any(k.startswith(PREVIOUS) for state in clients.values() for k in state)
    assert resume(tmp_path / "cut")["moon"]["tasks"] == full["tasks"]


# --- FedBN ---------------------------------------------------------------------------------------------------------


def test_fedbn_without_normalization_layers_is_a_one_sentence_error():
    with pytest.raises(ManytaskError, match=r"^fedbn needs normalization layers; use model\.norm: batch\.$"):
        programs(method="fedbn")


def test_fedbn_normalization_layers_never_travel_and_persist_per_client():
    exp, server, client = programs(method="fedbn", model=BN_MODEL)
    payloads = server.configure_fit(0, [0, 1])
    states: dict[int, dict[str, torch.Tensor]] = {0: {}, 1: {}}
    replies = {c: fit(exp, c, client, payloads[c], states[c]) for c in (0, 1)}
    for message in (*payloads.values(), *replies.values()):
        keys = message.tensors()
        assert "backbone.features.0.weight" in keys and not any(k.startswith(BN_KEYS) for k in keys)
    for state in states.values():
        assert set(state) == {f"{p}{n}" for p, n in [(BN_KEYS[0], "weight"), (BN_KEYS[0], "bias")]} | {
            f"{BN_KEYS[1]}{n}" for n in ("running_mean", "running_var", "num_batches_tracked")}
    assert not torch.equal(states[0][BN_KEYS[1] + "running_mean"], states[1][BN_KEYS[1] + "running_mean"])
    server.aggregate_fit(0, replies)
    assert server.evaluate({}) is None  # each client evaluates with its own normalization layers
    fit(exp, 0, client, server.configure_fit(1, [0])[0], states[0], 1)
    forwards = 5 * len(exp.client_data(0))  # one per task and local step
    assert states[0][BN_KEYS[1] + "num_batches_tracked"] == 2 * forwards  # round 2 went on from round 1's


@pytest.mark.slow
def test_fedbn_learns(tmp_path):
    summary = run_config(validate(small_config_dict(method="fedbn", model=BN_MODEL, rounds=3)), tmp_path / "r")
    assert learns(summary["fedbn"])


# --- FedGA ---------------------------------------------------------------------------------------------------------


def test_generalization_adjustment_by_hand():
    weights = torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64)
    # clients 0 and 2 report gaps 1 and 3: centered (−1, 1), max 1 -> a0 − 0.1, a2 + 0.1; client 1 unchanged
    adjusted = generalization_adjustment(weights, [0, 2], torch.tensor([1.0, 3.0], dtype=torch.float64), 0.1)
    assert torch.allclose(adjusted, torch.tensor([0.15, 0.25, 0.6], dtype=torch.float64))
    # step 0.5: (−0.25, 0.25, 1.0) clipped to (0, 0.25, 1.0), renormalized by 1.25
    clipped = generalization_adjustment(weights, [0, 2], torch.tensor([1.0, 3.0], dtype=torch.float64), 0.5)
    assert torch.allclose(clipped, torch.tensor([0.0, 0.2, 0.8], dtype=torch.float64))
    equal = generalization_adjustment(weights, [0, 2], torch.tensor([2.0, 2.0], dtype=torch.float64), 0.5)
    assert torch.equal(equal, weights)


def mean_loss(exp, module, data):
    """Mean per-sample loss over all the client's samples, from the evaluation metrics."""
    specs = exp.setup.specs
    total = sum(evaluate(module, specs[t], x, y)["loss"] * len(y) for t, (x, y) in data.items())
    return total / sum(len(y) for _, y in data.values())


def test_fedga_client_uploads_the_gap_from_its_second_participation():
    exp, server, client = programs(method="fedga")
    data, state = exp.client_data(0), {}
    first = fit(exp, 0, client, server.configure_fit(0, [0])[0], state)
    assert GAP not in first.scalars
    trained, _ = client.build_model()
    load_state(trained, first.tensors())
    own_loss = mean_loss(exp, trained, data)
    assert state[OWN_LOSS].item() / sum(len(y) for _, y in data.values()) == pytest.approx(own_loss, rel=1e-5)
    server.aggregate_fit(0, {0: first})
    payload = server.configure_fit(1, [0])[0]
    received, _ = client.build_model()
    load_state(received, payload.tensors())
    second = fit(exp, 0, client, payload, state, 1)
    assert second.scalars[GAP] == pytest.approx(mean_loss(exp, received, data) - own_loss, rel=1e-5)


def test_fedga_server_adjusts_the_weights_before_aggregating_with_them():
    exp, server, _ = programs(method={"name": "fedga", "step_size": 0.1})
    samples = torch.tensor([sum(exp.setup.holdings[c].values()) for c in range(4)], dtype=torch.float64)
    assert torch.allclose(server.parts["fedga"]["weights"], samples / samples.sum())  # FedAvg's to start with
    key = "backbone.layers.1.weight"
    server.configure_fit(1, [0, 1])
    replies = {c: Message.from_tensors({key: torch.full_like(server.global_state[key], value)},
                                       scalars={**{f"n/{t}": n for t, n in exp.setup.holdings[c].items()}, GAP: gap})
               for c, value, gap in [(0, 1.0, 0.5), (1, 3.0, 1.5)]}
    server.aggregate_fit(1, replies)  # round 2 of 3: step 0.1·(1 − 1/3); centered gaps (−0.5, 0.5) -> (−1, 1)
    step = 0.1 * (1 - 1 / 3)
    expected = samples / samples.sum()
    expected[0] -= step
    expected[1] += step
    assert torch.allclose(server.parts["fedga"]["weights"], expected)
    average = (expected[0] * 1.0 + expected[1] * 3.0) / (expected[0] + expected[1])
    assert torch.allclose(server.global_state[key], torch.full_like(server.global_state[key], float(average)))


@pytest.mark.slow
def test_fedga_learns_and_resumes_exactly(tmp_path):
    data = small_config_dict(method="fedga", rounds=4, participation=0.5)
    full = run_config(validate(data), tmp_path / "full")["fedga"]
    assert learns(full, margin=0.05)
    assert run_config(validate(data), tmp_path / "cut", stop_after=2) is None
    server = load_checkpoint(tmp_path / "cut" / "checkpoint.safetensors").server
    assert server["part/fedga/weights"].sum().item() == pytest.approx(1.0)
    assert resume(tmp_path / "cut")["fedga"]["tasks"] == full["tasks"]


# --- every host: per-task copies under a plug-in ------------------------------------------------------------------


class PerEntryWeights(PluginServer[Params]):
    """A plug-in that replaces every weight by the same weight per entry: the host must give the same model."""

    def adjust(self, round_index: int, updates: list[Update]) -> list[Update]:
        self.seen = updates
        for update in updates:
            update.weights = {k: torch.full(update.trained[k].shape, float(w), dtype=torch.float64)
                              for k, w in update.weights.items()}
        return updates


@pytest.mark.parametrize("method, model", [("moon", None), ("fedbn", BN_MODEL), ("fedga", None)])
def test_per_task_copies_under_a_plugin_aggregate_as_the_bare_host(method, model):
    extra = {} if model is None else {"model": model}
    exp, bare, client = programs(method={"name": method, "per_task": True}, **extra)
    wrapped = PerEntryWeights(exp.server_program(), exp.setup, Params())
    states: dict[int, dict[str, torch.Tensor]] = {0: {}, 1: {}}
    for round_index in (0, 1):  # FedGA's gaps arrive in the second round
        payloads = bare.configure_fit(round_index, [0, 1])
        wrapped.configure_fit(round_index, [0, 1])
        replies = {c: fit(exp, c, client, payloads[c], states[c], round_index) for c in (0, 1)}
        bare.aggregate_fit(round_index, replies)
        wrapped.aggregate_fit(round_index, replies)
    assert {u.copy for u in wrapped.seen} == {t for c in (0, 1) for t in exp.setup.holdings[c]}
    assert all(any(k.startswith(f"{t}/") for k in states[c]) for c in (0, 1) for t in exp.setup.holdings[c])
    for key, value in bare.state_dict().items():
        assert torch.allclose(wrapped.host.state_dict()[key].double(), value.double(), atol=1e-6), key


def test_an_mlp_with_batch_norm_trains_on_a_last_batch_of_one_sample():
    """A client's last mini-batch may hold one sample, which has no batch variance: the feature BatchNorm then
    normalizes it with its running statistics instead of failing."""
    from manytask.models import build_model
    from manytask.tasks import TaskKind, TaskSpec

    specs = {"t": TaskSpec("t", TaskKind.CLASSIFICATION, 2)}
    model = build_model("mlp", {"hidden": [4], "norm": "batch"}, (3,), specs, 0)
    model.train()
    single = model(torch.ones(1, 3), "t")
    model.eval()
    assert torch.equal(single, model(torch.ones(1, 3), "t"))

import pytest
import torch

from manytask.config import validate
from manytask.experiment import Experiment
from manytask.messages import Message
from manytask.methods.common import aggregation
from manytask.methods.common.aggregation import fedavg_weights, weighted_average
from manytask.methods.hosts.fedprox import proximal_term
from tests.conftest import small_config_dict


def test_weighted_average_matches_hand_computation():
    # client A: backbone 1.0 (n=10: 6 digit + 4 parity), client B: backbone 4.0 (n=30 digit).
    a = {
        "backbone.w": torch.tensor([1.0, 2.0]),
        "heads.digit.w": torch.tensor([1.0]),
        "heads.parity.w": torch.tensor([5.0]),
    }
    b = {"backbone.w": torch.tensor([4.0, 0.0]), "heads.digit.w": torch.tensor([3.0])}
    wa = fedavg_weights(list(a), {"digit": 6, "parity": 4})
    wb = fedavg_weights(list(b), {"digit": 30})
    assert wa == {"backbone.w": 10.0, "heads.digit.w": 6.0, "heads.parity.w": 4.0}
    out = weighted_average([a, b], [wa, wb])
    # backbone: (10*[1,2] + 30*[4,0]) / 40 = [3.25, 0.5]; digit head: (6*1 + 30*3)/36 = 96/36; parity only A.
    assert torch.allclose(out["backbone.w"], torch.tensor([3.25, 0.5]))
    assert out["heads.digit.w"].item() == pytest.approx(96 / 36)
    assert out["heads.parity.w"].item() == pytest.approx(5.0)
    assert out["backbone.w"].dtype == torch.float32


def reference_average(updates, weights):
    """The definition: running float64 sums of w * value in the given order, divided per key."""
    sums, totals, dtypes = {}, {}, {}
    for update, weight in zip(updates, weights, strict=True):
        for key, value in update.items():
            term = weight[key] * value.double()
            sums[key] = sums[key] + term if key in sums else term
            totals[key] = totals.get(key, 0.0) + weight[key]
            dtypes[key] = value.dtype
    return {k: (sums[k] / totals[k]).to(dtypes[k]) for k in sums}


def random_value(generator: torch.Generator, uniform: bool = False) -> torch.Tensor:
    kind = int(torch.randint(6, (1,), generator=generator))
    if uniform:  # float64 (its sums' last bits show in the average), -0.0 at times: sums of zeros keep their sign
        value = torch.randn(3, 2, generator=generator, dtype=torch.float64)
        return value.masked_fill(torch.rand(3, 2, generator=generator) < 0.3, -0.0)
    value = torch.randn(3, 2, generator=generator) * 10.0 ** int(torch.randint(-6, 6, (1,), generator=generator))
    return [value, value.double(), value.half(), torch.randint(-2**60, 2**60, (3, 2), generator=generator),
            torch.full((3, 2), -0.0), value.masked_fill(value > 0, float("inf"))][kind]


def random_weight(generator: torch.Generator) -> float | torch.Tensor:
    kind = int(torch.randint(4, (1,), generator=generator))
    scale = float(torch.rand(1, generator=generator)) * 100
    return [scale, scale, torch.rand(3, 2, generator=generator, dtype=torch.float64) + 0.1, torch.tensor(scale)][kind]


# the dtypes of the chunked sums' values: a float64 sum's last bits show in the average; -0.0 at times
UNIFORM_DTYPES = (torch.float64, torch.float32, torch.float16, torch.int64)


# sums in column chunks of that many entries
@pytest.mark.parametrize("columns", [1 << 14, 4, 1])
def test_weighted_average_is_bit_identical_to_running_float64_sums(monkeypatch, columns):
    monkeypatch.setattr(aggregation, "SUM_COLUMNS", columns)
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        uniform = bool(torch.rand(1, generator=generator) < 0.5)  # one dtype, float weights: the chunked path
        dtype = UNIFORM_DTYPES[int(torch.randint(len(UNIFORM_DTYPES), (1,), generator=generator))]
        updates = [{k: random_value(generator, uniform).to(dtype if uniform else None) for k in "abcd"
                    if torch.rand(1, generator=generator) < 0.7}
                   for _ in range(int(torch.randint(1, 12, (1,), generator=generator)))]
        weights = [{k: float(torch.rand(1, generator=generator)) * 100 if uniform else random_weight(generator)
                    for k in update} for update in updates]
        expected, out = reference_average(updates, weights), weighted_average(updates, weights)
        assert out.keys() == expected.keys()
        for key, value in expected.items():
            assert out[key].dtype == value.dtype and out[key].shape == value.shape
            assert out[key].numpy().tobytes() == value.numpy().tobytes()  # bits: -0.0, inf and NaN included


def test_weighted_average_leaves_its_inputs_alone():
    update = {"w": torch.tensor([1.0, 2.0], dtype=torch.float64), "v": torch.tensor([3.0])}
    weighted_average([update, update], [{"w": 2.0, "v": 3.0}, {"w": 1.0, "v": 1.0}])
    assert update["w"].tolist() == [1.0, 2.0] and update["v"].tolist() == [3.0]


def test_proximal_term_hand_computed():
    params = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5])}
    anchor = {"w": torch.tensor([0.0, 0.0]), "b": torch.tensor([0.0])}
    # mu/2 * (1 + 4 + 0.25) = 0.1/2 * 5.25
    assert proximal_term(params, anchor, 0.1).item() == pytest.approx(0.2625)


def test_fedavg_server_aggregates_client_messages_by_holders():
    exp = Experiment.build(validate(small_config_dict()))
    server = exp.server_program()
    keys = list(server.global_state)
    backbone = [k for k in keys if k.startswith("backbone.")]
    replies = {}
    for client, value in ((0, 1.0), (1, 3.0)):
        tasks = exp.federation.tasks_of(client)
        tensors = {k: torch.full_like(server.global_state[k], value) for k in backbone}
        tensors.update({k: torch.full_like(v, value) for k, v in server.global_state.items()
                        if any(k.startswith(f"heads.{t}.") for t in tasks)})
        replies[client] = Message.from_tensors(tensors, scalars={f"n/{t}": 10 * (client + 1) for t in tasks})
    server.configure_fit(0, [0, 1])
    n0 = 10 * len(exp.federation.tasks_of(0))
    n1 = 20 * len(exp.federation.tasks_of(1))
    server.aggregate_fit(0, replies)
    expected = (n0 * 1.0 + n1 * 3.0) / (n0 + n1)
    assert torch.allclose(server.global_state[backbone[0]], torch.full_like(server.global_state[backbone[0]], expected))


def test_a_shared_head_is_one_head_averaged_over_every_client_and_placed_as_each_task_head():
    from manytask.errors import ManytaskError
    from manytask.methods.base import ClientContext
    from tests.test_sfmtl import PERSONAL

    config = small_config_dict(method={"name": "fedavg", "shared_head": True}, **PERSONAL)
    exp = Experiment.build(validate(config))
    server, client = exp.server_program(), exp.client_program()
    assert {k for k in server.global_state if not k.startswith("backbone.")} == {"head.weight", "head.bias"}
    payload = server.configure_fit(0, [0])[0]
    task = exp.federation.tasks_of(0)[0]
    reply = client.fit(ClientContext(0, 0, exp.client_data(0), seed=1), payload)
    assert "head.weight" in reply.tensors() and not any(k.startswith("heads.") for k in reply.tensors())
    replies = {c: Message.from_tensors({"head.weight": torch.full((10, 16), float(c)), "head.bias": torch.zeros(10)},
                                       scalars={f"n/{exp.federation.tasks_of(c)[0]}": 10 * c}) for c in (1, 2)}
    server.configure_fit(0, [1, 2])
    server.aggregate_fit(0, replies)
    assert torch.allclose(server.global_state["head.weight"], torch.full((10, 16), (10 * 1 + 20 * 2) / 30))
    model = server.global_model(task)
    assert torch.equal(model.heads[task].weight, server.global_state["head.weight"])
    several = small_config_dict(method={"name": "fedavg", "shared_head": True})
    with pytest.raises(ManytaskError, match="shared_head needs one task per client"):
        Experiment.build(validate(several)).server_program()


def test_adaptive_server_rules_by_hand():
    """Reddi et al.'s Algorithm 2 on one entry: m₀ = 0, v₀ = τ², Δ = 2, β₁ 0.5, β₂ 0.75, τ 0.5, η 0.1."""
    from manytask.methods.hosts.rules import Adaptive, RoundDelta

    theta, delta = {"w": torch.tensor([1.0])}, {"w": torch.tensor([2.0])}
    expected_v = {"adagrad": 0.25 + 4.0,  # v + Δ²
                  "adam": 0.75 * 0.25 + 0.25 * 4.0,  # β₂ v + (1 − β₂) Δ²
                  "yogi": 0.25 - 0.25 * 4.0 * -1.0}  # v − (1 − β₂) Δ² sign(v − Δ²), sign(0.25 − 4) = −1
    for kind, v in expected_v.items():
        rule = Adaptive(kind, lr=0.1, beta1=0.5, beta2=0.75, tau=0.5)
        state = rule.init(theta)
        assert state["m"]["w"].item() == 0.0 and state["v"]["w"].item() == pytest.approx(0.25)
        new, state = rule.step(theta, state, RoundDelta(delta, {"w": 1}))
        m = 0.5 * 2.0  # (1 − β₁) Δ
        assert state["m"]["w"].item() == pytest.approx(m)
        assert state["v"]["w"].item() == pytest.approx(v), kind
        assert new["w"].item() == pytest.approx(1.0 + 0.1 * m / (v ** 0.5 + 0.5)), kind


def test_fedadam_checkpoints_its_moments_and_refuses_unknown_server_state(tmp_path):
    from manytask.methods.hosts.adaptive import AdaptiveParams, _server
    from tests.test_pfedme import tiny_setup

    server = _server("adam")(tiny_setup({0: {"a": 10}, 1: {"b": 10}}), AdaptiveParams())
    state = server.state_dict()
    assert any(k.startswith("part/m/") for k in state) and any(k.startswith("part/v/") for k in state)
    server.load_state_dict(state)
    with pytest.raises(ValueError, match="unknown server state 'mm'"):
        server.load_state_dict({**state, "part/mm/x": torch.zeros(1)})


@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 7)])
def test_the_chunked_float64_sum_of_float32_values_is_the_running_sum(monkeypatch, shape):
    monkeypatch.setattr(aggregation, "SUM_COLUMNS", 4)
    generator = torch.Generator().manual_seed(1)
    updates = [{"w": torch.randn(shape, generator=generator) * 10.0 ** k} for k in range(-3, 4)]
    weights = [{"w": float(torch.rand(1, generator=generator)) * 50} for _ in updates]
    out, expected = weighted_average(updates, weights)["w"], reference_average(updates, weights)["w"]
    assert out.dtype == torch.float32 and out.shape == torch.Size(shape)
    assert out.numpy().tobytes() == expected.numpy().tobytes()

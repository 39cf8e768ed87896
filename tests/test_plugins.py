"""The plug-ins over hosts: DEA (FedDEA), PCGrad and FedHEAL, by hand on tiny tensors, then end to end."""

import json

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from manytask.client.trainer import TrainConfig
from manytask.config import validate
from manytask.launch import resume, run_config
from manytask.messages import Message, encode
from manytask.methods.base import ClientContext, ClientProgram, Setup
from manytask.methods.common.aggregation import weighted_average
from manytask.methods.common.updates import Update, densify
from manytask.methods.feddea import DeaClient, DeaParams, DeaServer, dea
from manytask.methods.hosts.fedavg import FedAvgParams, FedAvgServer
from manytask.methods.plugins.dea import first_of_stable_sort
from manytask.methods.plugins.fedheal import FedhealParams, FedhealServer, consistency_mask, fairness_weights
from manytask.methods.plugins.pcgrad import PcgradServer, conflicting_pairs, project_conflicts
from manytask.registry import Params
from manytask.tasks import TaskKind, TaskSpec
from tests.conftest import small_config_dict
from tests.simulated_cuda import simulated_cuda

ONE_TASK_PER_CLIENT = {
    "federation": {"num_clients": 6, "tasks": {"kind": "one-per-client"}, "samples": {"kind": "iid"}},
    "benchmark": {"name": "digits-tasks", "tasks": ["digit", "parity", "rotated", "inverted", "mod3", "permuted"]},
}


def tiny_host() -> FedAvgServer:
    specs = {"a": TaskSpec("a", TaskKind.CLASSIFICATION, 2)}
    setup = Setup(specs, (2,), "mlp", {"hidden": [2]}, TrainConfig(), seed=0, rounds=1, holdings={0: {"a": 10}})
    return FedAvgServer(setup, FedAvgParams())


# --- DEA -------------------------------------------------------------------------------------------------------


def test_dea_keeps_the_global_top_k_by_magnitude_rescaled():
    update = torch.tensor([0.1, -3.0, 2.0, 0.5, -1.0, 0.0])
    # k = ⌊0.5·6⌋ = 3: -3, 2, -1 kept, times 1/0.5.
    assert torch.equal(dea(update, 0.5), torch.tensor([0.0, -6.0, 4.0, 0.0, -2.0, 0.0]))
    assert torch.equal(dea(update, 0.5, rescale=False), torch.tensor([0.0, -3.0, 2.0, 0.0, -1.0, 0.0]))


def test_dea_breaks_ties_towards_the_lower_index():
    assert torch.equal(dea(torch.tensor([1.0, -1.0, 1.0, -1.0]), 0.5), torch.tensor([2.0, -2.0, 0.0, 0.0]))
    assert torch.equal(dea(torch.tensor([3.0, 1.0, -1.0, 1.0]), 0.25, "smallest", rescale=False),
                       torch.tensor([0.0, 1.0, 0.0, 0.0]))


def test_dea_k_is_the_floor_of_rho_d():
    assert int(dea(torch.arange(1.0, 101.0), 0.29).count_nonzero()) == 29  # 0.29·100 is 28.999… in floats
    assert int(dea(torch.arange(1.0, 11.0), 0.35).count_nonzero()) == 3
    assert not dea(torch.arange(1.0, 11.0), 0.05).any()


@pytest.mark.parametrize("select", ["largest", "smallest", "random"])
def test_dea_at_rho_one_returns_the_input_itself(select):
    update = torch.tensor([0.3, -2.0, 0.0])
    assert dea(update, 1.0, select, generator=torch.Generator().manual_seed(0)) is update


def test_dea_smallest_ablation_keeps_the_smallest_magnitudes():
    update = torch.tensor([0.1, -3.0, 2.0, 0.5, -1.0, 0.2])
    assert torch.equal(dea(update, 0.5, "smallest"), torch.tensor([0.2, 0.0, 0.0, 1.0, 0.0, 0.4]))


def test_dea_random_ablation_is_a_seeded_mask_of_the_same_size():
    update = torch.arange(1.0, 41.0)
    first = dea(update, 0.25, "random", generator=torch.Generator().manual_seed(3))
    again = dea(update, 0.25, "random", generator=torch.Generator().manual_seed(3))
    other = dea(update, 0.25, "random", generator=torch.Generator().manual_seed(4))
    kept = first != 0
    assert int(kept.sum()) == 10 and torch.equal(first[kept], update[kept] * 4)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert not torch.equal(kept, dea(update, 0.25) != 0)  # not the top-k
    with pytest.raises(ValueError, match="seeded generator"):
        dea(update, 0.25, "random")


@pytest.mark.parametrize("rho", [0.0, -0.1, 1.5])
def test_dea_rejects_a_ratio_outside_zero_one(rho):
    with pytest.raises(ValueError, match="must lie in"):
        dea(torch.ones(3), rho)
    with pytest.raises(ValidationError):
        DeaParams(rho=rho)


class Replies(ClientProgram[Params]):
    """A host client that replies with a fixed message."""

    def __init__(self, reply: Message) -> None:
        super().__init__(None, Params())
        self.reply = reply

    def fit(self, ctx: ClientContext, payload: Message | None) -> Message:
        return self.reply


SENT = {"backbone.w": torch.ones(4), "heads.a.w": torch.zeros(2)}


def test_dea_client_uploads_sparse_top_k_deltas_and_the_server_restores_reference_plus_them():
    reply = Message.from_tensors({
        "backbone.w": torch.tensor([1.1, 0.5, 1.0, 3.0]),  # Δ = [0.1, -0.5, 0, 2]
        "heads.a.w": torch.tensor([0.2, 0.0]),  # Δ = [0.2, 0]
        "buffer/bn.running_mean": torch.tensor([5.0]),
    }, scalars={"n/a": 10})
    params = DeaParams(rho=0.5)
    upload = DeaClient(Replies(reply), None, params).fit(ClientContext(0, 0, {}, seed=1), Message.from_tensors(SENT))
    # one top-3 over [0.1, -0.5, 0, 2, 0.2, 0]: 2, -0.5, 0.2, times 2.
    assert {"backbone.w", "heads.a.w"}.isdisjoint(upload.arrays) and "buffer/bn.running_mean" in upload.arrays
    # c = ‖Δ̃‖ / ‖Δ‖ = sqrt((1 + 16 + 0.16) / (0.01 + 0.25 + 4 + 0.04)); the buffer is no update
    assert upload.scalars == {"n/a": 10, "dea/inflation": pytest.approx((17.16 / 4.3) ** 0.5)}
    server = DeaServer(tiny_host(), None, params)
    server.host.sent = {0: SENT}
    restored = server.restore_reply(0, upload).tensors()
    assert torch.allclose(restored["backbone.w"], torch.tensor([1.0, 0.0, 1.0, 5.0]))
    assert torch.allclose(restored["heads.a.w"], torch.tensor([0.4, 0.0]))
    assert torch.equal(restored["buffer/bn.running_mean"], torch.tensor([5.0]))


def test_dea_selects_within_each_per_task_copy():
    reply = Message.from_tensors({
        "copy/a/backbone.w": torch.tensor([1.0, 1.0, 1.0, 1.0]),
        "heads.a.w": torch.tensor([4.0, 0.0]),  # copy a: Δ = [0, 0, 0, 0 | 4, 0]
        "copy/b/backbone.w": torch.tensor([2.0, 1.0, 1.0, 1.0]),  # copy b: Δ = [1, 0, 0, 0]
    })
    client = DeaClient(Replies(reply), None, DeaParams(rho=0.25, rescale=False))
    upload = client.fit(ClientContext(0, 0, {}, seed=1), Message.from_tensors(SENT))
    server = DeaServer(tiny_host(), None, DeaParams(rho=0.25, rescale=False))
    server.host.sent = {0: SENT}
    restored = server.restore_reply(0, upload).tensors()
    # a global top-1 over both copies would drop copy b's delta; each copy keeps its own ⌊0.25·d⌋.
    assert torch.equal(restored["heads.a.w"], torch.tensor([4.0, 0.0]))
    assert torch.equal(restored["copy/b/backbone.w"], torch.tensor([2.0, 1.0, 1.0, 1.0]))
    assert torch.equal(restored["copy/a/backbone.w"], torch.ones(4))


def test_dea_at_rho_one_uploads_the_host_reply_unchanged():
    reply = Message.from_tensors({"backbone.w": torch.tensor([1.1, 0.5, 1.0, 3.0]), "heads.a.w": torch.ones(2)})
    client = DeaClient(Replies(reply), None, DeaParams(rho=1.0))
    upload = client.fit(ClientContext(0, 0, {}, seed=1), Message.from_tensors(SENT))
    assert upload.arrays.keys() == reply.arrays.keys()
    assert all((upload.arrays[k] == reply.arrays[k]).all() for k in reply.arrays)


def _on_gpu(message: Message) -> Message:
    return Message.from_tensors({k: v.to("cuda") for k, v in message.tensors().items()}, scalars=message.scalars)


@pytest.mark.parametrize("select", ["largest", "smallest", "random"])
@pytest.mark.parametrize("rho", [0.05, 0.5, 0.9])
def test_dea_on_a_device_uploads_what_it_uploads_on_the_host(select, rho):
    """A reply made on a (simulated) GPU: DEA selects, rescales and encodes it there, with one read back, into the
    host path's upload bit for bit (arrays, bytes and the inflation scalar); the server restores it there."""
    generator = torch.Generator().manual_seed(3)
    sent = {"copy/a/backbone.w": torch.randn(40, generator=generator),
            "heads.a.w": torch.randn(3, 5, generator=generator)}
    trained = {k: v + torch.randn(v.shape, generator=generator) * (torch.rand(v.shape, generator=generator) < 0.7)
               for k, v in sent.items()}
    trained["copy/a/backbone.w"][:4] = sent["copy/a/backbone.w"][:4]  # ties at |Δ| = 0
    reply = Message.from_tensors({**trained, "buffer/bn.running_mean": torch.ones(2)}, scalars={"n/a": 4})
    params = DeaParams(rho=rho, select=select)
    host = DeaClient(Replies(reply), None, params).fit(ClientContext(0, 0, {}, seed=1), Message.from_tensors(sent))
    with simulated_cuda() as sim:
        payload = _on_gpu(Message.from_tensors(sent))
        device = DeaClient(Replies(_on_gpu(reply)), None, params).fit(ClientContext(0, 0, {}, seed=1), payload)
        assert device.on_device() and sim.to_host == 0 and sim.host_reads == 1, (sim.to_host, sim.host_reads)
        server = DeaServer(tiny_host(), None, params)
        server.host.sent = {0: payload.tensors()}
        restored = server.restore_reply(0, device).tensors()
        assert all(sim.on_device(v) for v in restored.values()) and sim.host_reads == 2
    assert encode(device) == encode(host)
    expected = DeaServer(tiny_host(), None, params)
    expected.host.sent = {0: sent}
    for key, value in expected.restore_reply(0, host).tensors().items():
        assert torch.equal(restored[key], value), key


def test_dea_on_a_device_refuses_inconsistent_sparse_arrays():
    sent = {"backbone.w": torch.zeros(2, 3)}
    bad = {"sparse/backbone.w/mask": torch.ones(2, 3, dtype=torch.bool), "sparse/backbone.w/values": torch.ones(4)}
    out_of_range = {"sparse/backbone.w/index": torch.tensor([6], dtype=torch.int32),
                    "sparse/backbone.w/values": torch.ones(1)}
    with simulated_cuda():
        for arrays in (bad, out_of_range):
            on_gpu = {k: v.to("cuda") for k, v in arrays.items()}
            with pytest.raises(ValueError, match="inconsistent"):
                densify(on_gpu, {k: v.to("cuda") for k, v in sent.items()})


# --- PCGrad ----------------------------------------------------------------------------------------------------


def test_pcgrad_projects_conflicting_updates_against_the_original_other():
    g1, g2 = {"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([-1.0, 1.0])}
    out = project_conflicts([g1, g2], [[1], [0]])
    # g1·g2 = −1: g1 − (−1/2)·g2 = [0.5, 0.5]; g2 − (−1/1)·g1 = [0, 1] (against the original g1, not [0.5, 0.5]).
    assert torch.allclose(out[0]["w"], torch.tensor([0.5, 0.5]))
    assert torch.allclose(out[1]["w"], torch.tensor([0.0, 1.0]))
    assert float(out[0]["w"] @ g2["w"]) == pytest.approx(0.0)
    assert conflicting_pairs([g1, g2]) == 1


def test_pcgrad_leaves_non_conflicting_updates_untouched():
    g1, g2 = {"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([1.0, 1.0])}
    out = project_conflicts([g1, g2], [[1], [0]])
    assert torch.equal(out[0]["w"], g1["w"]) and torch.equal(out[1]["w"], g2["w"])
    assert conflicting_pairs([g1, g2]) == 0


def test_pcgrad_dots_norms_and_projects_over_the_common_keys_only():
    g1 = {"w": torch.tensor([1.0, 0.0]), "heads.a.w": torch.tensor([3.0])}
    g2 = {"w": torch.tensor([-1.0, 1.0]), "heads.b.w": torch.tensor([5.0])}
    out = project_conflicts([g1, g2], [[1], [0]])
    assert torch.allclose(out[0]["w"], torch.tensor([0.5, 0.5]))  # ‖g2‖² over "w" only: 2, not 27
    assert torch.equal(out[0]["heads.a.w"], g1["heads.a.w"]) and torch.equal(out[1]["heads.b.w"], g2["heads.b.w"])


def test_pcgrad_server_hands_the_host_reference_plus_projected_deltas_in_a_seeded_order():
    reference = {"w": torch.tensor([1.0, 1.0])}
    updates = [Update(c, {"a": 10}, reference, {"w": reference["w"] + d}, {"w": 10.0})
               for c, d in enumerate([torch.tensor([1.0, 0.0]), torch.tensor([-1.0, 1.0]), torch.tensor([0.0, 2.0])])]
    server = PcgradServer(tiny_host(), tiny_host().setup, Params())
    out = server.adjust(0, updates)
    assert server.log == {"pcgrad/conflicts": 1.0}
    assert torch.allclose(out[2].trained["w"], torch.tensor([1.0, 3.0]))  # conflicts with neither
    assert torch.allclose(out[0].trained["w"], torch.tensor([1.5, 1.5]))
    assert sorted(server.order(0, 1, 3)) == [0, 2] and server.order(0, 1, 3) == server.order(0, 1, 3)
    assert len({tuple(server.order(r, 0, 6)) for r in range(5)}) > 1


# --- FedHEAL ---------------------------------------------------------------------------------------------------


def test_fedheal_consistency_mask_and_history_over_rounds_by_hand():
    mask, history = consistency_mask(torch.tensor([0.5, -0.2, 0.0]), None, 0, 0.3)
    assert torch.equal(mask, torch.ones(3)) and torch.equal(history, torch.tensor([1.0, 0.0, 1.0]))
    # directions now [+, +, −]; past agreement [1, 0, 0] -> kept where > 0.3; h = (h·1 + [1, 1, 0]) / 2.
    mask, history = consistency_mask(torch.tensor([0.3, 0.4, -0.1]), history, 1, 0.3)
    assert torch.equal(mask, torch.tensor([1.0, 0.0, 0.0])) and torch.equal(history, torch.tensor([1.0, 0.5, 0.5]))
    # directions [−, +, +]; agreement [0, 0.5, 0.5]; h = (h·2 + [0, 1, 1]) / 3.
    mask, history = consistency_mask(torch.tensor([-1.0, 1.0, 1.0]), history, 2, 0.3)
    assert torch.equal(mask, torch.tensor([0.0, 1.0, 1.0]))
    assert torch.allclose(history, torch.full((3,), 2 / 3))


def test_fedheal_fairness_weights_over_two_rounds_by_hand():
    beta, start = 0.4, torch.full((2,), 0.5, dtype=torch.float64)
    p, w, step = fairness_weights(torch.tensor([1.0, 3.0], dtype=torch.float64), start, torch.zeros(2), beta)
    # δ = 0.4·[1/4, 3/4] = [0.1, 0.3]; w = 0.5 + δ = [0.6, 0.8]; p = w / 1.4.
    assert torch.allclose(step, torch.tensor([0.1, 0.3], dtype=torch.float64))
    assert torch.allclose(p, torch.tensor([0.6, 0.8], dtype=torch.float64) / 1.4)
    p, w, step = fairness_weights(torch.tensor([2.0, 2.0], dtype=torch.float64), w, step, beta)
    # δ = 0.6·[0.1, 0.3] + 0.4·[0.5, 0.5] = [0.26, 0.38]; w = [0.86, 1.18].
    assert torch.allclose(w, torch.tensor([0.86, 1.18], dtype=torch.float64))
    assert torch.allclose(p, torch.tensor([0.86, 1.18], dtype=torch.float64) / 2.04)


def heal_round(server: FedhealServer, round_index: int, deltas: list[list[float]]) -> list[Update]:
    """Clients 0 (n = 10) and 1 (n = 30) update "w" from [1, 1] by `deltas`; buffer "bn" becomes the client id."""
    reference = {"w": torch.tensor([1.0, 1.0]), "buffer/bn": torch.tensor([0.0])}
    updates = []
    for client, (size, change) in enumerate(zip([10, 30], deltas, strict=True)):
        trained = {"w": reference["w"] + torch.tensor(change), "buffer/bn": torch.tensor([float(client)])}
        updates.append(Update(client, {"a": size}, reference, trained, {"w": float(size), "buffer/bn": float(size)}))
    return server.adjust(round_index, updates)


def test_fedheal_server_masks_reweights_and_falls_back_where_no_update_is_kept():
    host = tiny_host()
    server = FedhealServer(host, host.setup, FedhealParams(threshold=0.3, beta=0.4))
    first = heal_round(server, 0, [[1.0, -1.0], [-1.0, 1.0]])
    # first participation: all kept; equal distances -> δ = 0.2, w = 0.7 each, p = 1/2.
    assert torch.equal(first[0].weights["w"], torch.full((2,), 5.0))
    assert torch.equal(first[1].trained["w"], torch.tensor([0.0, 2.0]))
    restarted = FedhealServer(host, host.setup, FedhealParams(threshold=0.3, beta=0.4))
    restarted.load_state_dict(server.state_dict())  # the history survives a checkpoint
    second = heal_round(restarted, 1, [[-1.0, 2.0], [3.0, 4.0]])
    # client 0 has h = [1, 0]: both directions new, mask [0, 0], d = 0; client 1 has h = [0, 1]: mask [0, 1], d = 4.
    # δ = [0.6·0.2, 0.6·0.2 + 0.4] = [0.12, 0.52]; w = [0.82, 1.22]; entry 0 kept by nobody -> host weight × p.
    p0, p1 = 0.82 / 2.04, 1.22 / 2.04
    assert torch.allclose(second[0].weights["w"], torch.tensor([10 * p0, 0.0]))
    assert torch.allclose(second[1].weights["w"], torch.tensor([30 * p1, 30 * p1]))
    assert torch.equal(second[0].trained["w"], torch.tensor([1.0, 1.0]))
    assert torch.equal(second[1].trained["w"], torch.tensor([1.0, 5.0]))
    assert second[1].weights["buffer/bn"] == 30.0 and torch.equal(second[1].trained["buffer/bn"], torch.tensor([1.0]))
    merged = weighted_average([u.trained for u in second], [u.weights for u in second])
    assert torch.allclose(merged["w"], torch.tensor([1.0, 5.0]))
    assert int(restarted.state["count/0"]) == 2


# --- end to end ----------------------------------------------------------------------------------------------


def run_one(tmp_path, plugin, **overrides):
    config = validate(small_config_dict(method={"name": "fedavg", **({} if plugin is None else {"plugin": plugin})},
                                        **overrides))
    (summary,) = run_config(config, tmp_path).values()
    return summary


@pytest.mark.slow
@pytest.mark.parametrize("plugin", [{"name": "dea", "rho": 0.3}, {"name": "pcgrad"}, {"name": "fedheal"}])
def test_fedavg_with_each_plugin_learns_one_task_per_client(tmp_path, plugin):
    summary = run_one(tmp_path / "run", plugin, rounds=6, **ONE_TASK_PER_CLIENT)
    gains = [m["accuracy"] - summary["chance"][t] for t, m in summary["tasks"].items()]
    assert sum(gains) / len(gains) > 0.1, summary["tasks"]
    if plugin["name"] == "pcgrad":
        rows = [json.loads(r) for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert any(r["fit"]["pcgrad/conflicts"] > 0 for r in rows)


@pytest.mark.slow
def test_dea_uploads_fewer_bytes_and_rho_one_is_exactly_fedavg(tmp_path):
    fedavg = run_one(tmp_path / "fedavg", None)
    sparse = run_one(tmp_path / "dea", {"name": "dea", "rho": 0.3})
    full = run_one(tmp_path / "full", {"name": "dea", "rho": 1.0})
    # 30% of the values plus a one-bit mask: about a third of the dense upload.
    assert sparse["bytes_up"] < 0.5 * fedavg["bytes_up"]
    assert full["tasks"] == fedavg["tasks"] and full["bytes_up"] == fedavg["bytes_up"]


@pytest.mark.slow
def test_fedavg_with_fedheal_resumes_exactly(tmp_path):
    data = small_config_dict(method={"name": "fedavg", "plugin": "fedheal"}, rounds=4, participation=0.5,
                             **ONE_TASK_PER_CLIENT)
    full = run_config(validate(data), tmp_path / "full")["fedavg+fedheal"]
    assert run_config(validate(data), tmp_path / "cut", stop_after=2) is None
    resumed = resume(tmp_path / "cut")["fedavg+fedheal"]
    assert resumed["tasks"] == full["tasks"] and resumed["bytes_up"] == full["bytes_up"]


def test_fedheal_falls_back_to_unmasked_weights_where_the_masked_weights_sum_to_zero():
    """The authors' fallback is on the weights: an entry kept only by an update its host weighs 0 (FedGA clips
    weights to 0) takes the unmasked weights, so the host never divides by zero there."""
    from manytask.methods.plugins.fedheal import masked_weights

    masks = [{"w": torch.tensor([1.0, 0.0, 0.0])}, {"w": torch.tensor([0.0, 1.0, 0.0])}]
    weights = masked_weights([{"w": 0.0}, {"w": 2.0}], masks)
    # entry 0: kept by the weight-0 update only -> unmasked (0, 2); entry 1: (0, 2); entry 2: kept by none -> (0, 2)
    assert torch.equal(weights[0]["w"], torch.zeros(3)) and torch.equal(weights[1]["w"], torch.full((3,), 2.0))
    masks = [{"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([1.0, 1.0])}]
    weights = masked_weights([{"w": 1.0}, {"w": 3.0}], masks)
    assert torch.equal(weights[0]["w"], torch.tensor([1.0, 0.0]))
    assert torch.equal(weights[1]["w"], torch.tensor([3.0, 3.0]))


def test_a_key_whose_per_entry_weights_are_all_zero_is_left_out_like_a_zero_float_weight():
    updates = [{"a": torch.ones(2), "b": torch.ones(2)}]
    assert set(weighted_average(updates, [{"a": torch.zeros(2), "b": 0.0}])) == set()
    with pytest.raises(ValueError, match="sum to zero at some entries"):
        weighted_average(updates, [{"a": torch.tensor([0.0, 1.0]), "b": 1.0}])


@pytest.mark.parametrize("largest", [True, False])
def test_the_partition_keeps_the_entries_a_stable_sort_puts_first(largest):
    """DEA's selection by one partition equals the first k of a stable sort, ties to the lower index, on values
    with many ties (rounded) and on every k."""
    generator = torch.Generator().manual_seed(0)
    magnitude = (torch.randn(200, generator=generator) * 4).round().abs()
    order = torch.sort(magnitude, descending=largest, stable=True).indices
    for k in range(0, 201, 7):
        expected = np.zeros(200, dtype=bool)
        expected[order[:k].numpy()] = True
        assert np.array_equal(first_of_stable_sort(magnitude.numpy(), k, largest), expected), k

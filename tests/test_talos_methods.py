"""The federated TaLoS methods: calibration examples, phases, what each variant trains, uploads and assembles, and
exact resumes across the phase boundaries (head-only → calibration → sparse fine-tuning or the one shot)."""

import dataclasses
import json

import pytest
import torch

from manytask.config import validate
from manytask.errors import ManytaskError
from manytask.experiment import Experiment
from manytask.launch import resume, run_config
from manytask.messages import decode, encode
from manytask.methods.base import ClientContext
from manytask.methods.talos.calibration import stratified_examples
from manytask.methods.talos.mask import pack_masks, unpack_masks
from manytask.methods.talos.partitioned import OWNED_PREFIX, VALUES
from manytask.methods.talos.program import MASK_STATE, TRAINABLE_PREFIX
from manytask.models.multitask import task_of_key
from manytask.tasks.task import TaskKind, TaskSpec
from tests.conftest import small_config_dict

TALOS = {"calibration_rounds": 3, "calibration_examples": 40, "sparsity": 0.8}


def talos_config(method: str, rounds: int = 5, **params) -> dict:
    return small_config_dict(method={"name": method, **TALOS, **params}, rounds=rounds, participation=0.5)


def test_calibration_examples_follow_the_clients_label_distribution():
    iid = torch.arange(10).repeat(10)  # ten classes, ten examples each
    chosen = stratified_examples(iid, 10, seed=0)
    assert sorted(iid[chosen].tolist()) == list(range(10))  # one per class
    skewed = torch.tensor([3] * 30 + [7] * 10)
    assert torch.bincount(skewed[stratified_examples(skewed, 8, seed=0)]).tolist()[3::4] == [6, 2]
    assert torch.equal(stratified_examples(skewed, 8, seed=1), stratified_examples(skewed, 8, seed=1))
    assert len(stratified_examples(skewed, 100, seed=0)) == 40  # never more than the client has


def test_a_packed_mask_unpacks_to_itself():
    generator = torch.Generator().manual_seed(0)
    masks = {"a": torch.rand(3, 5, generator=generator) < 0.3, "b": torch.rand(7, generator=generator) < 0.5}
    bits = pack_masks(masks)
    assert bits.dtype == torch.uint8 and bits.numel() == 3  # 22 entries in 3 bytes
    unpacked = unpack_masks(bits, masks)
    assert all(torch.equal(unpacked[k], masks[k]) for k in masks)


def _rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("method", "rounds"), [("talos", 5), ("talos-partition", 5), ("talos-oneshot", 4)])
@pytest.mark.parametrize("stop_after", [2, 3])
def test_each_talos_method_resumes_exactly_across_its_phase_boundaries(tmp_path, method, rounds, stop_after):
    """Stopped at the end of the head-only phase or of the calibration round (clients' masks, or the server's kept
    mask, must survive), the resumed run gives the uninterrupted numbers, bytes and phases."""
    data = talos_config(method, rounds)
    full = run_config(validate(data), tmp_path / "full")[method]
    assert run_config(validate(data), tmp_path / "cut", stop_after=stop_after) is None
    resumed = resume(tmp_path / "cut")[method]
    assert resumed["tasks"] == full["tasks"]
    assert (resumed["bytes_up"], resumed["bytes_down"]) == (full["bytes_up"], full["bytes_down"])
    assert [r["fit"] for r in _rows(tmp_path / "cut")] == [r["fit"] for r in _rows(tmp_path / "full")]


def test_every_client_calibrates_once_and_keeps_one_minus_rho_of_the_scored_entries(tmp_path):
    run_config(validate(talos_config("talos")), tmp_path / "r")
    rows = _rows(tmp_path / "r")
    assert [r["fit"]["phase"] for r in rows] == [0, 0, 1, 2, 2]
    assert rows[2]["sampled"] == [0, 1, 2, 3] and all(len(r["sampled"]) == 2 for r in rows[:2] + rows[3:])
    exp = Experiment.build(validate(talos_config("talos")))
    model, _ = exp.server_program().build_model()
    sizes = {n: p.numel() for n, p in model.named_parameters()}
    fractions = {k[len(TRAINABLE_PREFIX):]: v for k, v in rows[2]["fit"].items() if k.startswith(TRAINABLE_PREFIX)}
    kept = sum(fractions[n] * sizes[n] for n in fractions) / sum(sizes[n] for n in fractions)
    assert kept == pytest.approx(1 - TALOS["sparsity"], abs=1 / sum(sizes[n] for n in fractions))
    assert all(n.startswith("backbone.") for n in fractions)


class Driver:
    """The engine's round, by hand: payloads and replies through the wire format, client state kept per client."""

    def __init__(self, config: dict) -> None:
        self.exp = Experiment.build(validate(config))
        self.server, self.client = self.exp.server_program(), self.exp.client_program()
        self.states: dict[int, dict] = {c: {} for c in range(self.exp.federation.num_clients)}

    def round(self, index: int, sampled: list[int]) -> tuple[dict, dict]:
        clients = self.server.participants(index, sampled)
        payloads = {c: decode(encode(p)) for c, p in self.server.configure_fit(index, clients).items()}
        replies = {}
        for c, payload in payloads.items():
            ctx = ClientContext(c, index, self.exp.client_data(c), self.states[c], seed=100 + 10 * index + c)
            replies[c] = decode(encode(self.client.fit(ctx, payload)))
        self.server.aggregate_fit(index, replies)
        return payloads, replies


def _scored_state(driver: Driver) -> dict[str, torch.Tensor]:
    return {n: driver.server.global_state[n].clone() for n in driver.server.scored}


def test_head_only_rounds_move_the_heads_and_sparse_rounds_only_each_clients_own_mask():
    driver = Driver(talos_config("talos", rounds=4, head_rounds=1))
    pretrained = _scored_state(driver)
    payloads, replies = driver.round(0, [0, 2])
    assert all(task_of_key(k) is not None for p in payloads.values() for k in p.arrays)  # heads only travel
    assert all(task_of_key(k) is not None for r in replies.values() for k in r.arrays)
    assert all(torch.equal(_scored_state(driver)[n], pretrained[n]) for n in pretrained)
    driver.round(1, [0])  # calibration: every client keeps its mask
    assert all(MASK_STATE in state for state in driver.states.values())
    payloads, replies = driver.round(2, [1, 3])
    for c, reply in replies.items():
        sent, trained = payloads[c].tensors(), reply.tensors()
        assert sorted(trained) == sorted(driver.server.scored)  # the full scored vector, no heads
        model, _ = driver.client.build_model()
        mask = unpack_masks(driver.states[c][MASK_STATE], {n: dict(model.named_parameters())[n] for n in trained})
        for name in trained:
            moved = trained[name] != sent[name]
            assert not (moved & ~mask[name]).any(), name  # masked entries bit-identical
        assert any(bool((trained[n] != sent[n]).any()) for n in trained)


def test_partition_clients_train_and_upload_only_their_subset_and_the_server_places_it():
    driver = Driver(talos_config("talos-partition", rounds=4, head_rounds=1))
    driver.round(0, [0, 1])
    _, replies = driver.round(1, [0])
    assert all(not state for state in driver.states.values())  # the mask went to the server, not into state
    subsets = driver.server.subsets()
    kept = driver.server.parts["kept"]
    total = sum(int(m.sum()) for m in kept.values())
    assert total == round((1 - TALOS["sparsity"]) * sum(m.numel() for m in kept.values()))
    union = {n: torch.stack([s[n] for s in subsets]).sum(0) for n in kept}
    assert all(torch.equal(union[n], kept[n].long()) for n in kept)  # disjoint and exhaustive
    before = _scored_state(driver)
    payloads, replies = driver.round(2, [1, 2])
    after = _scored_state(driver)
    for c, reply in replies.items():
        assert list(reply.arrays) == [VALUES]
        owned = {n: payloads[c].tensor(OWNED_PREFIX + n) for n in kept}
        values = reply.tensor(VALUES)
        assert values.numel() == sum(int(m.sum()) for m in owned.values())
        placed = torch.cat([(after[n] - before[n])[owned[n]] for n in owned])
        assert torch.equal(placed, torch.cat([(before[n] + v)[owned[n]] - before[n][owned[n]]
                                              for n, v in _spread(values, owned).items()]))
    untouched = {n: ~(subsets[1][n] | subsets[2][n]) for n in kept}
    assert all(torch.equal(after[n][untouched[n]], before[n][untouched[n]]) for n in kept)


def _spread(values: torch.Tensor, owned: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Uploaded values back into dense deltas (the subset's order is parameter, then row-major)."""
    out, start = {}, 0
    for name, mask in owned.items():
        dense = torch.zeros(mask.shape)
        dense[mask] = values[start : start + int(mask.sum())]
        out[name], start = dense, start + int(mask.sum())
    return out


def test_the_one_shot_trains_every_client_once_with_its_own_local_steps():
    driver = Driver(talos_config("talos-oneshot", rounds=4, shot_steps=12))
    assert [driver.server.phases.at(r).name for r in range(4)] == ["head-only", "head-only", "calibration", "one-shot"]
    assert driver.server.participants(3, [1]) == [0, 1, 2, 3]
    ctx = ClientContext(0, 3, driver.exp.client_data(0), {})
    assert driver.client.trainer(ctx).config.local_steps == 12
    assert driver.client.trainer(dataclasses.replace(ctx, round_index=0)).config.local_steps == 5


def test_phase_lengths_that_do_not_fit_the_run_are_refused_in_one_sentence():
    with pytest.raises(ManytaskError, match=r"head_rounds \+ 2 rounds at least.*head_rounds=4 with rounds=5"):
        Experiment.build(validate(talos_config("talos", head_rounds=4))).server_program()
    with pytest.raises(ManytaskError, match=r"ends with its one-shot round: rounds must be head_rounds \+ 2 = 3"):
        Experiment.build(validate(talos_config("talos-oneshot", head_rounds=1))).client_program()


def test_talos_refuses_tasks_it_cannot_sample_labels_for():
    exp = Experiment.build(validate(talos_config("talos")))
    depth = dataclasses.replace(exp.setup, specs={"d": TaskSpec("d", TaskKind.DEPTH, 1)})
    with pytest.raises(ManytaskError, match=r"TaLoS takes classification tasks only, not: d \(depth\)\."):
        exp.method.client(depth, exp.method_params)


def test_head_only_keeps_the_backbone_at_its_start(tmp_path):
    exp = Experiment.build(validate(small_config_dict(method="head-only")))
    server = exp.server_program()
    assert server.global_state and all(task_of_key(k) is not None for k in server.global_state)
    run = run_config(validate(small_config_dict(method=["head-only", "fedavg"], rounds=2)), tmp_path / "r")
    assert run["head-only"]["bytes_up"] < run["fedavg"]["bytes_up"] / 3


def test_the_original_talos_variant_and_explicit_settings_pick_the_calibration():
    from manytask.methods.talos.program import TalosParams

    assert TalosParams().calibration() == (10, 0.01, False)  # the FL paper: R 10, soft-zero 0.01, log p(ŷ|x)
    assert TalosParams(variant="original").calibration() == (4, 0.1, True)  # TaLoS's code: raw logit
    assert TalosParams(variant="original", calibration_rounds=2, soft_zero=0.0).calibration() == (2, 0.0, True)


@pytest.mark.parametrize(("method", "rounds"), [("talos", 5), ("talos-partition", 5), ("talos-oneshot", 4)])
def test_talos_training_rounds_run_batched_with_the_sequential_numbers(tmp_path, capsys, method, rounds):
    """Every round runs batched and gives the sequential numbers: the head-only rounds (a frozen backbone), the
    calibration round (every client's Fisher scores at once: the same masks, so the same trainable fractions and
    the same partitions) and the sparse rounds (frozen heads, SparseSGDM under each client's own mask or subset)."""
    data = talos_config(method, rounds)
    sequential = run_config(validate({**data, "execution": "sequential"}), tmp_path / "seq")[method]
    batched = run_config(validate(data), tmp_path / "auto")[method]
    assert "execution auto trains" not in capsys.readouterr().err
    assert batched["bytes_down"] == sequential["bytes_down"]
    # a reply's losses are floats in its framing: rounding may change their printed length by a byte
    assert batched["bytes_up"] == pytest.approx(sequential["bytes_up"], abs=8)
    for task, metrics in sequential["tasks"].items():
        assert batched["tasks"][task]["accuracy"] == pytest.approx(metrics["accuracy"], abs=1e-9), task
        assert batched["tasks"][task]["loss"] == pytest.approx(metrics["loss"], rel=1e-4), task
    for a, b in zip(_rows(tmp_path / "seq"), _rows(tmp_path / "auto"), strict=True):
        assert b["fit"].keys() == a["fit"].keys()
        for key, value in a["fit"].items():
            assert b["fit"][key] == pytest.approx(value, rel=1e-4, abs=1e-7), (a["round"], key)

"""Keyed dropout (models/keyed_dropout.py): masks as a function of (key, layer, call, element), the rate and scale of
nn.Dropout, and a round of clients with dropout, attention dropout or drop path trained batched giving each client
its sequential result."""

import pytest
import torch

from manytask.client.trainer import TrainConfig, Trainer
from manytask.execution.batched import TOLERANCE, train_batched
from manytask.execution.plan import ClientPlan
from manytask.models.keyed_dropout import (
    GOLDEN,
    KeyedDropout,
    KeyedDropPath,
    PassKeys,
    dropout_key,
    random_bits,
    wrapped,
)
from manytask.models.multitask import BUFFER_PREFIX, build_model
from manytask.tasks.task import TaskKind, TaskSpec

SPECS = {"a": TaskSpec("a", TaskKind.CLASSIFICATION, 3), "b": TaskSpec("b", TaskKind.CLASSIFICATION, 4)}
VIT = ("vit", {"image_size": 16, "patch_size": 4, "hidden_size": 16, "num_hidden_layers": 2,
               "num_attention_heads": 2, "intermediate_size": 32, "dropout": 0.2})
SWIN = ("swin", {"image_size": 16, "patch_size": 2, "embed_dim": 8, "depths": [1, 2], "num_heads": [1, 2],
                 "window_size": 2, "drop_path_rate": 0.3})


def test_the_bits_are_uniform_and_a_function_of_key_code_and_element_only():
    key = torch.tensor(wrapped(12345 * GOLDEN))
    bits = random_bits(key, 3, (1 << 20,))
    assert torch.equal(bits, random_bits(key.clone(), 3, (1 << 20,)))
    assert int(bits.min()) >= 0 and int(bits.max()) < 1 << 24
    # uniform: each of 16 bins holds 1/16 of 2^20 draws within 5 standard deviations (sd = 242)
    counts = torch.bincount(bits >> 20, minlength=16)
    assert (counts - (1 << 16)).abs().max() < 5 * 242
    for other in (random_bits(key, 4, (1 << 20,)), random_bits(key + 1, 3, (1 << 20,))):
        assert (other == bits).float().mean() < 1e-3  # another layer, another pass: other draws
    assert torch.equal(random_bits(key, 3, (4, 8)).flatten(), bits[:32])  # the element's index, not the shape


def test_keyed_dropout_drops_at_rate_p_and_keeps_the_mean():
    key_model = build_model(*VIT, (3, 16, 16), SPECS, seed=0)
    key = dropout_key(key_model)
    layer = KeyedDropout(0.2, key, 0)
    key.value = torch.tensor(77)
    x = torch.ones(1000, 1000)
    y = layer(x)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 0.2) < 0.002  # sd 4e-4
    assert sorted(torch.unique(y).tolist()) == [0.0, pytest.approx(1 / 0.8)]
    again = layer(x)  # a second call in the same pass draws anew
    assert abs((again == 0).float().mean().item() - 0.2) < 0.002 and not torch.equal(again, y)
    key.value = torch.tensor(77)  # a new pass with the same key repeats the first call's mask
    assert torch.equal(layer(x), y)
    path = KeyedDropPath(0.25, key, 1)
    z = path(torch.ones(4000, 3, 5))
    per_sample = z.flatten(1)
    assert torch.equal(per_sample.min(1).values, per_sample.max(1).values)  # whole samples kept or dropped
    assert abs((per_sample[:, 0] == 0).float().mean().item() - 0.25) < 0.03
    layer.eval()
    assert torch.equal(layer(x), x)


def test_without_a_key_the_layers_draw_from_torchs_generator():
    model = build_model(*VIT, (3, 16, 16), SPECS, seed=0)
    model.train()
    layer = next(m for m in model.modules() if isinstance(m, KeyedDropout))
    x = torch.ones(50, 50)
    torch.manual_seed(5)
    first = layer(x)
    torch.manual_seed(5)
    assert torch.equal(first, torch.nn.functional.dropout(x, 0.2, training=True))


def test_every_random_layer_is_keyed_and_the_trainer_leaves_no_key_set():
    vit = build_model(*VIT, (3, 16, 16), SPECS, seed=0)
    assert not any(type(m) is torch.nn.Dropout and m.p > 0 for m in vit.modules())
    assert sum(isinstance(m, KeyedDropout) for m in vit.modules()) == 5  # embeddings, 2 × (attention, output)
    assert vit.backbone.model.config._attn_implementation == "manytask_keyed"
    swin = build_model(*SWIN, (3, 16, 16), SPECS, seed=0)
    assert sum(isinstance(m, KeyedDropPath) for m in swin.modules()) == 2  # the first block's rate is 0
    assert build_model("mlp", {"hidden": [8]}, (8,), SPECS, seed=0).backbone is not None
    assert dropout_key(build_model("mlp", {"hidden": [8]}, (8,), SPECS, seed=0)) is None
    trainer = Trainer(TrainConfig(lr=0.05, batch_size=4, local_steps=2), SPECS)
    trainer.train(vit, _data(1, {"a": 9}), 1, 0, 10)
    assert dropout_key(vit).value is None
    keys = PassKeys(vit, 1, torch.device("cpu"))
    keys.start("a", 3)
    assert int(dropout_key(vit).value) == wrapped(int(keys.bases["a"]) + 3 * GOLDEN)


def _data(seed, sizes):
    g = torch.Generator().manual_seed(seed)
    return {task: (torch.rand(n, 3, 16, 16, generator=g), torch.randint(0, SPECS[task].num_outputs, (n,),
                                                                         generator=g)) for task, n in sizes.items()}


def _state(model, shift):
    return {**{n: p.detach() + shift for n, p in model.named_parameters()},
            **{n: b.detach().clone() for n, b in model.named_buffers()}}


@pytest.mark.parametrize("architecture", [VIT, SWIN], ids=["vit-dropout", "swin-drop-path"])
def test_a_round_with_dropout_trains_batched_to_each_clients_sequential_result(architecture):
    pytest.importorskip("transformers")
    trainer = Trainer(TrainConfig(lr=0.05, momentum=0.9, batch_size=4, local_epochs=1), SPECS)
    template = build_model(*architecture, (3, 16, 16), SPECS, seed=0)
    clients = [(1, {"a": 10}), (2, {"a": 6, "b": 9}), (3, {"b": 13}), (4, {"a": 5})]
    plans = [ClientPlan(template, trainer, 0, 10, {}, _data(seed, sizes), _state(template, 0.01 * seed), seed)
             for seed, sizes in clients]
    results = train_batched(plans)
    for plan, result in zip(plans, results, strict=True):
        model = build_model(*architecture, (3, 16, 16), SPECS, seed=0)
        model.load_state_dict(plan.start, strict=False)
        report = trainer.train(model, plan.data, plan.seed, 0, 10)
        for task in plan.data:
            assert result.report.mean_loss[task] == pytest.approx(report.mean_loss[task], rel=1e-4)
        for name, value in model.named_parameters():
            if name.startswith("heads.") and name.split(".")[1] not in plan.data:
                continue
            torch.testing.assert_close(result.params[name], value.detach(), **TOLERANCE, msg=name)
        for name, value in model.named_buffers():
            torch.testing.assert_close(result.params[BUFFER_PREFIX + name], value, **TOLERANCE, msg=name)
    # the draws mattered: without them (rate 0) the first client ends elsewhere
    backbone, params = architecture
    plain = build_model(backbone, {**params, "dropout" if backbone == "vit" else "drop_path_rate": 0.0}, (3, 16, 16),
                        SPECS, seed=0)
    plain.load_state_dict(plans[0].start, strict=False)
    trainer.train(plain, plans[0].data, plans[0].seed, 0, 10)
    name = "backbone.model.embeddings.patch_embeddings.projection.weight"
    assert (plain.get_parameter(name) - results[0].params[name]).abs().max() > 1e-3


def test_a_batched_round_with_dropout_dispatches_as_many_kernels_for_16_clients_as_for_4():
    pytest.importorskip("transformers")
    from manytask.bench.kernels import counted

    trainer = Trainer(TrainConfig(lr=0.05, batch_size=4, local_steps=3), SPECS)
    template = build_model(*VIT, (3, 16, 16), SPECS, seed=0)
    counts = []
    for clients in (4, 16):
        plans = [ClientPlan(template, trainer, 0, 10, {}, _data(s, {"a": 12}), _state(template, 0.01 * s), s)
                 for s in range(clients)]
        counts.append(counted(lambda plans=plans: train_batched(plans)))
    assert counts[1].ops <= 1.1 * counts[0].ops and counts[1].syncs == counts[0].syncs

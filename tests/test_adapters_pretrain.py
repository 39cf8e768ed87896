"""LoRA adapters on the small backbones, and the cached pretraining."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from manytask import pretrain
from manytask.benchmarks import build_benchmark
from manytask.errors import ManytaskError
from manytask.models import build_model, trainable_state
from manytask.models.adapters import LoraParams, add_lora
from manytask.models.linearized import Linearized
from manytask.pretrain import PretrainParams, pretrained_backbone
from manytask.tasks import TaskKind, TaskSpec

SPECS = {"a": TaskSpec("a", TaskKind.CLASSIFICATION, 3), "b": TaskSpec("b", TaskKind.CLASSIFICATION, 2)}


def _model():
    return build_model("mlp", {"hidden": [16, 8]}, (6,), SPECS, 0)


def test_lora_starts_as_the_base_model_and_only_adapters_and_heads_train():
    model = _model()
    x = torch.randn(4, 6)
    before = model(x, "a").detach()
    add_lora(model.backbone, LoraParams(rank=2, alpha=4), seed=1)
    assert torch.allclose(model(x, "a"), before)  # B = 0: a fresh adapter changes nothing
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"backbone.layers.1.lora_A", "backbone.layers.1.lora_B", "backbone.layers.3.lora_A",
                         "backbone.layers.3.lora_B", "heads.a.weight", "heads.a.bias", "heads.b.weight", "heads.b.bias"}
    assert set(trainable_state(model, ["b"])) == trainable - {"heads.a.weight", "heads.a.bias"}


def test_lora_forward_is_base_plus_scaled_low_rank_product():
    model = _model()
    add_lora(model.backbone, LoraParams(rank=2, alpha=4, targets=["layers.1"]), seed=1)
    layer = model.backbone.layers[1]
    with torch.no_grad():
        layer.lora_B.fill_(0.5)
    x = torch.randn(3, 6)
    expected = layer.base_layer(x) + (4 / 2) * x @ layer.lora_A.T @ layer.lora_B.T
    assert torch.allclose(layer(x), expected)


def test_lora_init_is_seeded_and_bad_targets_are_clear_errors():
    a, b = _model(), _model()
    add_lora(a.backbone, LoraParams(rank=2), seed=3)
    add_lora(b.backbone, LoraParams(rank=2), seed=3)
    assert torch.equal(a.backbone.layers[1].lora_A, b.backbone.layers[1].lora_A)
    with pytest.raises(ManytaskError, match=r"'layers\.0' is not a linear layer"):
        add_lora(_model().backbone, LoraParams(targets=["layers.0"]), seed=0)


def test_linearized_model_equals_the_model_at_its_start_and_is_first_order_after():
    torch.manual_seed(0)  # this test draws from the global generator: fix it so test order cannot matter
    model = _model()
    add_lora(model.backbone, LoraParams(rank=2), seed=1)
    model.double()  # float64, so the second-order gap is not lost in rounding
    with torch.no_grad():
        for name, p in model.backbone.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)  # a start away from B = 0, so every adapter has a Jacobian
    linear = Linearized(model)
    x = torch.randn(5, 6, dtype=torch.float64)
    assert torch.allclose(linear(x, "a"), model(x, "a"), atol=1e-12)
    start = model(x, "a").detach()
    # A step small enough that no ReLU pre-activation changes sign: there the model is smooth, so
    # the linearization's error is second-order in the step while the output moves first-order.
    step = {n: 1e-5 * torch.randn_like(p) for n, p in model.backbone.named_parameters() if p.requires_grad}
    with torch.no_grad():
        for name, p in model.backbone.named_parameters():
            if name in step:
                p.add_(step[name])
    moved = (model(x, "a") - start).abs().max()
    gap = (linear(x, "a") - model(x, "a")).abs().max()
    assert moved > 1e-7 and gap < 1e-3 * moved
    linear(x, "a").sum().backward()
    assert all(p.grad is not None for n, p in model.backbone.named_parameters() if n in step)


def test_pretraining_is_cached_deterministic_and_needs_a_source(tmp_path, monkeypatch):
    monkeypatch.setenv("MANYTASK_CACHE", str(tmp_path))
    bench = build_benchmark("digits-tasks", {"tasks": ["digit", "parity"], "holdout": 0.3}, seed=0)
    params = PretrainParams(epochs=2)
    first = pretrained_backbone(bench, "mlp", {"hidden": [16]}, params, seed=0)
    stamp = first.path.stat().st_mtime_ns
    again = pretrained_backbone(bench, "mlp", {"hidden": [16]}, params, seed=0)
    assert again.path == first.path and again.path.stat().st_mtime_ns == stamp  # reused, not retrained
    assert "digit-source" in first.description and "held out from every task" in first.description
    other = pretrained_backbone(bench, "mlp", {"hidden": [16]}, PretrainParams(epochs=3), seed=0)
    assert other.path != first.path
    first.path.unlink()
    retrained = pretrained_backbone(bench, "mlp", {"hidden": [16]}, params, seed=0)
    assert retrained.path.read_bytes() == again.path.read_bytes()
    plain = build_benchmark("digits-tasks", {"tasks": ["digit"]}, seed=0)
    with pytest.raises(ManytaskError, match="has no pretraining source"):
        pretrained_backbone(plain, "mlp", {"hidden": [16]}, params, seed=0)


def test_two_processes_pretraining_one_backbone_at_once_both_finish(tmp_path, monkeypatch):
    """Parallel runs (or tests) may pretrain the same backbone at once. Here a second writer runs whole between the
    first one's write and its swap: each writes a temporary file of its own, so both finish with the same file."""
    monkeypatch.setenv("MANYTASK_CACHE", str(tmp_path))
    bench = build_benchmark("digits-tasks", {"tasks": ["digit", "parity"], "holdout": 0.3}, seed=0)
    args = (bench, "mlp", {"hidden": [16]}, PretrainParams(epochs=1))
    writes = []

    def save_then_let_another_writer_run(state, name, metadata):
        save_file(state, name, metadata=metadata)
        writes.append(name)
        if len(writes) == 1:
            pretrained_backbone(*args, seed=0)

    monkeypatch.setattr(pretrain, "save_file", save_then_let_another_writer_run)
    path = pretrained_backbone(*args, seed=0).path
    assert len(set(writes)) == 2 and [p.name for p in tmp_path.rglob("*") if p.is_file()] == [path.name]
    assert "held out from every task" in pretrained_backbone(*args, seed=0).description


def test_an_interrupted_cache_write_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("MANYTASK_CACHE", str(tmp_path))
    bench = build_benchmark("digits-tasks", {"tasks": ["digit", "parity"], "holdout": 0.3}, seed=0)

    def half_written(state, name, metadata):
        Path(name).write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(pretrain, "save_file", half_written)
    with pytest.raises(KeyboardInterrupt):
        pretrained_backbone(bench, "mlp", {"hidden": [16]}, PretrainParams(epochs=1), seed=0)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_holdout_images_are_in_no_task():
    bench = build_benchmark("digits-tasks", {"tasks": ["digit", "rotated"], "holdout": 0.3}, seed=0)
    held = bench.pretraining
    source = {bytes(x.numpy()) for x in held.x_train} | {bytes(x.numpy()) for x in held.x_test}
    task = bench.tasks["digit"]
    used = {bytes(x.numpy()) for x in task.x_train} | {bytes(x.numpy()) for x in task.x_test}
    assert not source & used
    assert len(source) + len(used) >= 1797 - 20  # (a few digits images are exact duplicates)

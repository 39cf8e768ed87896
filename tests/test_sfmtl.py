"""SFMTL-Graph's programs: the anchor loss, what travels, client state across rounds and resume."""

import json

import pytest
import torch

from manytask.bench.kernels import counted
from manytask.config import validate
from manytask.engine.checkpoint import load_checkpoint
from manytask.launch import resume, run_config
from manytask.methods.manytask.sfmtl_math import anchor_step, random_graph
from manytask.models import build_model
from manytask.seeding import torch_generator
from manytask.tasks import TaskKind, TaskSpec
from tests.conftest import small_config_dict

PERSONAL = {
    "benchmark": {"name": "rotated-masked-digits", "num_clients": 6, "patch_prob": 0.25},
    "federation": {"num_clients": 6, "tasks": {"kind": "one-per-client"}, "samples": {"kind": "iid"}},
    "model": {"backbone": "mlp", "hidden": [16]},
}


def test_anchor_loss_and_momentum_update_by_hand():
    model = build_model("mlp", {"hidden": [2]}, (2,), {"t": TaskSpec("t", TaskKind.CLASSIFICATION, 2)}, 0)
    with torch.no_grad():
        model.backbone.layers[1].weight.copy_(torch.eye(2))
        model.backbone.layers[1].bias.zero_()
    x = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])  # features = relu(x) = x
    y = torch.tensor([0, 0, 1])
    features = model.backbone(x)
    counter = counted(lambda: anchor_step(features, y, torch.ones(3), torch.zeros(2, 2), momentum=0.5))
    assert counter.syncs == 0  # classes as a one-hot matrix: nothing read back to the host
    loss, anchors = anchor_step(features, y, torch.ones(3), torch.zeros(2, 2), momentum=0.5)
    # class 0: mean(|[1,0]|², |[3,0]|²) / k = 5 / 2; class 1: |[0,2]|² / k = 4 / 2; (2.5 + 2) / 2 = 2.25
    assert loss.item() == pytest.approx(2.25)
    assert torch.allclose(anchors, torch.tensor([[1.0, 0.0], [0.0, 1.0]]))  # 0.5·0 + 0.5·mean


def test_padding_and_absent_classes_leave_the_anchor_loss_and_anchors_alone():
    """A padded sample (mask 0) counts for nothing; a class absent from the batch keeps its anchor and is not in
    the average."""
    features = torch.tensor([[1.0, 0.0], [3.0, 0.0], [9.0, 9.0]])
    anchors = torch.tensor([[0.0, 0.0], [5.0, 5.0], [7.0, 7.0]])
    loss, moved = anchor_step(features, torch.tensor([0, 0, 1]), torch.tensor([1.0, 1.0, 0.0]), anchors, 0.5)
    assert loss.item() == pytest.approx(2.5)  # class 0 alone: 5 / 2
    assert torch.equal(moved[1:], anchors[1:]) and torch.allclose(moved[0], torch.tensor([1.0, 0.0]))
    empty, same = anchor_step(features, torch.tensor([0, 0, 1]), torch.zeros(3), anchors, 0.5)
    assert empty.item() == 0 and torch.equal(same, anchors)


@pytest.mark.slow
def test_only_heads_and_anchors_travel_and_the_backbone_stays_on_the_client(tmp_path):
    config = validate(small_config_dict(method="sfmtl-graph", rounds=3, **PERSONAL))
    summary = run_config(config, tmp_path / "r")["sfmtl-graph"]
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    head_and_anchors = 4 * (16 * 10 + 10 + 10 * 16) + 2  # head W, b; 10 anchors of 16 floats; 10 label bits
    assert all(head_and_anchors < b < head_and_anchors + 800 for r in rows for b in r["bytes_up"].values())
    assert rows[0]["bytes_down"] == {str(c): 0 for c in range(6)}  # nothing to send before the first round
    assert all(b > head_and_anchors for b in rows[1]["bytes_down"].values())  # updated head + community anchor
    assert all("communities" in r["fit"] for r in rows)
    edges = [k for k in rows[-1]["fit"] if k.startswith("graph/")]
    assert edges and all(int(k.split("/")[1]) < int(k.split("/")[2]) for k in edges)
    assert summary["fairness"]["worst_10"] <= summary["fairness"]["mean"]


@pytest.mark.slow
def test_client_backbones_persist_and_resume_exactly(tmp_path):
    data = small_config_dict(method="sfmtl-graph", rounds=3, **PERSONAL)
    full = run_config(validate(data), tmp_path / "full")["sfmtl-graph"]
    assert run_config(validate(data), tmp_path / "cut", stop_after=2) is None
    from manytask.engine.checkpoint import load_checkpoint

    states = load_checkpoint(tmp_path / "cut" / "checkpoint.safetensors").clients
    assert all(any(k.startswith("backbone.") for k in s) and "anchors" in s for s in states.values())
    assert resume(tmp_path / "cut")["sfmtl-graph"]["tasks"] == full["tasks"]


def test_the_random_graph_control_is_seeded_symmetric_and_replaces_the_learned_graph(tmp_path):
    weights = random_graph(5, torch_generator(3, "g"))
    assert torch.equal(weights, weights.T) and torch.equal(weights.diagonal(), torch.zeros(5))
    assert bool(((weights > 0) | torch.eye(5, dtype=torch.bool)).all()) and float(weights.max()) < 1
    assert torch.equal(weights, random_graph(5, torch_generator(3, "g")))
    edges = {}
    for graph in ("learned", "random"):
        config = small_config_dict(**PERSONAL, method={"name": "sfmtl-graph", "graph": graph}, rounds=2)
        run_config(validate(config), tmp_path / graph)
        rows = [json.loads(line) for line in (tmp_path / graph / "metrics.jsonl").read_text().splitlines()]
        edges[graph] = {k: v for k, v in rows[-1]["fit"].items() if k.startswith("graph/")}
    assert len(edges["random"]) == 15 and edges["random"] != edges["learned"]  # every pair of 6 clients


def test_the_papers_cnn_has_signed_features_and_a_relu_opening_every_head(tmp_path):
    specs = {"t": TaskSpec("t", TaskKind.CLASSIFICATION, 3)}
    signed = build_model("cnn", {"hidden": 8, "signed_features": True}, (1, 8, 8), specs, 0)
    plain = build_model("cnn", {"hidden": 8}, (1, 8, 8), specs, 0)
    assert list(signed.state_dict()) == list(plain.state_dict())  # the same parameters, one ReLU moved
    x = torch.randn(6, 1, 8, 8)
    outputs, features = signed.forward_with_features(x, "t")
    assert bool((features < 0).any()) and torch.allclose(outputs, signed.heads["t"](torch.relu(features)))
    assert torch.equal(torch.relu(features), plain.backbone(x))  # same seed: same weights before the ReLU
    config = small_config_dict(**{**PERSONAL, "model": {"backbone": "cnn", "channels": [4], "hidden": 8,
                                                        "signed_features": True}}, method="sfmtl-graph", rounds=2)
    run_config(validate(config), tmp_path / "run")
    states = load_checkpoint(tmp_path / "run" / "checkpoint.safetensors").clients
    anchors = torch.stack([state["anchors"] for state in states.values() if "anchors" in state])
    assert bool((anchors < 0).any())  # the anchors track signed features

"""MaTU and its baselines end to end: they learn, they send what they should, and MaTU's masks travel as bits."""

import json
import math

import pytest
import torch

from manytask.config import validate
from manytask.launch import resume, run_config
from manytask.methods.manytask.matfl import cosine_similarity, group_clients
from manytask.methods.personalized.fedper import module_of, personal_keys
from tests.conftest import small_config_dict

ADAPTED = {
    "benchmark": {"name": "digits-tasks", "tasks": ["digit", "parity", "rotated"], "holdout": 0.3},
    "model": {"backbone": "mlp", "hidden": [32], "adapter": {"rank": 4, "alpha": 8}, "pretrained": True,
              "pretrain": {"epochs": 10}},
    "train": {"lr": 0.03, "local_epochs": 1, "batch_size": 32},
    "federation": {"num_clients": 4, "tasks": {"kind": "all"}, "samples": {"kind": "iid"}},
}
ADAPTER_DIM = 64 * 4 + 32 * 4  # ADAPTED's LoRA A (rank x in) and B (out x rank) of the one hidden linear layer
HEAD_PARAMS = (32 * 10 + 10) + (32 * 2 + 2) + (32 * 10 + 10)  # digit, parity, rotated heads on 32 features


def test_group_clients_by_update_similarity():
    updates = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [-0.1, 1.0]])
    similarity = cosine_similarity(updates)
    assert similarity[0, 1] == pytest.approx(0.9 / math.hypot(0.9, 0.1))
    assert group_clients(similarity, threshold=0.5) == [[0, 1], [2, 3]]
    assert group_clients(similarity, threshold=-1.0) == [[0, 1, 2, 3]]
    assert group_clients(similarity[:1, :1], threshold=0.5) == [[0]]


def test_fedper_keeps_the_last_block_and_heads_personal():
    keys = ["backbone.layers.1.lora_A", "backbone.layers.1.lora_B", "backbone.layers.3.lora_A",
            "backbone.layers.3.lora_B", "heads.digit.weight", "heads.digit.bias"]
    assert module_of("backbone.layers.3.lora_A") == module_of("backbone.layers.3.weight") == "backbone.layers.3"
    assert personal_keys(keys) == {"backbone.layers.3.lora_A", "backbone.layers.3.lora_B", "heads.digit.weight",
                                   "heads.digit.bias"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "method",
    ["matu", {"name": "fedavg", "per_task": True}, {"name": "fedprox", "per_task": True, "mu": 0.01},
     {"name": "ntk-fedavg", "per_task": True}, "fedper", "matfl", "individual"],
    ids=lambda m: m if isinstance(m, str) else m["name"],
)
def test_each_method_learns_with_adapters_on_a_pretrained_backbone(tmp_path, method):
    config = validate(small_config_dict(method=method, rounds=4, **ADAPTED))
    summary = next(iter(run_config(config, tmp_path / "run").values()))
    assert "pretrained" in summary["pretraining"] and summary["adapter"]["rank"] == 4
    for task, metrics in summary["tasks"].items():
        assert metrics["accuracy"] > summary["chance"][task] + 0.15, (task, metrics)


@pytest.mark.slow
def test_matu_uploads_one_vector_plus_bit_masks_and_costs_fewer_bits_per_task_than_fedavg(tmp_path):
    config = validate(small_config_dict(method=["matu", {"name": "fedavg", "per_task": True}], rounds=1, **ADAPTED))
    summaries = run_config(config, tmp_path / "cmp")
    assert summaries["matu"]["bits_per_task_per_round"] < summaries["fedavg"]["bits_per_task_per_round"]
    d, heads = ADAPTER_DIM, HEAD_PARAMS
    expected = {
        "matu": 4 * (d + heads) + 3 * math.ceil(d / 8),  # one unified vector, 3 masks as packed bits, heads
        "fedavg": 4 * (3 * d + heads),  # one adapter copy per task, heads
    }
    for label, payload in expected.items():
        row = json.loads((tmp_path / "cmp" / label / "metrics.jsonl").read_text().splitlines()[0])
        for sent in row["bytes_up"].values():
            assert payload < sent < payload + 1500, label  # + the JSON header


@pytest.mark.slow
def test_matu_without_unification_sends_each_task_its_own_vector(tmp_path):
    """The ablation `unify: false`: one float vector per task each way, so holders start from the server's vectors."""
    method = {"name": "matu", "unify": False, "label": "matu-per-task"}
    summary = run_config(validate(small_config_dict(method=method, rounds=1, **ADAPTED)), tmp_path / "run")
    per_task = 4 * (3 * ADAPTER_DIM + HEAD_PARAMS)  # one float vector per task, heads
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    for sent in row["bytes_up"].values():
        assert per_task < sent < per_task + 1500
    for metrics in summary["matu-per-task"]["tasks"].values():
        assert metrics["client_loss"] == pytest.approx(metrics["loss"], rel=1e-6)


@pytest.mark.slow
def test_matu_resumes_to_the_same_numbers(tmp_path):
    data = small_config_dict(method="matu", rounds=3, **ADAPTED)
    full = run_config(validate(data), tmp_path / "full")["matu"]
    assert run_config(validate(data), tmp_path / "cut", stop_after=1) is None
    assert resume(tmp_path / "cut")["matu"]["tasks"] == full["tasks"]


@pytest.mark.slow
def test_matu_logs_the_task_similarity_matrix_and_the_report_draws_it(tmp_path):
    from manytask.report import write_report

    run_config(validate(small_config_dict(method="matu", rounds=2, **ADAPTED)), tmp_path / "run")
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    similarity = {k: v for k, v in row["fit"].items() if k.startswith("similarity/")}
    assert len(similarity) == 9 and all(0 <= v <= 1 for v in similarity.values())
    assert similarity["similarity/digit/parity"] == similarity["similarity/parity/digit"]
    write_report(tmp_path / "run")
    assert (tmp_path / "run" / "plots" / "task_similarity_matu.png").stat().st_size > 5000
    assert "task_similarity_matu.png" in (tmp_path / "run" / "report.md").read_text()


@pytest.mark.slow
def test_matu_sign_similarity_recovers_the_true_groups_on_synthetic(tmp_path):
    from manytask.config_sources import load_yaml
    from manytask.report.plots import similarity_ari
    from manytask.report.runs import load_run
    from tests.test_docs import ROOT

    data = load_yaml(ROOT / "configs" / "matu" / "synthetic_single_task.yaml")
    data.update(method="matu", rounds=6, eval_every=6, reference=None)
    run_config(validate(data), tmp_path / "run")
    assert similarity_ari(load_run(tmp_path / "run")) == pytest.approx(1.0)


@pytest.mark.slow
def test_matu_reports_the_clients_view_next_to_the_servers(tmp_path):
    """A lone task's holder starts from the server's vector itself; co-held tasks start from a reconstruction."""
    from manytask.report import write_report

    federation = {"num_clients": 2, "tasks": {"kind": "groups", "groups": [["digit"], ["parity", "rotated"]]},
                  "samples": {"kind": "iid"}}
    data = small_config_dict(method="matu", rounds=2, **{**ADAPTED, "federation": federation})
    tasks = run_config(validate(data), tmp_path / "run")["matu"]["tasks"]
    assert tasks["digit"]["client_accuracy"] == tasks["digit"]["accuracy"]
    assert tasks["digit"]["client_loss"] == pytest.approx(tasks["digit"]["loss"], rel=1e-6)
    assert any(abs(tasks[t]["client_loss"] - tasks[t]["loss"]) > 1e-4 for t in ("parity", "rotated"))
    client_view = sum(m["client_accuracy"] for m in tasks.values()) / 3
    report = write_report(tmp_path / "run").read_text()
    assert f"average main metric, clients' view: {100 * client_view:.1f}" in report


@pytest.mark.slow
def test_matu_beats_fedavg_when_clients_hold_fixed_groups_of_related_tasks(tmp_path):
    """The paper's no-conflict task groups on the domains benchmark (docs/matu.md: 81.8 vs 78.2 % at 20 rounds)."""
    from manytask.config_sources import load_yaml
    from tests.test_docs import ROOT

    data = load_yaml(ROOT / "configs" / "matu" / "digits_domains_conflict_0.yaml")
    data.update(method=["matu", {"name": "fedavg", "per_task": True}], rounds=20, eval_every=20, reference=None)
    summaries = run_config(validate(data), tmp_path / "run")
    assert summaries["matu"]["average"] > summaries["fedavg"]["average"] + 0.02
    assert summaries["matu"]["bits_per_task_per_round"] < 0.5 * summaries["fedavg"]["bits_per_task_per_round"]

"""Defects a new user met on a first try (issue 35), each pinned by a test that failed before its fix."""

import importlib
import sys

import pytest
import yaml
from typer.testing import CliRunner

from manytask.cli import app


def test_the_mas_package_is_what_the_natural_import_gives():
    from manytask.methods import mas

    assert mas is importlib.import_module("manytask.methods.mas")
    assert callable(mas.best_partition) and callable(mas.self_affinity)


MISSING = [  # (the module an extra installs, a command line that needs it, the extra)
    ("optuna", ["tune", "--trials", "1", "rounds=1"], "tune"),
    ("flwr", ["run", "engine=flower-sim", "rounds=1"], "flower"),
    ("transformers", ["run", "configs/talos/scene_objects_protocol.yaml", "rounds=1", "model.pretrained=false"],
     "vision"),
]


@pytest.mark.parametrize(("module", "arguments", "extra"), MISSING, ids=[m for m, _, _ in MISSING])
def test_a_missing_extra_is_named_in_one_sentence_and_nothing_is_written(module, arguments, extra, tmp_path,
                                                                        monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: its import raises ModuleNotFoundError
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [*arguments, "--out", str(out), "--quiet"] if arguments[0] == "run"
                                else [*arguments, "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert f"the '{extra}' extra installs" in lines[0] and f"pip install 'manytask[{extra}]'" in lines[0], lines[0]
    assert not out.exists()


def test_require_names_the_extra_only_for_the_missing_module_itself(monkeypatch):
    from manytask.errors import ManytaskError
    from manytask.extras import require

    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(ManytaskError, match=r"^manytask tune needs optuna, which the 'tune' extra installs"):
        require("optuna", "manytask tune")
    assert require("json", "anything").dumps([1]) == "[1]"


def test_the_comparison_fits_an_80_column_terminal_and_report_md_keeps_every_column(tmp_path, monkeypatch):
    from rich.console import Console

    import manytask.cli as cli
    from manytask.report import comparison_rows, load_runs
    from tests.conftest import small_config_dict

    out, config = tmp_path / "cmp", tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump(small_config_dict(method=["fedavg", "local"], rounds=1)))
    assert CliRunner().invoke(app, ["run", str(config), "--out", str(out), "--quiet"]).exit_code == 0
    headers, rows = comparison_rows(load_runs([out / "fedavg", out / "local"]))
    assert len(headers) >= 12  # the table that wrapped into noise
    monkeypatch.setattr(cli, "out_console", Console(width=80))
    result = CliRunner().invoke(app, ["compare", str(out / "fedavg"), str(out / "local")])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, result.stdout
    for row in rows:  # each run's row on one line, its label and average unbroken
        assert any(row[0] in line and row[headers.index("average")] in line for line in lines), (row, result.stdout)
    assert "columns left out for this terminal's width; report.md has them all" in " ".join(result.stdout.split())
    report = (out / "report.md").read_text()
    assert "| " + " | ".join(headers) + " |" in report


def test_calibrate_mask_takes_a_plain_classifier_and_an_iterator_of_inputs():
    import torch
    from torch import nn

    from manytask.methods.talos import calibrate_mask

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    inputs = (torch.randn(5, 6) for _ in range(3))  # a generator: read once
    masks = calibrate_mask(model, inputs, sparsity=0.75, rounds=3)
    assert set(masks) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert all(masks[n].shape == p.shape and masks[n].dtype == torch.bool for n, p in model.named_parameters())
    total = sum(m.numel() for m in masks.values())
    assert sum(int(m.sum()) for m in masks.values()) == total - round(0.75 * total)  # (1 − ρ*) left trainable
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    only_first = calibrate_mask(model, [torch.randn(5, 6)], sparsity=0.5, rounds=2, scored=[r"^0\."])
    assert set(only_first) == {"0.weight", "0.bias"}


def test_the_default_jobs_samples_work_on_a_dense_benchmark_and_keep_the_digits_partition(tmp_path):
    import numpy as np

    from manytask.benchmarks.registry import build_benchmark
    from manytask.config_sources import default_config
    from manytask.federation.builder import build_federation

    federation = default_config()["federation"]
    scenes = build_benchmark("scenes", {"size": 16, "train_per_task": 40, "test_size": 8}, seed=0)
    split = build_federation(scenes, federation["num_clients"], federation["tasks"], federation["samples"], seed=0)
    for task in scenes.task_names:  # no labels to skew: each holder's share, split IID, covers the task once
        held = np.concatenate([client[task] for client in split.clients if task in client])
        assert np.array_equal(np.sort(held), np.arange(40))
    digits = build_benchmark("digits-tasks", {"tasks": ["digit", "parity"], "holdout": 0.3}, seed=0)
    skewed = {**federation["samples"], "kind": "dirichlet"}
    ours = build_federation(digits, 10, federation["tasks"], federation["samples"], seed=0)
    theirs = build_federation(digits, 10, federation["tasks"], skewed, seed=0)
    assert all(a.keys() == b.keys() and all(np.array_equal(a[t], b[t]) for t in a)
               for a, b in zip(ours.clients, theirs.clients, strict=True))


def test_the_default_job_runs_on_scenes_with_only_the_benchmark_and_the_model_swapped(tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [
        "run", "benchmark={name: scenes, size: 16, train_per_task: 40, test_size: 8}",
        "model={backbone: cnn, channels: [4, 8, 8]}", "method=[fedavg]", "rounds=1", "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    assert (out / "summary.json").exists()

"""Δ% against a base run with per-task signs, and the picture grid of a dense run, from run directories."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from manytask.errors import ManytaskError
from manytask.report.delta import delta_percent, delta_table, resolve_base, task_delta
from manytask.report.pictures import plot_prediction_grid
from manytask.report.runs import RunRecord, load_run


def _record(label, miou, rmse, path=None):
    summary = {
        "label": label, "tasks": {"semseg": {"miou": miou}, "depth": {"rmse": rmse}},
        "main_metric": {"semseg": "miou", "depth": "rmse"}, "higher_is_better": {"semseg": True, "depth": False},
    }
    return RunRecord(Path(path or label), summary)


def test_task_deltas_carry_each_task_s_direction():
    base, run = _record("fedavg", 0.40, 0.50), _record("fedavg+dea", 0.50, 0.60)
    assert task_delta(run, base, "semseg") == pytest.approx(25.0)  # mIoU up 25 %: better
    assert task_delta(run, base, "depth") == pytest.approx(-20.0)  # RMSE up 20 %: worse
    assert delta_percent(run, base) == pytest.approx(2.5)


def test_the_delta_table_marks_directions_and_the_base_row_is_zero():
    base, run = _record("fedavg", 0.40, 0.50), _record("fedavg+dea", 0.30, 0.40)
    headers, rows = delta_table([base, run], base)
    assert headers == ["run", "Δ%", "semseg miou ↑ Δ%", "depth rmse ↓ Δ%"]
    assert rows == [["fedavg", "+0.00", "+0.00", "+0.00"], ["fedavg+dea", "-2.50", "-25.00", "+20.00"]]


def test_an_unknown_base_names_the_runs_it_could_be(tmp_path):
    records = [_record("fedavg", 0.4, 0.5), _record("fedprox", 0.4, 0.5)]
    assert resolve_base(records, "fedprox") is records[1]
    with pytest.raises(ManytaskError, match="'nope' is neither a run directory nor one of the runs compared "
                                            "\\(fedavg, fedprox\\)"):
        resolve_base(records, "nope")


def test_the_picture_grid_draws_every_dense_task(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    summary = {"label": "r", "tasks": {}, "task_kinds": {"semseg": "segmentation", "depth": "depth",
                                                          "normals": "normals", "edge": "edges"}}
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "metrics.jsonl").write_text("")
    (run / "config.yaml").write_text("method: fedavg\n")
    x = torch.rand(3, 3, 8, 8)
    tensors = {"semseg/targets": torch.randint(0, 4, (3, 8, 8)), "semseg/outputs": torch.randn(3, 4, 8, 8),
               "depth/targets": torch.rand(3, 1, 8, 8), "depth/outputs": torch.rand(3, 1, 8, 8),
               "normals/targets": torch.randn(3, 3, 8, 8), "normals/outputs": torch.randn(3, 3, 8, 8),
               "edge/targets": (torch.rand(3, 1, 8, 8) > 0.5).float(), "edge/outputs": torch.randn(3, 1, 8, 8)}
    tensors |= {f"{task}/inputs": x.clone() for task in ("semseg", "depth", "normals", "edge")}
    assert plot_prediction_grid(load_run(run), tmp_path / "grid.png") is None  # nothing recorded yet
    save_file(tensors, str(run / "predictions.safetensors"))
    path = plot_prediction_grid(load_run(run), tmp_path / "grid.png")
    assert path is not None and path.stat().st_size > 5000


def test_a_dense_comparison_reports_delta_against_a_base_with_pictures(tmp_path):
    from typer.testing import CliRunner

    from manytask.cli import app
    from manytask.config import validate
    from manytask.launch import run_config
    from manytask.report import write_report

    config = validate({
        "name": "dense", "method": ["fedavg", {"name": "fedavg", "plugin": {"name": "dea", "rho": 0.5}}],
        "benchmark": {"name": "scenes", "tasks": "nyud-like", "size": 16, "train_per_task": 16, "test_size": 8},
        "federation": {"num_clients": 4, "tasks": {"kind": "one-per-client"}, "samples": {"kind": "iid"}},
        "model": {"backbone": "cnn", "channels": [4, 8], "decoder": {"width": 4}},
        "train": {"optimizer": "adamw", "lr": 0.002, "local_steps": 2, "batch_size": 8},
        "rounds": 2, "eval_every": 1, "seed": 0,
    })
    out = tmp_path / "cmp"
    run_config(config, out)
    text = write_report(out, base="fedavg").read_text()
    assert "## Δ% against fedavg" in text and "semseg miou ↑ Δ%" in text and "depth rmse ↓ Δ%" in text
    for plot in ("task_panels.png", "delta_vs_round.png", "predictions_fedavg.png", "predictions_fedavg+dea.png"):
        assert (out / "plots" / plot).is_file(), plot
    assert "accuracy_vs_round.png" not in text  # no average of unlike metrics
    result = CliRunner().invoke(app, ["compare", str(out), "--base", "fedavg"])
    assert result.exit_code == 0 and "Δ% against fedavg" in result.output
    result = CliRunner().invoke(app, ["compare", str(out), "--base", "fedsgd"])
    assert result.exit_code == 2 and "'fedsgd' is neither a run directory nor one of the runs compared" in result.output

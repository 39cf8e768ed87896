"""The command line: runs, reports, comparisons, and one clear sentence for each kind of bad input."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from manytask.cli import app
from tests.conftest import small_config_dict

runner = CliRunner()


def _write_config(tmp_path, **overrides):
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(small_config_dict(**overrides)))
    return path


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["method=fedsgd"], "unknown method 'fedsgd'; valid choices: centralized, centralized-head-only"),
        (["benchmark=cifar"], "unknown benchmark 'cifar'; valid choices: cifar10, cifar100, digits-tasks"),
        (["train.lrr=0.1"], "unknown config key 'train.lrr'; valid keys here: optimizer, lr"),
        (["rounds=many"], "config key 'rounds' is invalid"),
        (
            ["federation.num_clients=2", "federation.tasks={kind: one-per-client}"],
            "needs at least as many clients as tasks",
        ),
        (["method=fedprox", "method.mu=-1"], "parameter 'mu' of method 'fedprox' is invalid"),
        (["federation.samples.kind=shards", "federation.samples.classes_per_client=11"], "classes"),
    ],
)
def test_bad_input_exits_nonzero_with_one_sentence_and_writes_nothing(tmp_path, args, expected):
    config = _write_config(tmp_path)
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", str(config), *args, "--out", str(out), "--quiet"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    text = " ".join(result.output.split())
    assert text.startswith("error:") and expected in text, text
    assert not out.exists()


def test_missing_config_file_and_existing_run_dir_are_clear_errors(tmp_path):
    result = runner.invoke(app, ["run", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and "does not exist" in result.output
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    result = runner.invoke(app, ["run", str(_write_config(tmp_path)), "--out", str(tmp_path / "busy")])
    assert result.exit_code == 2 and "already exists" in result.output
    assert [p.name for p in (tmp_path / "busy").iterdir()] == ["keep.txt"]


@pytest.mark.slow
def test_run_report_compare_and_resume_through_the_cli(tmp_path):
    config = _write_config(tmp_path, method=["fedavg", "local"], rounds=2)
    out = tmp_path / "cmp"
    result = runner.invoke(app, ["run", str(config), "rounds=2", "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "fedavg" in result.output and "local" in result.output
    assert (out / "report.md").exists() and (out / "plots" / "accuracy_vs_round.png").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["runs"]) == {"fedavg", "local"}
    result = runner.invoke(app, ["report", str(out / "fedavg")])
    assert result.exit_code == 0 and (out / "fedavg" / "report.md").exists()
    result = runner.invoke(app, ["compare", str(out / "fedavg"), str(out / "local")])
    assert result.exit_code == 0 and "fedavg" in result.output
    result = runner.invoke(app, ["run", "--resume", str(out), "--quiet"])  # finished: nothing to redo
    assert result.exit_code == 0
    after = json.loads((out / "summary.json").read_text())
    assert after["runs"]["fedavg"]["tasks"] == summary["runs"]["fedavg"]["tasks"]


def test_list_shows_every_registry_with_parameters():
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0
    for name in ("fedavg", "fedprox", "mu=0.01", "digits-tasks", "synthetic", "mnist1d", "dirichlet", "shards",
                 "one-per-client", "mlp", "cnn"):
        assert name in result.output


def test_pretrain_command_trains_once_then_reuses_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MANYTASK_CACHE", str(tmp_path / "cache"))
    config = _write_config(tmp_path)
    args = ["pretrain", str(config), "benchmark.holdout=0.3", "model.pretrain={epochs: 2}"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "held out from every task" in first.output and "weights:" in first.output
    stored = list((tmp_path / "cache" / "pretrained").glob("*.safetensors"))
    assert len(stored) == 1
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and again.output == first.output
    missing = runner.invoke(app, ["pretrain", str(config)])
    assert missing.exit_code == 2 and "has no pretraining source" in missing.output

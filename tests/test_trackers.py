"""`loggers: [tensorboard, mlflow]`: every round's scalars by step, read back with TensorBoard's own reader and with
MlflowClient; params, summaries, the report and its plots; nested runs for a comparison's members and seeds; a
resumed run continuing the same tracker runs with no step logged twice and none missed."""

import json
import sys

import pytest
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from typer.testing import CliRunner

from manytask.cli import app
from manytask.config import validate
from manytask.launch import resume, run_config
from manytask.trackers.mlflow_runs import MlflowBackend
from manytask.trackers.rows import row_scalars
from tests.conftest import small_config_dict

LOGGERS = ["tensorboard", "mlflow"]


def config(**overrides):
    return validate(small_config_dict(**{"loggers": LOGGERS, "rounds": 4, "eval_every": 2, **overrides}))


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def scalars_by_step(run_dir):
    """{tag: {step: value}} of the member's event files, as TensorBoard reads them."""
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    found = {}
    for tag in events.Tags()["scalars"]:
        steps = [e.step for e in events.Scalars(tag)]
        assert len(steps) == len(set(steps)), (tag, steps)  # no step twice
        found[tag] = {e.step: e.value for e in events.Scalars(tag)}
    return found


def mlflow_runs(out):
    state = json.loads((out / "trackers.json").read_text())["mlflow"]
    client = MlflowClient(state["tracking_uri"])
    return client, {name: client.get_run(run_id) for name, run_id in state["runs"].items()}


def assert_rows_logged(client, run, run_dir):
    expected = {}
    for row in rows(run_dir):
        for name, value in {**row_scalars(row), "round": row["round"]}.items():
            expected.setdefault(name, {})[row["round"]] = value
    events = scalars_by_step(run_dir)
    assert set(events) == set(expected)
    for name, by_step in expected.items():  # event files hold float32
        assert events[name] == pytest.approx(by_step, rel=1e-6), name
    for name, by_step in expected.items():
        history = client.get_metric_history(run.info.run_id, name)
        assert [m.step for m in history] == sorted(by_step), name
        assert {m.step: m.value for m in history} == by_step, name


def test_a_comparison_logs_rounds_params_summaries_and_the_report_in_nested_runs(tmp_path):
    out = tmp_path / "cmp"
    run_config(config(method=["fedavg", "local"]), out)
    client, runs = mlflow_runs(out)
    root = runs["cmp"]
    assert set(runs) == {"cmp", "fedavg", "local"} and all(r.info.status == "FINISHED" for r in runs.values())
    for label in ("fedavg", "local"):
        run = runs[label]
        assert run.data.tags["mlflow.parentRunId"] == root.info.run_id
        assert run.data.params["train.lr"] == "0.05" and run.data.params["method.name"] == label
        assert_rows_logged(client, run, out / label)
        summary = json.loads((out / label / "summary.json").read_text())
        assert run.data.metrics["summary/tasks/digit/accuracy"] == summary["tasks"]["digit"]["accuracy"]
        assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"config.yaml", "summary.json"}
    artifacts = {a.path for a in client.list_artifacts(root.info.run_id)}
    assert {"report.md", "summary.json", "plots"} <= artifacts
    plots = {a.path for a in client.list_artifacts(root.info.run_id, "plots")}
    assert plots == {f"plots/{p.name}" for p in (out / "plots").glob("*.png")} and plots
    text = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0, "images": 0})
    text.Reload()
    assert "report/text_summary" in text.Tags()["tensors"] and len(text.Tags()["images"]) == len(plots)


def test_seeds_nest_under_their_label(tmp_path):
    out = tmp_path / "seeded"
    run_config(config(method=["fedavg"], seeds=[0, 1], rounds=2), out)
    _, runs = mlflow_runs(out)
    parent = {name: r.data.tags.get("mlflow.parentRunId") for name, r in runs.items()}
    ids = {name: r.info.run_id for name, r in runs.items()}
    assert parent == {"seeded": None, "seeded/fedavg": ids["seeded"], "fedavg@seed0": ids["seeded/fedavg"],
                      "fedavg@seed1": ids["seeded/fedavg"]}


def test_a_resumed_run_continues_the_same_tracker_runs_without_a_step_twice(tmp_path):
    out = tmp_path / "single"
    assert run_config(config(), out, stop_after=2) is None
    _, before = mlflow_runs(out)
    assert before["fedavg"].info.status == "KILLED"
    resume(out)
    client, after = mlflow_runs(out)
    assert after["fedavg"].info.run_id == before["fedavg"].info.run_id and after["fedavg"].info.status == "FINISHED"
    assert_rows_logged(client, after["fedavg"], out)
    assert [r["round"] for r in rows(out)] == [1, 2, 3, 4]


def test_a_round_the_trackers_missed_is_logged_from_metrics_jsonl_on_resume(tmp_path, monkeypatch):
    out = tmp_path / "missed"
    log = MlflowBackend.log

    def dies_at_round_3(self, node, step, scalars):  # the process dies after round 3's checkpoint, before its log
        if step == 3:
            raise KeyboardInterrupt
        log(self, node, step, scalars)

    monkeypatch.setattr(MlflowBackend, "log", dies_at_round_3)
    with pytest.raises(KeyboardInterrupt):
        run_config(config(), out)
    monkeypatch.setattr(MlflowBackend, "log", log)
    client, runs = mlflow_runs(out)
    assert [m.step for m in client.get_metric_history(runs["fedavg"].info.run_id, "round")] == [1, 2]
    resume(out)
    assert_rows_logged(client, mlflow_runs(out)[1]["fedavg"], out)


@pytest.mark.parametrize(("module", "extra"), [("mlflow", "mlflow"), ("tensorboard", "tensorboard")])
def test_a_missing_tracker_names_its_extra_and_writes_nothing(module, extra, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", f"loggers=[{module}]", "rounds=1", "--out", str(out), "--quiet"])
    assert result.exit_code == 2 and f"pip install 'manytask[{extra}]'" in result.stderr, result.output
    assert not out.exists()


def test_mlflow_tracking_uri_sends_the_runs_elsewhere(tmp_path):
    store = f"sqlite:///{tmp_path / 'shared.db'}"
    out = tmp_path / "run"
    run_config(config(loggers=["mlflow"], rounds=2, mlflow={"tracking_uri": store, "experiment": "team"}), out)
    assert not (out / "mlflow.db").exists() and (tmp_path / "shared.db").is_file()
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("team").experiment_id])
    assert run.info.run_name == "fedavg" and [m.step for m in client.get_metric_history(run.info.run_id, "round")] == [
        1, 2]

"""End-to-end runs of the local engine: every method, resume, determinism, dropouts, checkpoints."""

import json

import pytest
import torch

from manytask.config import validate
from manytask.engine.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from manytask.launch import resume, run_config
from tests.conftest import small_config_dict

pytestmark = pytest.mark.slow


def _final_metrics(out):
    return json.loads((out / "summary.json").read_text())["tasks"]


@pytest.mark.parametrize("method", ["fedavg", {"name": "fedprox", "mu": 0.1}, "local", "centralized"])
def test_short_run_of_each_method_learns(tmp_path, method):
    config = validate(small_config_dict(method=method, rounds=4))
    summary = run_config(config, tmp_path / "run")[config.methods[0].get("label") or config.methods[0]["name"]]
    for task, metrics in summary["tasks"].items():
        assert metrics["accuracy"] > summary["chance"][task] + 0.1, (task, metrics)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    communicates = summary["method"] in ("fedavg", "fedprox")
    assert (summary["bytes_up"] > 0) == communicates
    assert (summary["bits_per_task_per_round"] > 0) == communicates


def test_fedavg_upload_bytes_equal_the_serialized_model(tmp_path):
    config = validate(small_config_dict(rounds=1))
    summary = run_config(config, tmp_path / "run")["fedavg"]
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    hidden, inputs = 32, 64
    # backbone (64*32 + 32 floats) + heads of the held tasks (32*C + C), 4 bytes each, plus a small header.
    classes = {"digit": 10, "parity": 2, "rotated": 10}
    fed = json.loads((tmp_path / "run" / "federation.json").read_text())["clients"]
    for client, sent in row["bytes_up"].items():
        floats = inputs * hidden + hidden + sum(hidden * classes[t] + classes[t] for t in fed[int(client)])
        assert 4 * floats < sent < 4 * floats + 1500
    assert summary["bytes_up"] == sum(row["bytes_up"].values())


def test_resume_after_stop_is_bit_identical_to_uninterrupted(tmp_path):
    data = small_config_dict(method=["fedavg", "local"], rounds=4, participation=0.5, dropout=0.2)
    full = run_config(validate(data), tmp_path / "full")
    assert run_config(validate(data), tmp_path / "cut", stop_after=2) is None
    checkpoint = load_checkpoint(tmp_path / "cut" / "fedavg" / "checkpoint.safetensors")
    assert checkpoint.round == 2
    assert not (tmp_path / "cut" / "fedavg" / "summary.json").exists()
    resumed = resume(tmp_path / "cut")
    for label in ("fedavg", "local"):
        assert resumed[label]["tasks"] == full[label]["tasks"]
        assert resumed[label]["bytes_up"] == full[label]["bytes_up"]
        assert _final_metrics(tmp_path / "cut" / label) == _final_metrics(tmp_path / "full" / label)
    rows = (tmp_path / "cut" / "fedavg" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["round"] for r in rows] == [1, 2, 3, 4]


def test_a_run_checkpointed_every_second_round_resumes_to_the_uninterrupted_numbers(tmp_path):
    """`checkpoint_every: 2`: a crash after round 3 leaves the checkpoint of round 2; the resumed run drops round 3's
    row, redoes it and ends with the numbers of a run never stopped (whose checkpoints came every round)."""
    data = small_config_dict(method=["fedavg", "local", "sfmtl-graph"], rounds=5, participation=0.5, dropout=0.2,
                             benchmark={"name": "rotated-masked-digits", "num_clients": 6, "patch_prob": 0.25},
                             federation={"num_clients": 6, "tasks": {"kind": "one-per-client"},
                                         "samples": {"kind": "iid"}})
    full = run_config(validate(data), tmp_path / "full")
    assert run_config(validate({**data, "checkpoint_every": 2}), tmp_path / "cut", stop_after=3) is None
    assert load_checkpoint(tmp_path / "cut" / "fedavg" / "checkpoint.safetensors").round == 2
    rows = (tmp_path / "cut" / "fedavg" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["round"] for r in rows] == [1, 2, 3]
    resumed = resume(tmp_path / "cut")
    for label in ("fedavg", "local", "sfmtl-graph"):
        assert resumed[label]["tasks"] == full[label]["tasks"], label
        assert _final_metrics(tmp_path / "cut" / label) == _final_metrics(tmp_path / "full" / label)
    assert load_checkpoint(tmp_path / "cut" / "fedavg" / "checkpoint.safetensors").round == 5  # the last round's
    rows = (tmp_path / "cut" / "fedavg" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["round"] for r in rows] == [1, 2, 3, 4, 5]


def test_resume_drops_metric_rows_written_after_the_last_checkpoint(tmp_path):
    data = small_config_dict(rounds=3)
    run_config(validate(data), tmp_path / "run", stop_after=1)
    metrics = tmp_path / "run" / "metrics.jsonl"
    row = json.loads(metrics.read_text().splitlines()[0])
    metrics.write_text(metrics.read_text() + json.dumps({**row, "round": 2}) + "\n")  # a crash mid-checkpoint
    resume(tmp_path / "run")
    assert [json.loads(r)["round"] for r in metrics.read_text().splitlines()] == [1, 2, 3]


def test_same_seed_same_summary_metrics(tmp_path):
    data = small_config_dict(rounds=2, participation=0.5)
    a = run_config(validate(data), tmp_path / "a")["fedavg"]
    b = run_config(validate(data), tmp_path / "b")["fedavg"]
    c = run_config(validate({**data, "seed": 8}), tmp_path / "c")["fedavg"]
    assert a["tasks"] == b["tasks"] and a["bytes_up"] == b["bytes_up"]
    assert a["tasks"] != c["tasks"]


def test_dropouts_and_sampling_are_recorded(tmp_path):
    data = small_config_dict(rounds=3, clients_per_round=3, dropout=0.5, federation={
        "num_clients": 6, "tasks": {"kind": "dirichlet", "zeta": 1.0}, "samples": {"kind": "iid"}})
    run_config(validate(data), tmp_path / "run")
    rows = [json.loads(r) for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(len(r["sampled"]) == 3 for r in rows)
    assert any(r["dropped"] for r in rows)
    for r in rows:
        assert set(r["bytes_down"]) == {str(c) for c in r["sampled"]}
        assert set(r["bytes_up"]) == {str(c) for c in r["sampled"]} - {str(c) for c in r["dropped"]}


def test_comparison_writes_members_and_normalized_summary(tmp_path):
    data = small_config_dict(method=["fedavg", "centralized"], rounds=2)
    run_config(validate(data), tmp_path / "cmp")
    combined = json.loads((tmp_path / "cmp" / "summary.json").read_text())
    assert combined["order"] == ["fedavg", "centralized"] and combined["reference"] == "centralized"
    assert combined["runs"]["centralized"]["normalized_average"] == pytest.approx(1.0)
    fedavg = combined["runs"]["fedavg"]
    ratios = [fedavg["tasks"][t]["accuracy"] / combined["runs"]["centralized"]["tasks"][t]["accuracy"]
              for t in fedavg["tasks"]]
    assert fedavg["normalized_average"] == pytest.approx(sum(ratios) / len(ratios))
    assert (tmp_path / "cmp" / "fedavg" / "config.yaml").exists()


def test_checkpoint_round_trip_and_atomic_replace(tmp_path):
    path = tmp_path / "ck.safetensors"
    ck = Checkpoint(3, {"w": torch.ones(2)}, {0: {"a": torch.zeros(3)}, 5: {}}, {"elapsed": 1.5}, torch.get_rng_state())
    save_checkpoint(path, ck)
    save_checkpoint(path, Checkpoint(4, {"w": torch.full((2,), 2.0)}, {0: {"a": torch.ones(3)}}, {}))
    back = load_checkpoint(path)
    assert back.round == 4 and torch.equal(back.server["w"], torch.full((2,), 2.0))
    assert torch.equal(back.clients[0]["a"], torch.ones(3))
    assert not list(tmp_path.glob("*.tmp"))


def test_round_fails_clearly_when_too_few_clients_reply(tmp_path):
    from manytask.errors import ManytaskError

    data = small_config_dict(rounds=3, dropout=0.9, min_replies=4)
    expected = (r"round \d failed: \d of 4 sampled clients replied, fewer than min_replies=4 "
                r"\((client \d|\d clients): simulated dropout\)\.$")  # the failures grouped by reason
    with pytest.raises(ManytaskError, match=expected):
        run_config(validate(data), tmp_path / "run")
    metrics = tmp_path / "run" / "metrics.jsonl"
    rows = [json.loads(r) for r in metrics.read_text().splitlines()] if metrics.exists() else []
    assert all(len(r["bytes_up"]) == 4 for r in rows)  # only rounds that met the minimum were recorded


def test_simulated_dropouts_are_logged_as_failures_with_client_ids(tmp_path):
    data = small_config_dict(rounds=3, dropout=0.5)
    run_config(validate(data), tmp_path / "run")
    rows = [json.loads(r) for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(r["dropped"] for r in rows)
    for r in rows:
        assert r["failures"] == {str(c): "simulated dropout" for c in r["dropped"]}


def test_diverged_replies_are_discarded_as_failures(tmp_path):
    from manytask.errors import ManytaskError

    data = small_config_dict(rounds=1, train={"lr": 1e36, "momentum": 0.0, "local_steps": 5})
    with pytest.raises(ManytaskError, match=r"round 1 failed: 0 of 4 .*reply has non-finite values"):
        run_config(validate(data), tmp_path / "run")


def test_client_data_stays_materialized_for_a_bounded_number_of_clients(monkeypatch):
    from manytask.engine import resident
    from manytask.engine.client_runner import ClientRunner
    from manytask.experiment import Experiment

    monkeypatch.setattr(resident, "CACHED_CLIENTS", 2)
    experiment = Experiment.build(validate(small_config_dict(rounds=1)))
    runner = ClientRunner(experiment)
    for client in (0, 1, 2, 1):
        ctx = runner._context(client, 0, {}, seed=0)
        expected = experiment.client_data(client)
        assert all(torch.equal(ctx.data[t][0], expected[t][0]) for t in expected)
    assert list(runner.data._host) == [2, 1]  # the least recently asked-for client was dropped


def test_a_loop_stopped_in_memory_goes_on_from_its_own_state_and_times_its_checkpoints(tmp_path):
    """`run(stop_after=k)` then `run()` on the same loop continues from memory: the checkpoint on disk is not read
    again (here it is damaged in between), and the run ends with the numbers of one never stopped."""
    from manytask.engine.local import local_engine
    from manytask.experiment import Experiment
    from manytask.rundir import RunDir

    config = validate(small_config_dict(rounds=3, participation=0.5))
    full = run_config(config, tmp_path / "full")
    experiment = Experiment.build(config)
    run_dir = RunDir(tmp_path / "loop")
    run_dir.start("", experiment.federation.to_json())
    loop = local_engine(experiment, run_dir)
    assert loop.run(stop_after=1) is None
    written = loop.checkpoint_seconds
    assert written > 0
    run_dir.checkpoint.write_bytes(b"damaged")
    summary = loop.run()
    assert summary["tasks"] == full[experiment.label]["tasks"]
    assert loop.checkpoint_seconds > written  # rounds 2 and 3 wrote theirs
    assert load_checkpoint(run_dir.checkpoint).round == 3

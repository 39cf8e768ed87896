"""`manytask bench` runs and writes its figures (the speed targets live in the command, never in a timed test)."""

import json

import pytest
from typer.testing import CliRunner

from manytask.cli import app

pytestmark = pytest.mark.slow


CHEAP_PARTS = ["engine", "workers", "memory", "matu", "sfmtl"]  # kernels: tests/test_kernels.py counts them per method


def test_bench_prints_and_writes_its_ratios(tmp_path):
    only = [arg for part in CHEAP_PARTS for arg in ("--only", part)]
    result = CliRunner().invoke(app, ["bench", "--out", str(tmp_path / "bench.json"), "--rounds", "1", *only,
                                      "--matu-d", "1000", "--sfmtl-clients", "20"])
    assert result.exit_code == 0, result.output
    figures = json.loads((tmp_path / "bench.json").read_text())
    assert set(figures) == {"machine", "engine_overhead", "parallel_clients", "peak_memory", "matu_server_step",
                            "sfmtl_graph"}
    assert [row["clients"] for row in figures["engine_overhead"]] == [30, 100]
    for row in figures["engine_overhead"]:
        assert row["ratio"] == pytest.approx(row["engine_s_per_round"] / row["bare_s_per_round"])
        assert row["engine_s_per_round"] > 0 and row["bare_s_per_round"] > 0
        assert row["vectorized_speedup"] == pytest.approx(row["bare_s_per_round"] / row["vectorized_s_per_round"])
        assert row["ratio_plain_sgd"] == pytest.approx(row["engine_s_per_round"] / row["bare_plain_sgd_s_per_round"])
    parallel = figures["parallel_clients"]
    assert parallel["workers"] == 2
    assert parallel["speedup"] == pytest.approx(parallel["one_process_s_per_round"] / parallel["workers_s_per_round"])
    assert [(m["clients"], m["participation"]) for m in figures["peak_memory"]] == [(1000, 0.1), (10_000, 0.01)]
    assert all(100 < m["peak_rss_mb"] < 4096 for m in figures["peak_memory"])  # the bound: under 4 GB
    matu = figures["matu_server_step"]
    assert (matu["d"], matu["tasks"]) == (1000, 30) and matu["ratio"] == pytest.approx(
        matu["server_step_s"] / matu["one_pass_s"])
    assert figures["sfmtl_graph"]["clients"] == 20 and figures["sfmtl_graph"]["graph_s"] > 0
    assert "engine / bare" in result.output and "bare / vectorized" in result.output
    assert "speed-up" in result.output and figures["machine"]["torch"]


def test_the_limit_part_times_the_batched_round_against_one_model_on_the_concatenated_batches(tmp_path):
    result = CliRunner().invoke(app, ["bench", "--out", str(tmp_path / "bench.json"), "--rounds", "1",
                                      "--only", "limit"])
    assert result.exit_code == 0, result.output
    limit = json.loads((tmp_path / "bench.json").read_text())["compute_limit"]
    assert (limit["clients"], limit["turns"]) == (20, 3)
    runs = ("batched", "concatenated", "sequential", "bare")
    assert all(0 < limit[f"{run}_s_per_round"] < 60 for run in runs)
    # each ratio is the median over turns of the paired rounds' ratio (bench.paired_ratio), not a ratio of medians
    assert 0 < limit["batched_ratio"] < 10 and 0 < limit["sequential_ratio"] < 10
    assert limit["checkpoint_share"] == pytest.approx(limit["checkpoint_s_per_round"] / limit["batched_s_per_round"])
    assert "compute limit" in result.output.lower()


def test_only_measures_the_parts_asked_for_and_names_the_valid_ones(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["bench", "--out", str(tmp_path / "b.json"), "--only", "matu", "--only", "sfmtl",
                                 "--matu-d", "1000", "--sfmtl-clients", "20"])
    assert result.exit_code == 0, result.output
    assert set(json.loads((tmp_path / "b.json").read_text())) == {"machine", "matu_server_step", "sfmtl_graph"}
    assert "MaTU's server step" in result.output and "engine overhead" not in result.output
    result = runner.invoke(app, ["bench", "--out", str(tmp_path / "c.json"), "--only", "gpu"])
    assert result.exit_code != 0 and "unknown bench part 'gpu'" in result.output and "flower" in result.output
    assert not (tmp_path / "c.json").exists()


def test_interleaved_runs_take_turns_and_report_their_fastest_block(monkeypatch):
    from manytask.bench import timing as bench

    clock, calls = [0.0], []
    costs = {"a": iter([9.0, 2.0, 1.0, 3.0]), "b": iter([9.0, 5.0, 50.0, 4.0])}  # warm-up, then three blocks each

    def runner(name):
        def run(count):
            calls.append((name, count))
            clock[0] += next(costs[name]) * count
        return run

    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    seconds = bench.interleaved_seconds({"a": runner("a"), "b": runner("b")}, rounds=2, repeats=3)
    assert calls == [("a", 1), ("b", 1)] + [("a", 2), ("b", 2)] * 3
    assert seconds == {"a": 1.0, "b": 4.0}  # the fastest block per round: b's burst of load (50) is left out


def test_paired_rounds_rotate_the_order_and_the_ratio_is_the_median_over_turns(monkeypatch):
    from manytask.bench import timing as bench

    clock, calls = [0.0], []
    # warm-up, then four turns; in turn 2 the machine is twice as slow for both, in turn 3 a burst hits a alone
    costs = {"a": iter([9.0, 1.1, 2.2, 50.0, 1.1]), "b": iter([9.0, 1.0, 2.0, 1.0, 1.0])}

    def runner(name):
        def run(count):
            calls.append(name)
            clock[0] += next(costs[name]) * count
        return run

    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    seconds = bench.paired_rounds({"a": runner("a"), "b": runner("b")}, turns=4)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]
    assert seconds["a"] == pytest.approx([1.1, 2.2, 50.0, 1.1]) and seconds["b"] == pytest.approx([1.0, 2.0, 1.0, 1.0])
    assert bench.paired_ratio(seconds["a"], seconds["b"]) == pytest.approx(1.1)


def test_the_paper_scale_part_times_every_member_against_the_bare_loop():
    from manytask.bench.paper_scale import paper_members
    from manytask.bench.tables import tables

    small = ["benchmark.source=digits", "benchmark.num_clients=4", "federation.num_clients=4",
             "train.local_epochs=1"]
    paper = paper_members(rounds=1, sequential_rounds=1, overrides=small)
    members = {row["member"]: row for row in paper["members"]}
    assert list(members) == ["sfmtl-graph", "sfmtl-random-graph", "fedu", "pfedme", "fedavg", "local"]
    assert paper["clients_per_round"] == 2 and paper["device"] == "cpu"
    # pFedMe takes K = 5 steps on each batch: five times the sample passes of a round
    assert members["pfedme"]["passes_per_round"] == pytest.approx(5 * members["fedavg"]["passes_per_round"])
    for row in paper["members"]:
        assert row["batched_images_per_s"] == pytest.approx(row["passes_per_round"] / row["batched_s_per_round"])
        assert row["batched_over_bare"] == pytest.approx(row["batched_images_per_s"] / paper["bare_images_per_s"])
        assert row["sequential_s_per_round"] > 0 and 0 < row["checkpoint_share"] < 1
    assert paper["all_batched_s_per_round"] == pytest.approx(sum(r["batched_s_per_round"] for r in paper["members"]))
    ((headers, rows, title),) = tables({"paper_members": paper})
    assert headers[0] == "member" and len(rows) == 6 + 2
    assert rows[-2][0] == "bare sequential loop" and "paper scale" in title


def test_the_bare_round_takes_its_epochs_and_clips_its_gradients():
    import torch

    from manytask.bench.timing import bare_round
    from manytask.tasks.task import TaskKind, TaskSpec

    steps = []

    class Counted(torch.optim.SGD):
        def step(self, closure=None):
            steps.append(1)
            return super().step(closure)

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    forward = model.forward  # called with a task, which one linear model ignores
    model.forward = lambda x, task=None: forward(x)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    data = {0: {"t": (torch.randn(10, 3) * 100, torch.randint(2, (10,)))}}
    sgd = lambda params, lr, momentum, wd: Counted(params, lr=lr)  # noqa: E731
    specs = {"t": TaskSpec("t", TaskKind.CLASSIFICATION, 2)}
    after = bare_round(model, state, data, specs, batch_size=4, lr=1.0, momentum=0.0, seed=0, sgd=sgd, epochs=2,
                       clip=1e-3)
    assert len(steps) == 2 * 3  # ceil(10 / 4) steps an epoch
    moved = torch.cat([(after[k] - state[k]).flatten() for k in state]).norm()
    assert 0 < moved <= 6 * 1e-3 + 1e-6  # each step moves at most lr × clip


def test_the_scale_part_times_phased_and_dense_methods_after_their_warm_up():
    """The scale checks' machinery on tiny stand-ins: TaLoS timed from its first sparse round (two warm-up rounds),
    FedAvg + DEA on encoder–decoders with BatchNorm decoders, each against a bare loop taking each task's own loss;
    one paper-scale table per check."""
    from manytask.bench.paper_scale import scale_members
    from manytask.bench.tables import tables

    checks = {
        "talos": ("configs/talos/scene_objects_protocol.yaml", [
            "method=[{name: talos, head_rounds: 1, calibration_rounds: 2, calibration_examples: 10}]",
            "model={backbone: mlp, hidden: [16]}", "federation.num_clients=4", "benchmark.classes=10",
            "benchmark.source_classes=4"], 2),
        "dea": ("configs/feddea/scenes_nyud_hosts_plugins.yaml", [
            "method=[{name: fedavg, plugin: {name: dea, rho: 0.3}}]", "plugins=null", "benchmark.size=16",
            "benchmark.train_per_task=16", "benchmark.test_size=8",
            "model={backbone: cnn, channels: [4, 8], norm: batch, decoder: {width: 4, norm: batch}}"], 1),
    }
    results = scale_members(rounds=1, sequential_rounds=1, checks=checks)
    assert list(results) == ["talos", "dea"]
    talos = results["talos"]["members"][0]
    # 4 local steps of batch 32 for each of the round's clients (participation 0.1 of 4: one)
    assert talos["passes_per_round"] == 4 * 32 * results["talos"]["clients_per_round"]
    for check in results.values():
        (row,) = check["members"]
        assert row["batched_s_per_round"] > 0 and row["sequential_s_per_round"] > 0 and check["bare_s_per_round"] > 0
    assert len(tables({"scale_members": results})) == 2

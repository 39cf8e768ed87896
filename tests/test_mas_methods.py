"""MAS and its baselines: the lookahead measurement, the split, the staged runs and their resume."""

import copy
import json

import pytest
import torch

from manytask.benchmarks import build_benchmark
from manytask.client.lookahead import lookahead_losses, shared_parameters
from manytask.client.trainer import TrainConfig, Trainer, TrainHook
from manytask.config import validate
from manytask.engine.checkpoint import load_checkpoint
from manytask.experiment import Experiment
from manytask.launch import resume, run_config
from manytask.methods.hosts.gradnorm import gradnorm_step
from manytask.methods.mas import best_partition
from manytask.methods.mas.lookahead import affinity_probe, affinity_scalars, affinity_scores
from manytask.methods.mas.stages import MODEL_PART
from manytask.models.multitask import build_model, task_of_key

BENCHMARK = {"name": "scenes", "tasks": "sdn", "size": 16, "train_per_task": 96, "test_size": 16, "buildings": 4,
             "styles": 2}
MAS = {"name": "mas", "groups": 2, "r0": 2, "affinity_every": 2}


def json_rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def mas_config(method=MAS, rounds=4, **overrides) -> dict:
    return {
        "name": "mas-test", "method": method, "rounds": rounds, "seed": 0, "eval_every": 1, "reference": None,
        "benchmark": BENCHMARK,
        "federation": {"num_clients": 4, "tasks": {"kind": "all"}, "samples": {"kind": "natural"}},
        "clients_per_round": 2,
        "model": {"backbone": "cnn", "channels": [4, 8], "norm": "batch", "decoder": {"width": 4}},
        "train": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0001, "batch_size": 8,
                  "local_steps": 4, "lr_schedule": "poly"},
        **overrides,
    }


def _shared_data(n=24):
    bench = build_benchmark("scenes", {k: v for k, v in BENCHMARK.items() if k != "name"}, 0)
    data = {name: (task.x_train[:n], task.y_train[:n]) for name, task in bench.tasks.items()}
    x = data["semseg"][0]
    return bench, {name: (x, y) for name, (_, y) in data.items()}  # one tensor of images for every task


def _model(bench):
    return build_model("cnn", {"channels": [4, 8], "norm": "batch"}, bench.input_shape, bench.specs, 0,
                       {"width": 4})


def test_lookahead_leaves_training_bit_identical_and_matches_a_hand_made_sgd_step():
    bench, data = _shared_data()
    config = TrainConfig(lr=0.05, momentum=0.9, weight_decay=0.01, local_steps=3, batch_size=8)
    start = _model(bench)
    plain, measured = copy.deepcopy(start), copy.deepcopy(start)
    Trainer(config, bench.specs).train(plain, data, seed=3, round_index=0, total_rounds=1)
    first = {}

    class FirstStep(TrainHook):
        def before_backward(self, step):
            if step.step == 0:
                first["batch"] = step.batches["semseg"][0]
                base, after = lookahead_losses(step, bench.specs, config.weight_decay)
                first["S"] = affinity_scores(base, after, step.lr, per_lr=False)

    hook = affinity_probe(bench.specs, every=1, weight_decay=config.weight_decay, per_lr=False)
    Trainer(config, bench.specs).train(measured, data, seed=3, round_index=0, total_rounds=1,
                                       hooks=[FirstStep(), hook])
    for (name, a), (_, b) in zip(plain.state_dict().items(), measured.state_dict().items(), strict=True):
        assert torch.equal(a, b), name  # encoder, decoders and BN statistics: bit for bit
    assert hook.count == 3 and len(affinity_scalars(hook.tasks, hook.mean())) == 6

    x = first["batch"]
    labels = {t: y for t, (xs, y) in data.items()}
    index = {tuple(row.flatten()[:8].tolist()): i for i, row in enumerate(data["semseg"][0])}
    rows = [index[tuple(row.flatten()[:8].tolist())] for row in x]
    tasks = list(bench.specs)

    def loss(model, task):
        model.train()
        return bench.specs[task].loss(model(x, task), labels[task][rows])

    expected = torch.zeros(3, 3)
    for i, a in enumerate(tasks):
        moved = copy.deepcopy(start)
        loss(moved, a).backward()
        with torch.no_grad():
            for p in shared_parameters(moved).values():
                p -= config.lr * (p.grad + config.weight_decay * p)
        for j, b in enumerate(tasks):
            if i != j:
                with torch.no_grad():
                    expected[i, j] = 1 - loss(copy.deepcopy(moved), b) / loss(copy.deepcopy(start), b)
    assert torch.allclose(first["S"], expected, atol=1e-5), (first["S"], expected)


def test_mas_splits_by_the_best_partition_of_the_affinity_round_and_runs_r0_plus_groups_times_the_rest(tmp_path):
    summary = run_config(validate(mas_config(rounds=4)), tmp_path / "run")["mas"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert summary["engine_rounds"] == len(rows) == 2 + 2 * (4 - 2)
    assert [r["fit"]["stage"] for r in rows] == [0, 0, 1, 1, 2, 2]
    tasks = ["semseg", "depth", "normals"]
    scores = torch.tensor([[0.0 if a == b else rows[1]["fit"][f"affinity/{a}/{b}"] for b in tasks] for a in tasks],
                          dtype=torch.float64)
    assert "affinity/semseg/depth" not in rows[0]["fit"]  # measured in the affinity round only (round 2)
    groups = best_partition(scores, 2)
    assert [[tasks[i] for i in g] for g in groups] == [
        [t for t in tasks if rows[2]["fit"][f"split/{t}"] == g] for g in range(2)
    ]


def test_mas_groups_start_from_the_all_in_one_weights_exactly(tmp_path):
    config = validate(mas_config(rounds=4))
    assert run_config(config, tmp_path / "cut", stop_after=2) is None  # the all-in-one phase is done
    all_in_one = load_checkpoint(tmp_path / "cut" / "checkpoint.safetensors").server
    exp = Experiment.build(config)
    server = exp.server_program()
    server.load_state_dict(all_in_one)
    clients = server.participants(2, [0, 1])
    payloads = server.configure_fit(2, clients)
    group = set(server.stage(1).tasks)
    expected = {k: v for k, v in all_in_one.items() if not k.startswith("part/") and task_of_key(k) in {None, *group}}
    assert set(server.global_state) == set(expected)
    assert all(torch.equal(server.global_state[k], v) for k, v in expected.items())
    sent = payloads[clients[0]].tensors()
    assert set(sent) == set(expected) and all(torch.equal(sent[k], expected[k]) for k in sent)
    for task in exp.setup.specs:  # every task keeps the all-in-one model until its group has trained
        kept = server.parts[MODEL_PART + task]
        assert all(torch.equal(kept[k], all_in_one[k]) for k in kept)


def _rows(run_dir):
    timing = ("wall_seconds", "client_seconds", "energy_joules", "energy_source")
    return [{k: v for k, v in json.loads(line).items() if k not in timing}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted_mas(tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    return out, run_config(validate(mas_config(rounds=4)), out)["mas"]


@pytest.mark.parametrize("stop", [1, 2, 3, 5])  # all-in-one; at the split; in group 1; in group 2
def test_mas_stopped_in_any_phase_resumes_to_the_uninterrupted_numbers(tmp_path, uninterrupted_mas, stop):
    full_dir, full = uninterrupted_mas
    assert run_config(validate(mas_config(rounds=4)), tmp_path / "cut", stop_after=stop) is None
    resumed = resume(tmp_path / "cut")["mas"]
    assert resumed["tasks"] == full["tasks"]
    assert _rows(tmp_path / "cut") == _rows(full_dir)


@pytest.mark.parametrize(("method", "stages"), [
    ("one-by-one", [0, 0, 1, 1, 2, 2]),
    ({"name": "tag", "groups": 2, "affinity_rounds": 1, "affinity_every": 2}, [0, 1, 1, 2, 2]),
    ({"name": "hoa", "groups": 2, "probe_rounds": 1}, [0, 1, 2, 3, 4, 5, 6, 6, 7, 7]),
])
def test_baselines_run_their_stages_and_end_with_a_model_per_task(tmp_path, method, stages):
    summary = next(iter(run_config(validate(mas_config(method, rounds=2)), tmp_path / "run").values()))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["fit"]["stage"] for r in rows] == stages == list(map(float, stages))
    assert summary["engine_rounds"] == len(stages)
    assert set(summary["tasks"]) == {"semseg", "depth", "normals"}
    splits = [r["fit"] for r in rows if any(k.startswith("split/") for k in r["fit"])]
    assert len(splits) == (0 if method == "one-by-one" else 1)  # the groups, logged once, serve every task
    assert all({f"split/{t}" for t in summary["tasks"]} <= set(fit) for fit in splits)
    if isinstance(method, dict) and method["name"] == "hoa":
        probes = {k: v for r in rows for k, v in r["fit"].items() if k.startswith("probe/")}
        assert len(probes) == 3  # the last value logged per task (alone, then in each pair)


def test_mas_refuses_settings_it_cannot_run():
    from manytask.errors import ManytaskError

    with pytest.raises(ManytaskError, match="r0=4 must be below rounds=4"):
        Experiment.build(validate(mas_config({**MAS, "r0": 4}, rounds=4)))
    with pytest.raises(ManytaskError, match="affinity_round=3 comes after the split"):
        Experiment.build(validate(mas_config({**MAS, "affinity_round": 3}, rounds=4)))
    with pytest.raises(ManytaskError, match="groups=4 exceeds the 3 tasks"):
        Experiment.build(validate(mas_config({**MAS, "groups": 4}, rounds=4)))
    with pytest.raises(ManytaskError, match=r"shared_head.*a decoder of its own"):
        Experiment.build(validate(mas_config({**MAS, "shared_head": True}, rounds=4)))


def test_gradnorm_step_matches_the_hand_computed_update():
    weights, norms, ratios = torch.tensor([1.0, 1.0]), torch.tensor([2.0, 1.0]), torch.tensor([1.0, 3.0])
    # G = [2, 1], mean 1.5; r = [0.5, 1.5]; alpha 1: targets [0.75, 2.25]; sign(G - target) = [+1, -1]
    # w = [1 - 0.1*2, 1 + 0.1*1] = [0.8, 1.1] -> renormalized to sum 2: [0.8, 1.1] * 2 / 1.9
    updated = gradnorm_step(weights, norms, ratios, alpha=1.0, lr=0.1)
    assert torch.allclose(updated, torch.tensor([0.8, 1.1]) * 2 / 1.9)
    assert updated.sum().item() == pytest.approx(2.0)


def test_a_tag_group_slot_the_selection_leaves_unused_is_idle(tmp_path, monkeypatch):
    from manytask.methods.mas import tag

    monkeypatch.setattr(tag, "best_cover", lambda scores, groups: ([[0, 1, 2]], [0, 0, 0]))  # one group serves all
    method = {"name": "tag", "groups": 2, "affinity_rounds": 1, "affinity_every": 2}
    run_config(validate(mas_config(method, rounds=2)), tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["fit"]["stage"] for r in rows] == [0, 1, 1, 2, 2]
    idle = rows[3:]
    assert all(r["fit"] == {"stage": 2.0} for r in idle)  # nothing aggregated, no training loss
    assert all(size < 200 for r in idle for size in r["bytes_down"].values())  # scalars only, no model
    assert rows[-1]["eval"] == rows[2]["eval"]  # the served models did not change


def test_the_report_plots_affinity_over_the_measured_rounds_and_marks_the_split_round(tmp_path):
    from manytask.report import write_report
    from manytask.report.affinity import affinity_series, split_round
    from manytask.report.runs import load_run

    method = {**MAS, "r0": 3, "affinity_round": 2, "affinity_rounds": "all"}
    run_config(validate(mas_config(method, rounds=4)), tmp_path / "run")
    record = load_run(tmp_path / "run")
    series = affinity_series(record)
    assert len(series) == 3 * 2 and all([r for r, _ in points] == [1, 2, 3] for points in series.values())
    assert split_round(record) == 2
    write_report(tmp_path / "run")
    assert (tmp_path / "run" / "plots" / "affinity_mas.png").stat().st_size > 10_000
    assert "Inter-task affinity over rounds" in (tmp_path / "run" / "report.md").read_text()


def test_staged_rounds_and_the_affinity_round_train_batched_with_the_sequential_numbers(tmp_path, capsys):
    """MAS-2 and one-by-one: the all-in-one, affinity and group stages' rounds train batched (clients holding
    several dense tasks of the same images; the lookahead measured for every client at once); the numbers, the
    affinities included, match."""
    method = [MAS, "one-by-one"]
    sequential = run_config(validate(mas_config(method, execution="sequential")), tmp_path / "seq")
    batched = run_config(validate(mas_config(method)), tmp_path / "auto")
    notices = capsys.readouterr().err
    assert "one after another" not in notices, notices
    for label, summary in sequential.items():
        for task, metrics in summary["tasks"].items():
            assert batched[label]["tasks"][task]["loss"] == pytest.approx(metrics["loss"], rel=1e-4), (label, task)
        for a, b in zip(*(json_rows(tmp_path / run / label) for run in ("seq", "auto")), strict=True):
            for key, value in a["fit"].items():
                # an affinity is a difference of two nearby losses: float rounding shows in it more (here 1e-6 of
                # losses about 1)
                affinity = key.startswith("affinity/")
                assert b["fit"][key] == pytest.approx(value, **({"abs": 1e-5} if affinity else {"rel": 1e-4})), key

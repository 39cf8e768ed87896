"""The first step off the default job (issue 55): another benchmark, another method, a lost round, a missing GPU,
data that changed under a run, a DataLoader's batches, and costs that do not depend on a member's place. Each test
failed on the tree before its fix."""

import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

import manytask
from manytask.benchmarks.registry import BENCHMARKS
from manytask.cli import app
from manytask.config import resolve, validate
from manytask.errors import ManytaskError
from manytask.experiment import Experiment
from manytask.launch import resume, run_config
from tests.conftest import small_config_dict

TINY_SCENES = "benchmark={name: scenes, size: 16, train_per_task: 48, test_size: 16}"


def run_cli(*arguments):
    return CliRunner().invoke(app, ["run", *arguments])


def one_sentence_error(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    return lines[0]


# --- defaults that follow the benchmark ----------------------------------------------------------------------


def test_naming_a_benchmark_takes_its_own_federation_and_model_not_the_default_jobs_pretraining():
    default = resolve(None, [])
    assert default.model.get("pretrained") is True and default.benchmark.get("holdout") == 0.3
    scenes = resolve(None, ["benchmark=scenes"])
    assert scenes.model["backbone"] == "cnn" and "decoder" in scenes.model and "pretrained" not in scenes.model
    assert scenes.federation.tasks == {"kind": "all"}
    assert [m["name"] for m in scenes.methods] == [m["name"] for m in default.methods]  # the job itself stays
    assert scenes.train == default.train and scenes.rounds == default.rounds
    digits = resolve(None, ["benchmark=digits-tasks"])
    assert "pretrained" not in digits.model and "holdout" not in digits.benchmark
    skew = resolve(None, ["benchmark={name: label-skew, num_clients: 12}"])
    assert skew.federation.num_clients == 12 and skew.federation.tasks == {"kind": "one-per-client"}
    # a key inside the default job's benchmark keeps the job's setting (its pretraining source included)
    nested = resolve(None, ["benchmark.tasks=[digit, parity]"])
    assert nested.model.get("pretrained") is True and nested.benchmark["holdout"] == 0.3
    assert resolve(None, ["benchmark=my-own", "model.hidden=[8]"]).model == {"backbone": "mlp", "hidden": [8]}


@pytest.mark.parametrize("benchmark", ["synthetic", "mnist1d", "digits-tasks"])
def test_the_default_job_runs_on_another_offline_benchmark(benchmark, tmp_path):
    result = run_cli(f"benchmark={benchmark}", "rounds=1", "--quiet", "--out", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(summary["runs"]) == {"matu", "fedavg-per-task", "matfl", "individual"}
    assert all(run["pretraining"] is None for run in summary["runs"].values())


# --- a method's needs from the federation ----------------------------------------------------------------------


@pytest.mark.parametrize("method", ["mas", "tag"])
def test_a_lookahead_method_gets_every_task_of_a_client_on_the_same_samples(method):
    config = resolve(None, [TINY_SCENES, f"method={method}", "rounds=4"])
    experiment = Experiment.build(config)
    for holding in experiment.federation.clients:
        first = next(iter(holding.values()))
        assert len(holding) == 4 and all(np.array_equal(indices, first) for indices in holding.values())
    plain = Experiment.build(resolve(None, [TINY_SCENES, "method=fedavg", "rounds=4"]))
    assert any(not np.array_equal(h["depth"], h["semseg"]) for h in plain.federation.clients)  # others keep theirs


@pytest.mark.slow
def test_mas_runs_on_scenes_with_no_other_key(tmp_path):
    out = tmp_path / "mas"
    result = run_cli(TINY_SCENES, "method=mas", "rounds=3", "--quiet", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert json.loads((out / "summary.json").read_text())["method"] == "mas"


def test_what_a_method_needs_is_refused_in_one_sentence_before_anything_is_written(tmp_path):
    out = tmp_path / "out"
    line = one_sentence_error(run_cli(TINY_SCENES, "method=mas", "federation.same_samples=false", "--out", str(out)))
    assert "lookahead" in line and "federation.same_samples" in line
    line = one_sentence_error(run_cli("benchmark=digits-tasks", "method=tag", "--out", str(out)))
    assert "does not label the inputs" in line and "federation.same_samples" in line
    line = one_sentence_error(run_cli(TINY_SCENES, "method=tag", "federation.tasks={kind: dirichlet, zeta: 0.5}",
                                      "--out", str(out)))
    assert "federation.tasks: {kind: all}" in line
    assert not out.exists()


# --- errors at run time ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("execution", ["auto", "sequential"])
def test_a_round_in_which_every_sampled_client_dropped_ends_in_one_sentence(tmp_path, execution):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(small_config_dict(rounds=2)))
    line = one_sentence_error(run_cli(str(config), "dropout=0.999999", "min_replies=5", f"execution={execution}",
                                      "--quiet", "--out", str(tmp_path / "out")))
    assert "round 1 failed: 0 of 4 sampled clients replied, fewer than min_replies=4" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_missing_gpu_is_one_sentence_and_nothing_is_written(tmp_path):
    out = tmp_path / "out"
    line = one_sentence_error(run_cli("device=cuda", "--quiet", "--out", str(out)))
    assert "device: cuda" in line and "sees no CUDA GPU" in line
    assert not out.exists()
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(small_config_dict(rounds=1)))
    assert run_cli(str(config), "device=cpu", "--quiet", "--out", str(out)).exit_code == 0  # the same --out works


# --- data identity -------------------------------------------------------------------------------------------

FILE_BENCHMARK = '''
    import numpy as np
    import torch
    from pydantic import Field

    from manytask.benchmarks import Benchmark, register_benchmark
    from manytask.registry import Params


    class FileParams(Params):
        path: str = Field(description="a .npy file of inputs")


    @register_benchmark("from-file", FileParams, "inputs read from a file (a test's)")
    def from_file(params, seed):
        x = torch.from_numpy(np.load(params.path))
        y = (x[:, 0] > 0).long()
        return Benchmark.from_tensors("from-file", {"sign": (x[:60], y[:60], x[60:], y[60:])})


    @register_benchmark("unseeded", Params, "inputs drawn without the seed (a test's)")
    def unseeded(params, seed):
        x = torch.randn(80, 4)
        y = (x[:, 0] > 0).long()
        return Benchmark.from_tensors("unseeded", {"sign": (x[:60], y[:60], x[60:], y[60:])})
'''


@pytest.fixture(scope="module")
def benchmark_module(tmp_path_factory):
    """The test benchmarks' module, written once: its names register once per process."""
    module = tmp_path_factory.mktemp("user_code") / "file_benchmark.py"
    module.write_text(textwrap.dedent(FILE_BENCHMARK))
    return module


def file_config(tmp_path, module, **overrides):
    data = tmp_path / "x.npy"
    if not data.exists():
        np.save(data, np.random.default_rng(0).normal(size=(80, 4)).astype(np.float32))
    return validate(small_config_dict(**{
        "imports": [str(module)], "benchmark": {"name": "from-file", "path": str(data)},
        "federation": {"num_clients": 3, "tasks": {"kind": "all"}, "samples": {"kind": "iid"}}, "rounds": 3,
        **overrides}))


def test_a_resume_on_changed_data_is_refused_in_one_sentence(tmp_path, benchmark_module):
    out = tmp_path / "run"
    assert run_config(file_config(tmp_path, benchmark_module), out, stop_after=1) is None
    recorded = json.loads((out / "federation.json").read_text())["data_fingerprint"]
    np.save(tmp_path / "x.npy", np.random.default_rng(1).normal(size=(80, 4)).astype(np.float32))
    with pytest.raises(ManytaskError, match=r"was written on other data than this run now has .*restore the data"):
        resume(out)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(80, 4)).astype(np.float32))
    (summary,) = resume(out).values()  # the data as they were: the run goes on
    assert summary["data_fingerprint"] == recorded


@pytest.mark.slow
def test_workers_refuse_a_benchmark_that_draws_other_data_in_every_process(tmp_path, benchmark_module):
    config = file_config(tmp_path, benchmark_module, benchmark={"name": "unseeded"}, workers=2, rounds=1)
    with pytest.raises(ManytaskError, match="a worker process built other data than the main process"):
        run_config(config, tmp_path / "run")


def test_an_exported_partition_whose_file_changed_is_refused(tmp_path, benchmark_module):
    from safetensors.torch import load_file, save_file

    from manytask.benchmarks import build_benchmark
    from manytask.benchmarks.exported import export_partitions

    config = file_config(tmp_path, benchmark_module)
    deployed = yaml.safe_load(export_partitions(Experiment.build(config), tmp_path / "export").read_text())
    params = {**{k: v for k, v in deployed["benchmark"].items() if k != "name"}, "node": str(tmp_path / "export" /
                                                                                           "client-1")}
    node = build_benchmark("exported", params, seed=0)
    server = config.model_copy(update={"benchmark": deployed["benchmark"], "engine": "flower"})
    assert Experiment.build(config).client_fingerprint(1) == Experiment.build(server).client_fingerprint(1)
    assert node.tasks["sign"].num_train == len(Experiment.build(config).federation.clients[1]["sign"])
    rows = tmp_path / "export" / "client-1" / "data.safetensors"
    tensors = load_file(str(rows))
    tensors["train/sign/x"][0, 0] += 1.0
    save_file(tensors, str(rows))
    with pytest.raises(ManytaskError, match="holds other training data than client 1 was exported with"):
        build_benchmark("exported", params, seed=0)


def test_the_readmes_benchmark_gives_the_same_numbers_twice(tmp_path):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (snippet,) = [s for s in re.findall(r"```python\n(.*?)```", readme, re.S) if "register_benchmark" in s]
    if "my-bench" not in BENCHMARKS.names():  # tests/test_docs.py registers it too when it ran in this process
        exec(compile(snippet, "README.md", "exec"), {})
    config = {**small_config_dict(), "benchmark": "my-bench",
              "federation": {"num_clients": 4, "tasks": {"kind": "all"}, "samples": {"kind": "iid"}}, "rounds": 2}
    (first,) = manytask.run(config, tmp_path / "a").summaries.values()
    (again,) = manytask.run(config, tmp_path / "b").summaries.values()
    assert first["tasks"] == again["tasks"] and first["data_fingerprint"] == again["data_fingerprint"]


# --- a torch user's first calls ----------------------------------------------------------------------------------


def test_calibrate_mask_reads_a_dataloaders_inputs_and_labels():
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from manytask.methods.talos import calibrate_mask

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(20, 6), torch.randint(0, 3, (20,))
    loader = DataLoader(TensorDataset(x, y), batch_size=5)
    from_loader = calibrate_mask(model, loader, sparsity=0.75, rounds=2, seed=1)
    from_inputs = calibrate_mask(model, [x[i:i + 5] for i in range(0, 20, 5)], sparsity=0.75, rounds=2, seed=1)
    assert all(torch.equal(from_loader[n], from_inputs[n]) for n in from_inputs)
    with pytest.raises(ManytaskError, match="input tensors or \\(inputs, labels\\) pairs"):
        calibrate_mask(model, [{"x": x}], sparsity=0.75, rounds=1)


# --- honest costs and what the run says it does -----------------------------------------------------------------


def test_the_header_and_the_report_name_the_clients_optimizer(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(small_config_dict(rounds=1, train={"lr": 0.05, "momentum": 0.9})))
    result = run_cli(str(config), "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert "clients' optimizer: sgd lr 0.05, momentum 0.9, 1 local epoch of batch 32" in " ".join(
        result.stderr.split())
    report = (tmp_path / "out" / "report.md").read_text()
    assert "momentum 0.9" in report
    # FedAvg's clients are scored by the server's per-task models: the report says why equal clients score alike
    assert "across clients (the server's per-task models on each client's tasks" in report


def test_the_warm_up_changes_no_number_and_is_reported_apart(tmp_path):
    """The comparison's process is warmed up on its first member before any member's clock starts; the members'
    numbers are those of each run alone."""
    compared = run_config(validate(small_config_dict(method=["fedprox", "fedavg"], rounds=2)), tmp_path / "both")
    alone = run_config(validate(small_config_dict(method="fedprox", rounds=2)), tmp_path / "alone")
    assert compared["fedprox"]["tasks"] == alone["fedprox"]["tasks"]
    root = json.loads((tmp_path / "both" / "summary.json").read_text())
    assert root["warmup_seconds"] > 0
    rows = [json.loads(line) for line in (tmp_path / "both" / "fedprox" / "metrics.jsonl").read_text().splitlines()]
    alone_rows = [json.loads(line) for line in (tmp_path / "alone" / "metrics.jsonl").read_text().splitlines()]
    assert [r["fit"] for r in rows] == [r["fit"] for r in alone_rows]


def test_a_resume_may_move_the_run_to_another_device_but_not_change_it(tmp_path):
    out = tmp_path / "out"
    assert run_config(validate(small_config_dict(rounds=2)), out, stop_after=1) is None
    line = one_sentence_error(CliRunner().invoke(app, ["run", "--resume", str(out), "rounds=5"]))
    assert "--resume takes only keys that say where clients train" in line and "rounds=5" in line
    result = CliRunner().invoke(app, ["run", "--resume", str(out), "device=cpu", "threads=2", "--quiet"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load((out / "config.yaml").read_text())["threads"] == 2  # the next resume runs there too
    whole = run_config(validate(small_config_dict(rounds=2)), tmp_path / "whole")
    assert json.loads((out / "summary.json").read_text())["tasks"] == next(iter(whole.values()))["tasks"]

"""`device: auto | cpu | cuda`: where clients train. The CUDA runs take the GPU where torch sees one and a GPU
simulated on the CPU elsewhere (`simulated_cuda.py`: the CPU's values, with every op that mixes host and device
tensors refused, as a GPU refuses it), so every machine checks device placement."""

import json

import pytest
import torch

from manytask.config import validate
from manytask.devices import CPU, resolve_device
from manytask.engine.client_runner import ClientRunner
from manytask.errors import ManytaskError
from manytask.experiment import Experiment
from manytask.launch import run_config
from manytask.methods.registry import METHODS, PLUGINS
from tests.simulated_cuda import a_gpu

HAS_CUDA = torch.cuda.is_available()
CONFIG = {
    "name": "devices", "rounds": 3, "seed": 0, "reference": None, "participation": 0.5, "eval_every": 1,
    "method": ["fedavg", {"name": "fedprox", "mu": 0.1},
               {"name": "fedavg", "label": "fedavg+dea", "plugin": {"name": "dea", "rho": 0.5}}, "fedper", "matu"],
    "benchmark": {"name": "digits-tasks", "tasks": ["digit", "parity"]},
    "federation": {"num_clients": 8, "tasks": {"kind": "dirichlet", "zeta": 0.5}, "samples": {"kind": "iid"}},
    "model": {"backbone": "mlp", "hidden": [32]},
    "train": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "local_epochs": 1, "batch_size": 16},
}


def test_cpu_is_cpu_and_auto_takes_the_gpu_only_where_there_is_one():
    assert resolve_device("cpu") == CPU
    assert resolve_device("auto") == (torch.device("cuda") if HAS_CUDA else CPU)


@pytest.mark.skipif(HAS_CUDA, reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_refused_in_one_sentence():
    with pytest.raises(ManytaskError, match="sees no CUDA GPU"):
        resolve_device("cuda")


def test_a_numbered_gpu_is_checked_against_the_gpus_torch_sees(monkeypatch):
    """`cuda:N` names GPU N; past the GPUs torch sees, or without any, it is refused in one sentence; anything else
    is refused by the config."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("auto") == torch.device("cuda")
    with pytest.raises(ManytaskError, match=r"device: cuda:2, but torch sees 2 GPUs \(cuda:0 to cuda:1\)"):
        resolve_device("cuda:2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ManytaskError, match=r"device: cuda:0, but torch .* sees no CUDA GPU"):
        resolve_device("cuda:0")
    for bad in ("gpu", "cuda:", "cuda:-1", "cuda1", "CPU"):
        with pytest.raises(ManytaskError, match="device"):
            validate({**CONFIG, "device": bad})


def test_a_client_program_without_device_support_stays_on_the_cpu_with_a_notice(capsys):
    runner = ClientRunner(Experiment.build(validate({**CONFIG, "method": "matu", "device": "cpu"})))
    runner.program.supports_device = False  # every shipped program has it now: a user's own may not
    assert runner._device(torch.device("cuda")) == CPU  # never touches CUDA: the program declines first
    assert "trains its clients on the CPU" in capsys.readouterr().err
    host = ClientRunner(Experiment.build(validate({**CONFIG, "method": "fedavg", "device": "cpu"})))
    assert host.program.supports_device and host.device == CPU


@pytest.mark.parametrize("execution", ["sequential", "vectorized"])
def test_training_on_cuda_gives_the_cpu_numbers_within_float_tolerance(tmp_path, execution):
    cpu = run_config(validate({**CONFIG, "device": "cpu"}), tmp_path / "cpu")
    with a_gpu():
        gpu = run_config(validate({**CONFIG, "device": "cuda", "execution": execution}), tmp_path / "gpu")
    for label, summary in cpu.items():
        rows = [json.loads(line) for line in (tmp_path / "gpu" / label / "metrics.jsonl").read_text().splitlines()]
        assert len(rows) == 3 and rows[-1]["bytes_up"]
        for task, metrics in summary["tasks"].items():
            assert gpu[label]["tasks"][task]["loss"] == pytest.approx(metrics["loss"], rel=1e-3), (label, task)


PERSONAL = {
    "name": "devices-personal", "rounds": 2, "seed": 0, "reference": None, "participation": 0.5, "eval_every": 1,
    "method": [{"name": "sfmtl-graph", "graph": "random"}, "fedu", "pfedme", "local"],
    "benchmark": {"name": "rotated-masked-digits", "num_clients": 8, "clusters": 2, "grid": 4, "patch_prob": 0.25},
    "federation": {"num_clients": 8, "tasks": {"kind": "one-per-client"}, "samples": {"kind": "iid"}},
    "model": {"backbone": "cnn", "channels": [8, 16], "hidden": 32},
    "train": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "local_epochs": 1, "batch_size": 8},
}


def test_personal_methods_on_cuda_give_the_cpu_numbers_within_float_tolerance(tmp_path):
    """SFMTL-Graph with its random-graph control: Louvain on the learned graph could split differently on float
    noise, the random graph is the same on both devices."""
    cpu = run_config(validate({**PERSONAL, "device": "cpu"}), tmp_path / "cpu")
    with a_gpu():
        gpu = run_config(validate({**PERSONAL, "device": "cuda"}), tmp_path / "gpu")
    for label, summary in cpu.items():
        for task, metrics in summary["tasks"].items():
            assert gpu[label]["tasks"][task]["loss"] == pytest.approx(metrics["loss"], rel=1e-3), (label, task)


TALOS = {**PERSONAL, "name": "devices-talos", "rounds": 5,
         "method": [{"name": n, "head_rounds": 2, "calibration_rounds": 3, "calibration_examples": 20}
                    for n in ("talos", "talos-partition")],
         "benchmark": {"name": "digits-tasks", "tasks": ["digit", "parity"]},
         "federation": {"num_clients": 8, "tasks": {"kind": "dirichlet", "zeta": 0.5}, "samples": {"kind": "iid"}},
         "model": {"backbone": "cnn", "channels": [8, 16], "hidden": 32, "norm": "batch"}}


def test_talos_on_cuda_gives_the_cpu_numbers_within_float_tolerance(tmp_path):
    """Head-only, calibration (batched Fisher scores, labels drawn from CPU generators) and sparse rounds on the
    GPU give the CPU's numbers."""
    cpu = run_config(validate({**TALOS, "device": "cpu"}), tmp_path / "cpu")
    with a_gpu():
        gpu = run_config(validate({**TALOS, "device": "cuda"}), tmp_path / "gpu")
    for label, summary in cpu.items():
        for task, metrics in summary["tasks"].items():
            assert gpu[label]["tasks"][task]["loss"] == pytest.approx(metrics["loss"], rel=1e-3), (label, task)



MAS = {"name": "devices-mas", "rounds": 4, "seed": 0, "reference": None, "eval_every": 2,
       "method": [{"name": "mas", "groups": 2, "r0": 2, "affinity_round": 1}, "one-by-one"],
       "benchmark": {"name": "scenes", "tasks": "sdn", "size": 16, "train_per_task": 48, "test_size": 8,
                     "buildings": 4, "styles": 2},
       "federation": {"num_clients": 4, "tasks": {"kind": "all"}, "samples": {"kind": "natural"}},
       "model": {"backbone": "cnn", "channels": [4, 8], "norm": "batch", "decoder": {"width": 4}},
       "train": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "batch_size": 8, "local_steps": 2}}


def test_mas_on_cuda_gives_the_cpu_numbers_within_float_tolerance(tmp_path):
    """MAS-2 through its all-in-one, affinity (lookahead inside the local steps) and group rounds, and one-by-one,
    on the GPU: the CPU's losses."""
    cpu = run_config(validate({**MAS, "device": "cpu"}), tmp_path / "cpu")
    with a_gpu():
        gpu = run_config(validate({**MAS, "device": "cuda"}), tmp_path / "gpu")
    for label, summary in cpu.items():
        for task, metrics in summary["tasks"].items():
            assert gpu[label]["tasks"][task]["loss"] == pytest.approx(metrics["loss"], rel=1e-3), (label, task)


@pytest.mark.skipif(HAS_CUDA, reason="this machine has a GPU")
def test_flower_client_gpus_without_a_gpu_is_refused_before_ray_starts(tmp_path):
    pytest.importorskip("flwr")
    data = {**CONFIG, "engine": "flower-sim", "flower": {"client_gpus": 0.25}}
    with pytest.raises(ManytaskError, match=r"flower.client_gpus: 0.25, but torch sees no CUDA GPU"):
        run_config(validate(data), tmp_path / "run")
    assert validate({**CONFIG, "flower": {"client_gpus": 0.5}}).flower.client_gpus == 0.5


HOSTS = ["fedavg", "fedprox", "fednova", "feddyn", "fedbn", "moon", "fedacg", "fedadam", "fedyogi", "fedper"]
# no client state to checkpoint
STATELESS = {"fedavg", "fedprox", "fednova", "fedacg", "fedadam", "fedyogi", "matu", "matfl", "fedavg+dea"}
# DEA reads back once per reply on each side (the client's nonzero counts and norms, the server's consistency check)
ENTRIES = {"fedavg+dea": {"name": "fedavg", "label": "fedavg+dea", "plugin": {"name": "dea", "rho": 0.3}}}


def _host_run(method: str | dict, clients: int, rounds: int, path, device: str) -> tuple[dict, tuple[int, int, int]]:
    """(the run's summary, its copies to the device and to the host and its host reads: zero on a real GPU); the
    clients take one local step per 4 clients, so a copy made per step shows as one made per client."""
    train = {**CONFIG["train"], "local_steps": clients // 4}  # overrides local_epochs
    config = validate({**CONFIG, "method": method, "device": device, "rounds": rounds, "eval_every": 100,
                       "checkpoint_every": 100, "participation": 1.0, "train": train,
                       "model": {"backbone": "cnn", "channels": [4, 8], "hidden": 16, "norm": "batch"},
                       "federation": {**CONFIG["federation"], "num_clients": clients}})
    if device == "cpu":
        return run_config(config, path), (0, 0, 0)
    with a_gpu() as sim:
        summary = run_config(config, path)
    return summary, (sim.to_device, sim.to_host, sim.host_reads) if sim else (0, 0, 0)


@pytest.mark.parametrize("method", [*HOSTS, "matu", "matfl", "fedavg+dea"])
def test_every_host_aggregates_on_the_device_with_the_cpus_numbers(method, tmp_path):
    """The server's state moves to the device once and the replies never leave it: what one more round adds to a
    run's copies each way and to its host reads is the same at 4 clients taking 1 local step and at 12 taking 3 (but
    the checkpointed client states of FedDyn, FedBN, MOON and FedPer), and the numbers are the CPU's. MaTU and
    MaT-FL, whose servers keep per-task vectors and per-client models, and FedAvg + DEA, whose sparse uploads are
    made and restored there (two reads a client), too."""
    per_round = {}
    entry = ENTRIES.get(method, method)
    for clients in (4, 12):
        cpu, _ = _host_run(entry, clients, 3, tmp_path / f"{clients}-cpu", "cpu")
        gpu, three = _host_run(entry, clients, 3, tmp_path / f"{clients}-gpu", "cuda")
        _, two = _host_run(entry, clients, 2, tmp_path / f"{clients}-gpu2", "cuda")
        per_round[clients] = [a - b for a, b in zip(three, two, strict=True)]
        for task, metrics in cpu[method]["tasks"].items():
            assert gpu[method]["tasks"][task]["loss"] == pytest.approx(metrics["loss"], rel=1e-5), (method, task)
    to_device, to_host, reads = zip(per_round[4], per_round[12], strict=True)
    per_client_reads = 2 if method in ENTRIES else 0
    assert to_device[0] == to_device[1] and reads[1] - reads[0] == per_client_reads * 8, per_round
    if method in STATELESS:
        assert to_host[0] == to_host[1], per_round


CALIBRATED = {"head_rounds": 2, "calibration_rounds": 3, "calibration_examples": 20}
EVERY_METHOD = {  # each registered method (and plug-in) in a federation it runs on
    "digits": (CONFIG, ["fedavg", "fedprox", "fednova", "feddyn", "moon", "fedga", "fedacg", "fedadam", "fedyogi",
                        "fedadagrad", "gradnorm", "ntk-fedavg", "fedper", "matu", "matfl", "centralized", "individual",
                        {"name": "matu", "label": "matu-separate", "unify": False},
                        *({"name": "fedavg", "label": f"fedavg+{p}", "plugin": {"name": p}}
                          for p in ("dea", "median", "trimmed-mean", "krum", "clip", "fedheal", "pcgrad")),
                        {"name": "fedavg", "label": "fedavg+dp", "plugin": {"name": "dp", "where": "client"}},
                        {"name": "fedavg", "label": "fedavg+central-dp", "plugin": {"name": "dp", "adaptive": True,
                                                                                     "noise_multiplier": 0.01}}]),
    "batch-norm": ({**TALOS, "rounds": 4},
                   ["fedbn", "head-only", "centralized-head-only", *({"name": n, **CALIBRATED} for n in (
                       "talos", "talos-partition", "centralized-talos")),
                    {"name": "talos-oneshot", **CALIBRATED, "shot_steps": 3}]),
    "personal": (PERSONAL, ["sfmtl-graph", "fedu", {"name": "pfedme", "lam": 1}, "local"]),
    "dense": (MAS, [{"name": "mas", "groups": 2, "r0": 2, "affinity_round": 1}, "one-by-one", "tag", "hoa",
                    {"name": "fixed-split", "partition": [["semseg", "depth"], ["normals"]]}, "gradnorm"]),
}


def _shipped(registry, program) -> set[str]:
    """The names the package registers (not the ones other tests add to the same process)."""
    return {n for n in registry.names() if program(registry.get(n).target).__module__.startswith("manytask.")}


def test_every_method_is_in_the_gpu_comparison():
    entries = [m for _, methods in EVERY_METHOD.values() for m in methods]
    assert {m if isinstance(m, str) else m["name"] for m in entries} == _shipped(METHODS, lambda d: d.server)
    assert ({m["plugin"]["name"] for m in entries if isinstance(m, dict) and "plugin" in m}
            == _shipped(PLUGINS, lambda d: d.server))


@pytest.mark.slow
@pytest.mark.parametrize("federation", EVERY_METHOD)
def test_every_method_on_the_gpu_gives_the_cpus_numbers(federation, tmp_path):
    """Every registered method and plug-in, its clients and its server, on the GPU (the simulated one here): no op
    mixes host and device tensors, and the losses are the CPU's."""
    base, methods = EVERY_METHOD[federation]
    config = {**base, "method": methods}
    cpu = run_config(validate({**config, "device": "cpu"}), tmp_path / "cpu")
    with a_gpu():
        gpu = run_config(validate({**config, "device": "cuda"}), tmp_path / "gpu")
    assert set(gpu) == set(cpu)
    for label, summary in cpu.items():
        for task, metrics in summary["tasks"].items():
            assert gpu[label]["tasks"][task]["loss"] == pytest.approx(metrics["loss"], rel=1e-4), (label, task)

"""The same methods on Flower's simulation engine give the local engine's numbers."""

import json
from pathlib import Path

import pytest
import yaml

from manytask.config import validate
from manytask.launch import run_config
from tests.conftest import small_config_dict
from tests.flower_support import needs_netns, run_in_netns

pytest.importorskip("flwr")
pytestmark = [pytest.mark.slow, needs_netns]


def run_local_and_sim(tmp_path: Path, config: dict) -> tuple[Path, Path]:
    """Run one config on the local engine (in this process) and on Flower's simulation (through the CLI, in a
    network namespace of its own); return the two run directories. Both run their clients one after another: the
    local engine's batched execution equals them within float tolerance only."""
    config = {**config, "execution": "sequential"}
    run_config(validate(config), tmp_path / "local")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    done = run_in_netns("run", str(path), "engine=flower-sim", "--out", str(tmp_path / "flower-sim"), "--quiet")
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp_path / "local", tmp_path / "flower-sim"


def summaries(*run_dirs: Path) -> list[dict]:
    return [json.loads((run_dir / "summary.json").read_text()) for run_dir in run_dirs]


def test_fedavg_and_fedprox_match_the_local_engine_in_flower_sim_under_attack(tmp_path):
    """Client 1 scales its update ×1e3 (`adversaries:` acts in the client runner, so on Flower's clients too): both
    engines refuse it alike and give the same numbers."""
    local, sim = run_local_and_sim(tmp_path, small_config_dict(
        method=["fedavg", {"name": "fedprox", "mu": 0.1}], rounds=2, adversaries={"clients": [1], "attack": "scale"}))
    for label in ("fedavg", "fedprox"):
        a, b = summaries(local / label, sim / label)
        assert a["tasks"] == b["tasks"], label
        assert (a["bytes_up"], a["bytes_down"]) == (b["bytes_up"], b["bytes_down"])
        assert a["failed_clients"] == b["failed_clients"] and list(a["failed_clients"]) == ["1"], label
        assert "divergence guard" in b["failed_clients"]["1"]["reason"]


def test_client_state_survives_rounds_in_flower_context(tmp_path):
    """`local` keeps each client's model in Flower's context.state: its accuracy must match the local engine."""
    a, b = summaries(*run_local_and_sim(tmp_path, small_config_dict(method="local", rounds=3)))
    assert a["tasks"] == b["tasks"]


def test_matu_matches_the_local_engine_in_flower_sim(tmp_path):
    from tests.test_matu_methods import ADAPTED

    a, b = summaries(*run_local_and_sim(tmp_path, small_config_dict(method="matu", rounds=2, **ADAPTED)))
    assert a["tasks"] == b["tasks"] and a["bytes_up"] == b["bytes_up"]


def test_sfmtl_graph_keeps_client_backbones_in_flower_context(tmp_path):
    """SFMTL-Graph's backbones never travel: they live in Flower's context.state. With half the clients sampled
    per round, a client that lost its state would restart from the initial backbone and its accuracy, and the
    heads and anchors it sends (hence the graph and the communities), would differ from the local engine's."""
    from tests.test_sfmtl import PERSONAL

    runs = run_local_and_sim(tmp_path, small_config_dict(method="sfmtl-graph", rounds=4, participation=0.5, **PERSONAL))
    a, b = summaries(*runs)
    assert a["tasks"] == b["tasks"] and a["bytes_up"] == b["bytes_up"]
    fits = [[json.loads(line)["fit"] for line in (run / "metrics.jsonl").read_text().splitlines()] for run in runs]
    assert fits[0] == fits[1] and any(k.startswith("community/") for k in fits[0][-1])


def test_a_wrapped_host_and_a_host_with_client_state_match_the_local_engine_in_flower_sim(tmp_path):
    """FedAvg + DEA: sparse uploads restored by the ServerApp exactly as in-process; FedDyn: its gradient term g
    persists in Flower's context.state (with half the clients sampled, a lost g would change the numbers)."""
    methods = [{"name": "fedavg", "plugin": {"name": "dea", "rho": 0.3}}, "feddyn"]
    local, sim = run_local_and_sim(tmp_path, small_config_dict(method=methods, rounds=3, participation=0.5))
    for label in ("fedavg+dea", "feddyn"):
        a, b = summaries(local / label, sim / label)
        assert a["tasks"] == b["tasks"], label
        assert (a["bytes_up"], a["bytes_down"]) == (b["bytes_up"], b["bytes_down"]), label
    plain = summaries(local / "fedavg+dea")[0]["bytes_up"]
    assert plain < summaries(local / "feddyn")[0]["bytes_up"] / 2  # the sparse upload is what Flower carried


def test_fedavg_with_dea_on_a_dense_model_matches_the_local_engine_in_flower_sim(tmp_path):
    """One client per nyud-like task (scenes), an encoder and four decoders, DEA's sparse uploads: Flower's
    simulation gives the local engine's metrics and bytes."""
    config = small_config_dict(
        method={"name": "fedavg", "plugin": {"name": "dea", "rho": 0.3}}, rounds=2,
        benchmark={"name": "scenes", "tasks": "nyud-like", "size": 16, "train_per_task": 16, "test_size": 8,
                   "images": "disjoint", "styles": 2},
        federation={"num_clients": 4, "tasks": {"kind": "one-per-client"}, "samples": {"kind": "iid"}},
        model={"backbone": "cnn", "channels": [4, 8], "norm": "batch", "decoder": {"width": 4}},
        train={"optimizer": "adamw", "lr": 0.001, "local_steps": 2, "batch_size": 4},
    )
    a, b = summaries(*run_local_and_sim(tmp_path, config))
    assert set(a["tasks"]) == {"semseg", "depth", "normals", "edge"}
    assert a["tasks"] == b["tasks"] and (a["bytes_up"], a["bytes_down"]) == (b["bytes_up"], b["bytes_down"])


def test_fl_talos_and_its_partition_variant_match_the_local_engine_in_flower_sim(tmp_path):
    """FL + TaLoS: every client's mask (computed in the calibration round, packed bits) lives in Flower's
    context.state and must be there in the sparse rounds; the partition variant's kept mask is server state and
    its uploads are subset values. Both give the local engine's metrics, bytes and per-round logs."""
    from tests.test_talos_methods import TALOS

    methods = [{"name": "talos", **TALOS}, {"name": "talos-partition", **TALOS}]
    local, sim = run_local_and_sim(tmp_path, small_config_dict(method=methods, rounds=5, participation=0.5))
    for label in ("talos", "talos-partition"):
        a, b = summaries(local / label, sim / label)
        assert a["tasks"] == b["tasks"], label
        assert (a["bytes_up"], a["bytes_down"]) == (b["bytes_up"], b["bytes_down"]), label
        fits = [[json.loads(line)["fit"] for line in (run / label / "metrics.jsonl").read_text().splitlines()]
                for run in (local, sim)]
        assert fits[0] == fits[1] and [f["phase"] for f in fits[0]] == [0, 0, 1, 2, 2]


def test_mas_matches_the_local_engine_in_flower_sim(tmp_path):
    """MAS: the stage of every round travels in the payload, the lookahead runs inside the ClientApp and the split
    is server state; the affinities, the split, the metrics and the bytes are the local engine's."""
    from tests.test_mas_methods import MAS, mas_config

    local, sim = run_local_and_sim(tmp_path, mas_config(MAS, rounds=3))
    a, b = summaries(local, sim)
    assert a["tasks"] == b["tasks"]
    assert (a["bytes_up"], a["bytes_down"], a["engine_rounds"]) == (b["bytes_up"], b["bytes_down"], 4)
    fits = [[json.loads(line)["fit"] for line in (run / "metrics.jsonl").read_text().splitlines()]
            for run in (local, sim)]
    assert fits[0] == fits[1] and [f["stage"] for f in fits[0]] == [0, 0, 1, 2]
    assert any(k.startswith("affinity/") for k in fits[0][1]) and any(k.startswith("split/") for k in fits[0][2])


def test_bench_times_flowers_simulation_against_the_local_engine(tmp_path):
    done = run_in_netns("bench", "--rounds", "1", "--only", "flower", "--out", str(tmp_path / "bench.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads((tmp_path / "bench.json").read_text())
    assert set(figures) == {"machine", "flower_simulation"}  # `--only flower`: the other parts are not measured
    sim = figures["flower_simulation"]
    assert sim["clients"] == 30
    assert sim["ratio"] == pytest.approx(sim["flower_sim_s_per_round"] / sim["local_s_per_round"])
    assert sim["vectorized_ratio"] == pytest.approx(sim["flower_sim_s_per_round"] / sim["vectorized_s_per_round"])
    assert "Flower / local" in done.stdout and "Flower / vectorized" in done.stdout


def test_the_users_own_method_and_benchmark_run_on_flowers_simulation(tmp_path):
    """examples/custom.yaml's `imports` reach every Ray actor: each rebuilds the experiment from the config."""
    example = Path(__file__).resolve().parents[1] / "examples" / "custom.yaml"
    done = run_in_netns("run", str(example), "method=fedavgm-prox", "engine=flower-sim", "--out",
                        str(tmp_path / "sim"), "--quiet")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["method"] == "fedavgm-prox"
    assert summary["tasks"]["shape"]["accuracy"] > 1 / 3 + 0.25 and summary["tasks"]["size"]["accuracy"] > 0.75

"""The papers' dense configs (configs/feddea/{nyudv2,pascal_context}_swin.yaml) run as shipped once their data and
Swin-T checkpoint are on disk: here on the loaders' tiny fixture trees with a tiny Swin saved by
`save_pretrained`, one round of FedAvg + DEA, only the paths and sizes changed."""

import json
from pathlib import Path

import pytest

from manytask.config import validate
from manytask.config_sources import apply_overrides, load_yaml
from manytask.errors import ManytaskError
from manytask.launch import run_config
from tests.dense_data_files import write_nyud, write_pascal

transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]
TINY_SWIN = {"image_size": 32, "patch_size": 2, "embed_dim": 8, "depths": [1, 1], "num_heads": [1, 2],
             "window_size": 2}


def _tiny_swin(folder: Path) -> Path:
    transformers.SwinModel(transformers.SwinConfig(**TINY_SWIN, num_channels=3)).save_pretrained(str(folder))
    return folder


@pytest.mark.parametrize(("config", "writer", "tasks"), [
    ("nyudv2_swin.yaml", write_nyud, {"semseg", "depth", "normals", "edge"}),
    ("pascal_context_swin.yaml", write_pascal, {"semseg", "parts", "normals", "saliency", "edge"}),
])
def test_the_paper_config_runs_on_data_in_the_real_layout(tmp_path, config, writer, tasks):
    data = apply_overrides(load_yaml(ROOT / "configs" / "feddea" / config), [
        f"benchmark.root={writer(tmp_path / 'data')}", "benchmark.size=16",
        f"model.weights={_tiny_swin(tmp_path / 'swin')}", "model.image_size=32", "model.decoder.width=8",
        "rounds=1", "eval_every=1", "train.local_epochs=1",
    ])
    data["method"], data["plugins"] = {"name": "fedavg", "plugin": {"name": "dea", "rho": 0.3}}, None
    run_config(validate(data), tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(summary["tasks"]) == tasks and summary["label"] == "fedavg+dea"
    assert (tmp_path / "run" / "predictions.safetensors").is_file()


def test_the_paper_config_names_the_missing_checkpoint(tmp_path):
    data = apply_overrides(load_yaml(ROOT / "configs" / "feddea" / "nyudv2_swin.yaml"), [
        f"benchmark.root={write_nyud(tmp_path / 'data')}", "benchmark.size=16",
        f"model.weights={tmp_path / 'nowhere'}"])
    data["method"], data["plugins"] = "fedavg", None
    with pytest.raises(ManytaskError, match="nowhere does not exist"):
        run_config(validate(data), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_the_mas_taskonomy_config_runs_one_client_per_building(tmp_path):
    """configs/mas/taskonomy_sdnkt.yaml on the tiny Taskonomy tree: the natural split gives each building's views to
    its own client, every view labelled for the five tasks, and MAS runs through its split."""
    from tests.dense_data_files import TASKONOMY_TRAIN, write_taskonomy

    data = apply_overrides(load_yaml(ROOT / "configs" / "mas" / "taskonomy_sdnkt.yaml"), [
        f"benchmark.root={write_taskonomy(tmp_path / 'data')}", "benchmark.size=16",
        "benchmark.buildings=[allensville, beechwood]", "benchmark.test_buildings=[collierville]",
        "federation.num_clients=2", "clients_per_round=2", "rounds=2", "eval_every=1", "train.batch_size=2",
    ])
    data["method"] = {"name": "mas", "groups": 2, "r0": 1, "affinity_every": 1}
    data["model"] = {"backbone": "cnn", "channels": [4, 8], "norm": "batch", "decoder": {"width": 4}}
    run_config(validate(data), tmp_path / "run")
    clients = json.loads((tmp_path / "run" / "federation.json").read_text())["clients"]
    views = [sum(1 for b, _, _ in TASKONOMY_TRAIN if b == building) for building in ("allensville", "beechwood")]
    assert [len(held["depth"]) for held in clients] == views
    assert all(len({tuple(indices) for indices in held.values()}) == 1 and len(held) == 5 for held in clients)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["engine_rounds"] == 1 + 2 * 1 and summary["total_test_loss"] is not None

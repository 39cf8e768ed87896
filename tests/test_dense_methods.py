"""Every registered method and every plug-in over every host runs unchanged on dense tasks (scenes, nyud-like,
an encoder and one decoder per task), or refuses in one sentence where its math needs classification heads."""

import json
import math

import pytest

from manytask.config import validate
from manytask.errors import ManytaskError
from manytask.launch import run_config
from manytask.methods.registry import HOST, METHODS, PLUGINS

NYUD_LIKE = {"semseg", "depth", "normals", "edge"}
# Methods that share one whole model (head included) across one-task clients, keep per-class anchors, or sample
# labels from the model's predictive distribution (TaLoS's Fisher scores).
TALOS = "TaLoS takes classification tasks only"
REFUSED = {"mas": "every client here holds one", "tag": "every client here holds one",
           "fedu": "same number of outputs", "pfedme": "same number of outputs", "sfmtl-graph": "classification",
           **dict.fromkeys(["talos", "talos-partition", "talos-oneshot", "centralized-talos"], TALOS)}
HOSTS = sorted(e.name for e in METHODS.entries() if e.target.family == HOST)


REQUIRED = {"fixed-split": {"partition": [["semseg", "depth"], ["normals", "edge"]]}}  # params without a default


def _config(method) -> dict:
    name = method if isinstance(method, str) else method["name"]
    if isinstance(method, str) and name in REQUIRED:
        method = {"name": name, **REQUIRED[name]}
    return {
        "name": "dense", "method": method, "rounds": 2, "seed": 0, "eval_every": 1,
        "benchmark": {"name": "scenes", "tasks": "nyud-like", "size": 16, "train_per_task": 12, "test_size": 8,
                      "images": "disjoint", "styles": 2},
        "federation": {"num_clients": 4, "tasks": {"kind": "one-per-client"}, "samples": {"kind": "iid"}},
        # a linearized encoder cannot have BatchNorm; FedBN needs it
        "model": {"backbone": "cnn", "channels": [4, 8], "norm": "none" if name == "ntk-fedavg" else "batch",
                  "decoder": {"width": 4}},
        "train": {"optimizer": "adamw", "lr": 0.001, "local_steps": 2, "batch_size": 4},
    }


def _check_finished(out) -> None:
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["tasks"]) == NYUD_LIKE
    assert all(math.isfinite(v) for metrics in summary["tasks"].values() for v in metrics.values())
    assert summary["task_kinds"] == {"semseg": "segmentation", "depth": "depth", "normals": "normals",
                                     "edge": "edges"}


@pytest.mark.parametrize("method", sorted(METHODS.names()))
def test_every_method_runs_on_dense_tasks_or_says_why_not(tmp_path, method):
    config = validate(_config(method))
    if method in REFUSED:
        with pytest.raises(ManytaskError, match=REFUSED[method]):
            run_config(config, tmp_path / "run")
        return
    run_config(config, tmp_path / "run")
    _check_finished(tmp_path / "run")


@pytest.mark.parametrize("plugin", sorted(PLUGINS.names()))
@pytest.mark.parametrize("host", HOSTS)
def test_every_plugin_wraps_every_host_on_dense_tasks(tmp_path, host, plugin):
    config = _config({"name": host, "plugin": {"name": plugin}})
    if plugin == "dp" and host != "fedbn":  # dp refuses running statistics its noise would not cover (test_dp.py)
        config["model"] = {**config["model"], "norm": "none"}
    run_config(validate(config), tmp_path / "run")
    _check_finished(tmp_path / "run")

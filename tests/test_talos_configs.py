"""The FL + TaLoS configs: the paper's CIFAR-100 + ViT-S/16 setting runs as shipped once its files are on disk
(here: small generated CIFAR-100 files and a tiny ViT saved by `save_pretrained`), every member, one short run."""

import json
from pathlib import Path

import pytest

from manytask.config import validate
from manytask.config_sources import apply_overrides, load_yaml
from manytask.launch import run_config
from tests.test_cifar100 import _write

transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]
TINY_VIT = {"image_size": 32, "patch_size": 8, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 32}


def test_the_paper_config_runs_every_member_on_files_in_the_real_layout(tmp_path):
    vit = tmp_path / "vit"
    transformers.ViTModel(transformers.ViTConfig(**TINY_VIT, num_channels=3), add_pooling_layer=False
                          ).save_pretrained(str(vit))
    data = apply_overrides(load_yaml(ROOT / "configs" / "talos" / "cifar100_vit_s16.yaml"), [
        f"benchmark.root={_write(tmp_path / 'data', train=400, test=100)}", f"model.weights={vit}",
        *(f"model.{k}={v}" for k, v in TINY_VIT.items()), "federation.num_clients=4", "rounds=4", "eval_every=2",
        "federation.samples={kind: shards, classes_per_client: 25}",
    ])
    for member in data["method"]:
        if isinstance(member, dict) and "head_rounds" in member:
            member["head_rounds"], member.get("train", {})["local_steps"] = 1, 2
        if isinstance(member, dict) and "shot_steps" in member:
            member["shot_steps"] = 3
    summaries = run_config(validate(data), tmp_path / "run")
    assert sorted(summaries) == sorted(["centralized-head-only", "centralized-talos", "head-only", "talos",
                                        "talos-partition", "talos-oneshot"])
    rows = [json.loads(line) for line in (tmp_path / "run" / "talos" / "metrics.jsonl").read_text().splitlines()]
    assert [row["fit"]["phase"] for row in rows] == [0, 1, 2, 2] and rows[1]["sampled"] == [0, 1, 2, 3]

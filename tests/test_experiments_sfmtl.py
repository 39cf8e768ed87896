"""SFMTL-Graph's experiments: the measures of its tables by hand on tiny fake runs, the shared runs of one config,
the FLOPs count of a round (pFedMe's K inner steps), the anchors' t-SNE numbers, and one experiment at smoke
scale."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from manytask.config import to_yaml, validate
from manytask.experiments.measures import upload_per_round
from manytask.experiments.runner import Unit
from manytask.experiments.sfmtl import (
    cumulative_mbit,
    last_communities,
    mbit_per_round,
    mean_communities,
    mean_test_loss,
    run_in_rounds_of,
)
from manytask.experiments.sfmtl_extras import (
    FLOPS_FILE,
    adopt_sibling_run,
    class_cosines,
    gflops_ratio,
    local_gflops,
    neighbour_agreement,
    round_flops,
)
from manytask.report.runs import RunRecord
from tests.conftest import small_config_dict

PERSONAL = {
    "benchmark": {"name": "rotated-masked-digits", "num_clients": 4, "patch_prob": 0.25},
    "federation": {"num_clients": 4, "tasks": {"kind": "one-per-client"}, "samples": {"kind": "iid"}},
    "model": {"backbone": "mlp", "hidden": [16]},
}


mbit_up_per_round = upload_per_round(8e-6)  # bits up per round, in Mbit

def record(label: str, method: str, tmp: Path | None = None, metrics: list[dict[str, Any]] | None = None,
           **summary: Any) -> RunRecord:
    return RunRecord(tmp or Path(label), {"label": label, "method": method, **summary}, metrics or [])


def test_loss_and_bits_by_hand():
    sfmtl = record("sfmtl-graph", "sfmtl-graph", rounds=4, bytes_up=30_000, bytes_down=20_000,
                   total_test_loss=3.0, tasks={"a": {}, "b": {}, "c": {}})
    fedu = record("fedu", "fedu", rounds=4, bytes_up=1_500_000, bytes_down=500_000)
    local = record("local", "local", rounds=4, bytes_up=0, bytes_down=0)
    runs = {"sfmtl-graph": sfmtl, "fedu": fedu, "local": local}
    assert mean_test_loss(sfmtl, runs) == pytest.approx(1.0)
    assert cumulative_mbit(sfmtl, runs) == pytest.approx(0.4)  # 50 000 bytes = 0.4 Mbit
    assert mbit_per_round(fedu, runs) == pytest.approx(4.0)  # 16 Mbit over 4 rounds
    ratio = run_in_rounds_of("sfmtl-graph")
    assert ratio(fedu, runs) == pytest.approx(0.1)  # SFMTL-Graph's whole run is a tenth of one FedU round
    assert ratio(sfmtl, runs) is None and ratio(local, runs) is None  # itself; a member that sends nothing


def test_bits_up_per_round_by_hand():
    sfmtl = record("sfmtl-graph", "sfmtl-graph", rounds=4, bytes_up=30_000, bytes_down=20_000)
    assert mbit_up_per_round(sfmtl, {}) == pytest.approx(0.06)  # 240 000 bits up over 4 rounds, the down left out
    assert mbit_up_per_round(record("local", "local", rounds=4, bytes_up=0), {}) == 0.0
    assert mbit_up_per_round(record("old", "fedu", rounds=4), {}) is None  # a summary without bytes


def test_communities_by_hand():
    rows = [{"round": 1, "fit": {"communities": 2.0, "community/0": 0.0, "community/1": 1.0}},
            {"round": 2, "fit": {"communities": 1.0, "community/0": 0.0, "community/2": 0.0}},
            {"round": 3, "fit": {}}]
    run = record("sfmtl-graph", "sfmtl-graph", metrics=rows)
    assert mean_communities(run, {}) == pytest.approx(1.5)
    assert last_communities(run, {}) == 1.0
    assert mean_communities(record("fedu", "fedu"), {}) is None


def test_flops_measures_read_the_runner_file(tmp_path):
    for label, flops in (("fedavg", 2e9), ("pfedme", 1e10)):
        (tmp_path / label).mkdir()
        (tmp_path / label / FLOPS_FILE).write_text(json.dumps({"flops_per_client": flops}))
    runs = {label: record(label, label, tmp_path / label) for label in ("fedavg", "pfedme")}
    assert local_gflops(runs["pfedme"], runs) == pytest.approx(10.0)
    assert gflops_ratio("fedavg")(runs["pfedme"], runs) == pytest.approx(5.0)
    assert local_gflops(record("local", "local", tmp_path / "none"), runs) is None


def test_round_flops_counts_pfedme_inner_steps():
    """pFedMe's K gradient steps per batch: K times FedAvg's matrix products in a round, on the same clients."""
    def flops(method: Any) -> dict[str, float]:
        config = validate(small_config_dict(method=method, rounds=2, **PERSONAL))
        return round_flops(to_yaml(config))

    fedavg, pfedme = flops({"name": "fedavg", "shared_head": True}), flops({"name": "pfedme", "inner_steps": 3})
    assert fedavg["clients"] == pfedme["clients"] == 4 and fedavg["flops_per_client"] > 0
    assert pfedme["flops_per_client"] / fedavg["flops_per_client"] == pytest.approx(3.0, rel=1e-3)


def test_neighbours_and_cosines_by_hand():
    points = [[0.0, 0.0], [0.0, 1.0], [10.0, 0.0], [10.0, 1.5], [4.0, 0.0]]
    # nearest: 0→1 (a, a), 1→0, 2→3 (b, b), 3→2, and 4→0 (at 4, where 2 is at 6): a, not its group b
    assert neighbour_agreement(points, ["a", "a", "b", "b", "b"]) == pytest.approx(4 / 5)
    anchors = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    within, across = class_cosines(anchors, clients=[0, 1, 2, 3], classes=[7, 7, 7, 7],
                                   groups={0: 0, 1: 0, 2: 1, 3: 1})
    assert within == pytest.approx((1.0 + 0.8) / 2)  # pairs (0, 1) and (2, 3)
    assert across == pytest.approx((0.0 + 0.6 + 0.0 + 0.6) / 4)  # (0, 2), (0, 3), (1, 2), (1, 3)


def _finished(path: Path, config_text: str) -> None:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(config_text)
    (path / "summary.json").write_text(json.dumps({"label": "fedavg"}))


def test_a_sibling_run_with_the_same_config_is_taken(tmp_path):
    config = to_yaml(validate(small_config_dict()))
    other = to_yaml(validate(small_config_dict(rounds=5)))
    _finished(tmp_path / "sfmtl" / "fig2" / "cpu" / "seed0" / "fedavg", config)
    out = tmp_path / "sfmtl" / "table2" / "cpu"
    unit = Unit(0, "fedavg", config, out / "seed0" / "fedavg")
    assert adopt_sibling_run(unit, out) == tmp_path / "sfmtl" / "fig2" / "cpu" / "seed0" / "fedavg"
    assert json.loads((unit.out / "summary.json").read_text()) == {"label": "fedavg"}
    changed = Unit(0, "fedavg", other, tmp_path / "sfmtl" / "table1" / "cpu" / "seed0" / "fedavg")
    assert adopt_sibling_run(changed, changed.out.parents[1]) is None and not changed.out.exists()


@pytest.mark.slow
def test_anchor_tsne_at_smoke_scale(tmp_path):
    from manytask.experiments.reproduce import reproduce

    result, path = reproduce("sfmtl/fig4-anchors-tsne", "smoke", jobs=1, out=tmp_path, log=lambda _: None)
    assert path is None and set(result["values"]) == {"sfmtl-graph", "sfmtl-random-graph"}
    for label, columns in result["values"].items():
        assert 0 <= columns["t-SNE nearest neighbour in its group %"][0] <= 100
        assert -1 <= columns["anchor cosine, same class, same group"][0] <= 1
        assert (tmp_path / "seed0" / label / "anchors_tsne.png").read_bytes().startswith(b"\x89PNG")
        found = json.loads((tmp_path / "seed0" / label / "anchors_tsne.json").read_text())
        assert len(found["points"]) == len(found["clients"]) == len(found["classes"]) >= 3

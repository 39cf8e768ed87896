"""SFMTL-Graph's client graph in reports: communities read back, their ARI against the true clusters, the plot."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from manytask.cli import app
from manytask.config import validate
from manytask.errors import ManytaskError
from manytask.launch import run_config
from manytask.report import load_run, write_report
from manytask.report.graph import (
    client_graph,
    community_ari,
    community_ari_curve,
    community_rounds,
    community_summary,
    default_graph_rounds,
    draw_client_graph,
    modularity_curves,
    plot_client_graph,
)
from tests.conftest import small_config_dict
from tests.test_sfmtl import PERSONAL

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TASK_GROUPS = {"t0": 0, "t1": 0, "t2": 0, "t3": 1, "t4": 1, "t5": 1}
# Client c holds task t((c + 1) mod 6), so a client's true cluster comes from federation.json, not its id:
# clients 0, 1, 5 are in cluster 0 and clients 2, 3, 4 in cluster 1.
HOLDINGS = [{f"t{(c + 1) % 6}": list(range(10))} for c in range(6)]
COMMUNITIES = {
    1: {0: 1, 1: 1, 5: 1, 2: 0, 3: 0, 4: 0},  # the clusters with swapped labels: ARI 1
    2: {c: 0 for c in range(6)},  # one community: ARI 0
    3: {0: 0, 1: 1, 2: 2, 3: 2},  # cluster 0's clients 0 and 1 split apart; ARI 4/7 (see below)
}
# Round 3 by hand: clusters [0, 0, 1, 1] against communities [0, 1, 2, 2] over n = 4 clients.
# Pairs together in both: 1 (clients 2, 3); in the same cluster: 1 + 1 = 2; in the same community: 1; all: 6.
# Expected index 2·1/6 = 1/3, maximum (2 + 1)/2 = 3/2, so ARI = (1 − 1/3) / (3/2 − 1/3) = 4/7.
SPLIT_ARI = 4 / 7
EDGES = {(0, 1): 0.5, (0, 2): 0.1, (2, 3): 0.9}


def _fit(round_: int) -> dict[str, float]:
    """The fit scalars SFMTL-Graph logs: community count, each participant's community, positive edges."""
    community = COMMUNITIES[round_]
    fit = {"communities": float(len(set(community.values())))}
    fit |= {f"community/{c}": float(n) for c, n in community.items()}
    edges = EDGES if round_ == 3 else {(a, b): 0.3 for a in community for b in community if a < b}
    return fit | {f"graph/{a}/{b}": w for (a, b), w in edges.items()}


def make_graph_run(path: Path, *, groups: bool = True, communities: bool = True, method: str = "sfmtl-graph") -> Path:
    """A run directory in the engine's format: rounds 1-3 log communities, round 4 logs none."""
    path.mkdir(parents=True)
    rows: list[dict[str, Any]] = [
        {"round": r, "sampled": sorted(COMMUNITIES[r]), "fit": _fit(r) if communities else {}} for r in (1, 2, 3)
    ]
    rows.append({"round": 4, "sampled": [0, 1], "fit": {}})
    (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    summary: dict[str, Any] = {
        "method": method, "label": method, "benchmark": "rotated-masked-digits", "rounds": 4, "num_clients": 6,
        "tasks": {t: {"accuracy": 0.5, "loss": 1.0} for t in TASK_GROUPS},
        "main_metric": {t: "accuracy" for t in TASK_GROUPS},
    }
    if groups:
        summary["task_groups"] = TASK_GROUPS
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "federation.json").write_text(json.dumps({"clients": HOLDINGS}))
    return path


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return make_graph_run(tmp_path / "run")


def _png_width(path: Path) -> int:
    """Width in pixels from a PNG's header (after checking it is one and not empty)."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5_000
    return struct.unpack(">I", data[16:20])[0]


def test_communities_and_edges_are_read_back(run: Path) -> None:
    record = load_run(run)
    assert community_rounds(record) == [1, 2, 3]
    clients, edges, community = client_graph(record, 3)
    assert clients == [0, 1, 2, 3]
    assert edges == EDGES
    assert community == COMMUNITIES[3]
    with pytest.raises(ManytaskError, match="no communities at round 4"):
        client_graph(record, 4)


def test_ari_matches_the_hand_computed_values(run: Path) -> None:
    record = load_run(run)
    assert community_ari(record, 1) == pytest.approx(1.0)  # equal partitions up to relabelling
    assert community_ari(record, 2) == pytest.approx(0.0)
    assert community_ari(record) == pytest.approx(SPLIT_ARI)  # the last round that logged communities
    rounds, aris = community_ari_curve(record)
    assert rounds == [1, 2, 3] and aris == pytest.approx([1.0, 0.0, SPLIT_ARI])
    summary = community_summary(record)
    assert summary is not None
    assert (summary.last_round, summary.communities, summary.ari_rounds) == (3, 3, 3)
    assert summary.mean_ari == pytest.approx((1 + SPLIT_ARI) / 3)


# Modularity by hand, Q = Σ_c [L_c / m − (d_c / 2m)²]. Rounds 1-2: six clients, all 15 edges 0.3 (m = 4.5, every
# degree 1.5); the true clusters {0, 1, 5}, {2, 3, 4} hold 3 edges each: Q = 2·(0.9/4.5 − (4.5/9)²) = −0.1 (round 1's
# communities are that partition; round 2's single community has Q = 0). Round 3: edges (0,1) 0.5, (0,2) 0.1,
# (2,3) 0.9, m = 1.5, degrees 0.6, 0.5, 1.0, 0.9. True {0, 1}, {2, 3}: (0.5/1.5 − (1.1/3)²) + (0.9/1.5 − (1.9/3)²);
# found {0}, {1}, {2, 3}: −(0.6/3)² − (0.5/3)² + (0.9/1.5 − (1.9/3)²).
TRUE_Q = [-0.1, -0.1, 0.5 / 1.5 - (1.1 / 3) ** 2 + 0.9 / 1.5 - (1.9 / 3) ** 2]
FOUND_Q = [-0.1, 0.0, -((0.6 / 3) ** 2) - (0.5 / 3) ** 2 + 0.9 / 1.5 - (1.9 / 3) ** 2]


def test_modularity_of_the_found_and_the_true_partition_by_hand(run: Path) -> None:
    curves = modularity_curves(load_run(run))
    assert curves["true"][0] == [1, 2, 3] and curves["true"][1] == pytest.approx(TRUE_Q)
    assert curves["found"][0] == [1, 2, 3] and curves["found"][1] == pytest.approx(FOUND_Q)
    summary = community_summary(load_run(run))
    assert summary.true_modularity == pytest.approx(sum(TRUE_Q) / 3)
    assert summary.found_modularity == pytest.approx(sum(FOUND_Q) / 3)


def test_no_ari_without_groups_or_communities(tmp_path: Path) -> None:
    ungrouped = load_run(make_graph_run(tmp_path / "ungrouped", groups=False))
    assert community_ari(ungrouped) is None and community_ari_curve(ungrouped) == ([], [])
    (tmp_path / "no-federation").mkdir()
    for name in ("summary.json", "metrics.jsonl"):
        (tmp_path / "no-federation" / name).write_text((tmp_path / "ungrouped" / name).read_text())
    assert community_ari(load_run(tmp_path / "no-federation")) is None
    silent = load_run(make_graph_run(tmp_path / "silent", communities=False, method="fedavg"))
    assert community_rounds(silent) == [] and community_ari(silent) is None and community_summary(silent) is None
    assert plot_client_graph(silent, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


def test_plot_has_one_panel_per_chosen_round(run: Path, tmp_path: Path) -> None:
    record = load_run(run)
    assert default_graph_rounds(record) == [1, 2, 3]
    assert len(draw_client_graph(record, [1, 3]).axes) == 2
    assert [ax.get_title() for ax in draw_client_graph(record, [3]).axes] == ["round 3: 3 communities, ARI 0.57"]
    ungrouped = load_run(make_graph_run(tmp_path / "ungrouped", groups=False))
    assert draw_client_graph(ungrouped, [2]).axes[0].get_title() == "round 2: 1 community"
    one = _png_width(plot_client_graph(record, tmp_path / "one.png", [2]))
    assert _png_width(plot_client_graph(record, tmp_path / "default.png")) > one


def test_single_report_has_the_graph_and_the_ari_line(run: Path) -> None:
    text = write_report(run).read_text()
    assert "- client communities: 3 at round 3" in text
    assert "- community ARI vs the true client clusters: 0.57 at round 3 (mean 0.52 over 3 rounds)" in text
    assert "](plots/client_graph_sfmtl-graph.png)" in text
    _png_width(run / "plots" / "client_graph_sfmtl-graph.png")


def test_comparison_report_tables_the_community_ari(tmp_path: Path) -> None:
    root = tmp_path / "cmp"
    make_graph_run(root / "sfmtl-graph")
    make_graph_run(root / "fedavg", communities=False, method="fedavg")
    (root / "summary.json").write_text(json.dumps({"runs": {"sfmtl-graph": {}, "fedavg": {}}}))
    text = write_report(root).read_text()
    table = text.split("## Client communities\n")[1].split("## Plots")[0].strip().splitlines()
    assert table[0] == ("| run | last round | communities | community ARI | mean ARI over rounds | modularity found "
                        "(mean) | modularity of the true clusters (mean) |")
    assert table[2:] == ["| sfmtl-graph | 3 | 3 | 0.57 | 0.52 | 0.010 | 0.066 |"]  # fedavg logged no communities
    assert "- community ARI vs the true client clusters: 0.57 at round 3" in text  # in the run's own section
    assert "](plots/client_graph_sfmtl-graph.png)" in text and "client_graph_fedavg" not in text


def test_cli_chooses_the_graph_rounds(run: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["report", str(run)]).exit_code == 0
    default = _png_width(run / "plots" / "client_graph_sfmtl-graph.png")
    assert runner.invoke(app, ["report", str(run), "--graph-round", "2"]).exit_code == 0
    assert _png_width(run / "plots" / "client_graph_sfmtl-graph.png") < default
    result = runner.invoke(app, ["report", str(run), "--graph-round", "4"])
    assert result.exit_code == 2 and "no communities at round 4" in result.output


@pytest.mark.slow
def test_report_of_a_real_sfmtl_graph_run(tmp_path: Path) -> None:
    config = validate(small_config_dict(method="sfmtl-graph", rounds=3, **PERSONAL))
    run_config(config, tmp_path / "r")
    text = write_report(tmp_path / "r").read_text()
    assert re.search(r"- community ARI vs the true client clusters: -?\d\.\d\d at round 3 \(mean", text)
    assert "](plots/client_graph_sfmtl-graph.png)" in text
    _png_width(tmp_path / "r" / "plots" / "client_graph_sfmtl-graph.png")

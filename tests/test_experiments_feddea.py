"""FedDEA's experiments: the paper's tables as data, the measures (Δ% against a member's host, the server step, the
convergence columns, Fig. 2's overlap of top-10 % sets, the digits analyses' peak accuracy) against hand-computed
values, the server-step control's stages on fake runs, and one control table run end to end at smoke scale."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from manytask.experiments import feddea, feddea_runners
from manytask.experiments.published import parse_table, published
from manytask.experiments.runner import Unit
from manytask.report.runs import RunRecord


def record(label: str, method: str, tasks: dict[str, float], **summary: object) -> RunRecord:
    """A finished run whose tasks' main metric is `miou` (higher is better)."""
    data = {"label": label, "method": method, "tasks": {t: {"miou": v} for t, v in tasks.items()},
            "main_metric": dict.fromkeys(tasks, "miou"), "higher_is_better": dict.fromkeys(tasks, True), **summary}
    rows = summary.pop("rows", [])
    return RunRecord(Path(label), data, list(rows))  # type: ignore[arg-type]


def test_the_papers_tables_are_read_from_their_files_with_dashes_for_missing_figures() -> None:
    rows = parse_table("# a note\nlabel\tmIoU\tΔ%\nfedavg\t23.05\t-\nfedavg+dea\t30.78\t10.60\n", "t")
    assert rows == {"fedavg": {"mIoU": 23.05}, "fedavg+dea": {"mIoU": 30.78, "Δ%": 10.60}}
    with pytest.raises(ValueError, match=r"t\.tsv: row 'fedavg' has 1 figures for 2 columns"):
        parse_table("label\ta\tb\nfedavg\t1\n", "t")
    assert feddea.TABLE3_NYUD["fedavg+pcgrad"]["Δ%"] == -38.37 and len(feddea.TABLE3_NYUD) == 32
    assert len(feddea.TABLE3_PASCAL) == len(feddea.TABLE5_NYUD) == len(feddea.TABLE5_PASCAL) == 32
    assert published("feddea_table4")["fedavg+dea-smallest"] == {
        "semseg mIoU": 1.22, "depth RMSE": 2.1058, "normals mErr": 52.40, "edge odsF": 57.44, "Δ%": -101.96}
    # the control tables show the paper's +DEA Δ% beside both of FedDyn's and FedACG's DEA rules
    assert feddea.deltas_only(feddea.TABLE3_NYUD)["feddyn+dea-paper"] == {"Δ%": 10.75}


def test_delta_against_the_host_and_the_server_step() -> None:
    host = record("fedavg", "fedavg", {"a": 0.5, "b": 0.8})
    plugged = record("fedavg+dea", "fedavg", {"a": 0.6, "b": 0.6}, plugin="dea",
                     rows=[{"round": 1, "fit": {"dea/inflation": 1.8}}, {"round": 2, "fit": {"dea/inflation": 2.0}}])
    scaled = record("fedavg×c", "fedavg", {"a": 0.55, "b": 0.8}, method_params={"server_lr": 1.9})
    runs = {r.group: r for r in (host, plugged, scaled)}
    # Δ% = mean of (0.6 − 0.5)/0.5 and (0.6 − 0.8)/0.8, in %: (20 − 25)/2; and (10 + 0)/2
    assert feddea.delta_against_host(plugged, runs) == pytest.approx(-2.5)
    assert feddea.delta_against_host(scaled, runs) == pytest.approx(5.0)
    assert feddea.delta_against_host(host, runs) is None
    assert feddea.server_step(plugged, runs) == pytest.approx(1.9)
    assert feddea.server_step(scaled, runs) == pytest.approx(1.9)
    assert feddea.server_step(host, runs) is None
    bases = feddea.delta_against_members({"fedavg×c": "fedavg+dea"})
    assert bases(scaled, runs) == pytest.approx(((0.55 - 0.6) / 0.6 + (0.8 - 0.6) / 0.6) / 2 * 100)
    assert bases(host, runs) is None


def test_convergence_columns_read_the_evaluation_at_a_share_of_the_rounds() -> None:
    rows = [{"round": r, "eval": {"semseg": {"miou": r / 10}}} for r in (2, 4, 6, 8)]
    run = record("fedavg", "fedavg", {"semseg": 0.8}, rounds=8, rows=rows)
    assert feddea.round_at(run, 0.25) == 2 and feddea.round_at(run, 0.3) == 3
    assert feddea.metric_at("semseg", "miou", 0.3, 100)(run, {}) == pytest.approx(20.0)  # round 2, the last by 3
    assert feddea.metric_at("semseg", "miou", 1.0, 100)(run, {}) == pytest.approx(80.0)
    base = record("fedavg", "fedavg", {"semseg": 0.4}, rounds=8,
                  rows=[{"round": r, "eval": {"semseg": {"miou": 0.4}}} for r in (2, 4, 6, 8)])
    ahead = record("fedavg+dea", "fedavg", {"semseg": 0.8}, rounds=8, rows=rows)
    # Δ% per round: 0.2/0.4 − 1 = −50, 0, +50, +100 -> mean +25
    assert feddea.mean_delta_over_rounds(ahead, {"fedavg": base}) == pytest.approx(25.0)


def test_peak_accuracy_is_the_best_evaluated_average() -> None:
    rows = [{"round": 5, "average": 0.523}, {"round": 10, "average": 0.142}, {"round": 12, "fit": {"loss": 1.0}},
            {"round": 15, "average": 0.219}]
    run = record("feddyn+dea", "feddyn", {"a": 0.219}, rows=rows)
    assert feddea.peak_accuracy(run, {}) == pytest.approx(52.3)  # round 5's, not the final 21.9
    assert feddea.peak_accuracy(record("fedavg", "fedavg", {"a": 0.5}), {}) is None  # never evaluated


def test_overlap_of_top_sets_against_hand_counts() -> None:
    # top 1 of 4 entries (fraction 0.25): client a -> {0}, b -> {0}, c -> {3}
    a, b, c = (torch.tensor(v) for v in ([9.0, 1, 1, 1], [-9.0, 1, 1, 1], [1.0, 1, 1, 5]))
    masks = feddea_runners.top_masks([a, b, c], fraction=0.25)
    assert [m.nonzero().flatten().tolist() for m in masks] == [[0], [0], [3]]
    found = feddea_runners.overlap(masks)
    assert found["jaccard"] == pytest.approx((1 + 0 + 0) / 3)  # pairs (b, a), (c, a), (c, b)
    assert found["exclusive"] == pytest.approx((0 + 0 + 1) / 3)  # only c's entry is nobody else's


def _unit(tmp: Path, label: str, method: object) -> Unit:
    config = {"method": method, "seed": 0}
    return Unit(0, label, yaml.safe_dump(config, allow_unicode=True), tmp / "seed0" / label)


def test_the_control_stages_derive_eq6_and_host_times_c_runs(tmp_path: Path) -> None:
    dea = {"name": "dea", "rho": 0.5}
    first = [_unit(tmp_path, "fedavg", "fedavg"), _unit(tmp_path, "fedavg+dea", {"name": "fedavg", "plugin": dea}),
             _unit(tmp_path, "feddyn", {"name": "feddyn", "alpha": 0.1}),
             _unit(tmp_path, "feddyn+dea", {"name": "feddyn", "alpha": 0.1, "plugin": dea})]
    paper_rule = feddea_runners.paper_rule_units(first)
    assert [u.label for u in paper_rule] == ["feddyn+dea-paper"]
    assert yaml.safe_load(paper_rule[0].config)["method"] == {
        "name": "feddyn", "alpha": 0.1, "plugin": {**dea, "rule": "paper"}, "label": "feddyn+dea-paper"}
    assert paper_rule[0].out == tmp_path / "seed0" / "feddyn+dea-paper"

    for unit, values in ((first[1], [1.8, 2.0]), (first[3], [1.5])):
        unit.out.mkdir(parents=True)
        (unit.out / "summary.json").write_text(json.dumps({"label": unit.label}))
        (unit.out / "metrics.jsonl").write_text("".join(
            json.dumps({"round": i + 1, "fit": {"dea/inflation": v}}) + "\n" for i, v in enumerate(values)))
    pairs = feddea_runners.host_units(first)
    assert [(h.label, d.label) for h, d in pairs] == [("fedavg", "fedavg+dea"), ("feddyn", "feddyn+dea")]
    scaled = feddea_runners.scaled_units(pairs)
    methods = [yaml.safe_load(u.config)["method"] for u in scaled]
    assert methods[0] == {"name": "fedavg", "server_lr": pytest.approx(1.9), "label": "fedavg×c"}
    assert methods[1] == {"name": "feddyn", "alpha": 0.1, "server_lr": 1.5, "label": "feddyn×c"}
    ordered = feddea_runners.control_order(first + paper_rule + scaled)
    assert [u.label for u in ordered] == ["fedavg", "fedavg+dea", "fedavg×c", "feddyn", "feddyn+dea", "feddyn×c",
                                          "feddyn+dea-paper"]


@pytest.mark.slow
def test_table3_runs_with_its_server_step_control_at_smoke_scale(tmp_path: Path) -> None:
    from manytask.experiments.reproduce import reproduce

    result, path = reproduce("feddea/table3-nyud", "smoke", jobs=1, out=tmp_path, log=lambda _: None)
    assert path is None
    values = result["values"]
    assert list(values) == ["feddyn", "feddyn+dea", "feddyn×c", "feddyn+dea-paper", "feddyn+pcgrad",
                            "feddyn+fedheal"]
    [c] = values["feddyn+dea"]["c (server step ×)"]
    assert 1 / math.sqrt(0.5) - 1e-6 <= c <= 2 + 1e-6  # the top half of the entries hold at least half of ‖Δ‖²
    assert values["feddyn×c"]["c (server step ×)"] == [pytest.approx(c)]
    [paper_c] = values["feddyn+dea-paper"]["c (server step ×)"]
    assert 1 / math.sqrt(0.5) - 1e-6 <= paper_c <= 2 + 1e-6
    assert values["feddyn"]["Δ%"] == [None]
    assert values["feddyn+pcgrad"]["c (server step ×)"] == [None]
    assert all(math.isfinite(values[label]["Δ%"][0]) for label in list(values)[1:])
    assert all(0 <= values[label]["semseg mIoU"][0] <= 100 for label in values)
    assert len(result["fingerprint"]["values"]) == 6 * 4  # six runs, four tasks each

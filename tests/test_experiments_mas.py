"""MAS's registered experiments: the measures read splits, covers and affinities as the staged runs log them, the
reference runner trains every client of a reference member, every scale resolves to the members it promises, and
the Fig. 5 comparison runs end to end at smoke scale."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from manytask.errors import ManytaskError
from manytask.experiments import mas
from manytask.experiments.catalogue import all_experiments
from manytask.experiments.reproduce import refuse_unrunnable
from manytask.experiments.runner import Unit, scale_config, units
from manytask.report.runs import RunRecord

TASKS = list(mas.SDNKT)


def record(label: str, total: float = 1.0, fit: dict[str, float] | None = None, **summary: Any) -> RunRecord:
    """A finished run of the five sdnkt tasks whose second round logged `fit`."""
    tasks = {task: {"loss": total / len(TASKS)} for task in TASKS}
    rows = [{"round": 1, "fit": {"stage": 0.0}}, {"round": 2, "fit": fit or {}}]
    return RunRecord(Path(label), {"label": label, "tasks": tasks, "total_test_loss": total, **summary}, rows)


def split_fit(*groups: str) -> dict[str, float]:
    """`split/<task>` = group id, from groups given as letters ('sd', 'nkt')."""
    by_letter = {mas.LETTERS[t]: t for t in TASKS}
    return {f"split/{by_letter[c]}": float(g) for g, group in enumerate(groups) for c in group}


def affinity_fit(S: list[list[float]]) -> dict[str, float]:
    return {f"affinity/{a}/{b}": S[i][j] for i, a in enumerate(TASKS) for j, b in enumerate(TASKS) if i != j}


def block(*groups: str, strong: tuple[str, float] | None = None) -> list[list[float]]:
    """S with 1 between tasks of the same group (letters) and 0 elsewhere; `strong` ('ds', 2.0) sets S_{d→s}."""
    index = {mas.LETTERS[t]: i for i, t in enumerate(TASKS)}
    S = [[0.0] * len(TASKS) for _ in TASKS]
    for group in groups:
        for a in group:
            for b in group:
                if a != b:
                    S[index[a]][index[b]] = 1.0
    if strong:
        S[index[strong[0][0]]][index[strong[0][1]]] = strong[1]
    return S


def test_split_text_reads_a_partition_in_task_order_and_tags_cover_with_commas():
    # group ids as logged need not follow the task order: the text orders groups by their first task
    assert mas.split_text(record("mas-2", fit=split_fit("nkt", "sd")), {}) == "sd|nkt"
    cover = {**split_fit("sd", "nkt"), **{f"cover/1/{t}": 1.0 for t in TASKS},
             **{f"cover/2/{t}": float(t in ("semseg", "normals")) for t in TASKS}}
    assert mas.split_text(record("tag-2", fit=cover), {}) == "sdnkt, sn"
    assert mas.split_text(record("all-in-one-fedavg"), {}) is None


def test_split_rank_ranks_a_split_within_its_start_and_finds_mas_own_split():
    runs = {"mas-2": record("mas-2", 0.9, split_fit("nkt", "sd")),
            "scratch-sd-nkt": record("scratch-sd-nkt", 1.2),  # fixed-split logs no split: its label names it
            "scratch-sdkt-n": record("scratch-sdkt-n", 1.0),
            "all-in-one-sd-nkt": record("all-in-one-sd-nkt", 1.1, split_fit("sd", "nkt")),
            "all-in-one-sdkt-n": record("all-in-one-sdkt-n", 1.3, split_fit("sdkt", "n"))}
    scratch, start = mas.split_rank("scratch"), mas.split_rank("all-in-one")
    assert scratch(runs["mas-2"], runs) == 2.0 and start(runs["mas-2"], runs) == 1.0
    assert scratch(runs["scratch-sdkt-n"], runs) == 1.0 and start(runs["all-in-one-sdkt-n"], runs) == 2.0
    assert scratch(runs["all-in-one-sd-nkt"], runs) == 2.0  # the same split from the other start


def test_gap_and_ratio_are_paired_on_the_same_seed_and_sweep_point():
    wide = " channels=[64, 128, 256]"
    runs = {f"mas-2{wide}": record(f"mas-2{wide}", 0.9), f"all-in-one-fedavg{wide}": record(f"x{wide}", 1.2),
            "mas-2": record("mas-2", 1.5), "all-in-one-fedavg": record("all-in-one-fedavg", 1.0)}
    gap = mas.gap_percent("all-in-one-fedavg")
    assert gap(runs[f"mas-2{wide}"], runs) == pytest.approx(-25.0)
    assert gap(runs["mas-2"], runs) == pytest.approx(50.0)
    base = RunRecord(Path("b"), {"label": "all-in-one-fedavg", "total_test_loss": 1.0})
    assert gap(base, runs) is None
    computed = {"one-by-one": record("one-by-one", client_compute_seconds=80.0),
                "mas-2": record("mas-2", client_compute_seconds=60.0)}
    assert mas.ratio_to("client_compute_seconds", "one-by-one")(computed["mas-2"], computed) == pytest.approx(0.75)


def test_per_task_loss_and_the_texture_edge_share():
    run = record("mas-2", 2.0)
    run.summary["tasks"]["texture_edges"]["loss"] = 0.5
    assert mas.task_loss("texture_edges")(run, {}) == 0.5
    assert mas.loss_share("texture_edges")(run, {}) == pytest.approx(25.0)


def test_affinity_measures_average_the_rounds_and_count_the_rounds_that_agree_with_the_split():
    rows = [{"round": 1, "fit": affinity_fit(block("sd", "nkt", strong=("ds", 2.0)))},
            {"round": 2, "fit": affinity_fit(block("sn", "dkt"))},
            {"round": 3, "fit": split_fit("sd", "nkt")}]
    run = RunRecord(Path("a"), {"label": "mas-2-affinity", "tasks": {t: {} for t in TASKS}}, rows)
    assert mas.measured_rounds(run, {}) == 2.0
    assert mas.strongest_pair(run, {}) == "d→s" and mas.strongest_value(run, {}) == pytest.approx(1.0)
    assert mas.split_agreement(run, {}) == pytest.approx(50.0)


def test_r0_reads_the_given_value_else_the_default_of_30_percent():
    assert mas.r0(record("m", method_params={"r0": 28}, rounds=40), {}) == 28.0
    assert mas.r0(record("m", method_params={"r0": None}, rounds=40), {}) == 12.0


def test_every_client_trains_all_clients_of_a_reference_member_only():
    def unit(method: dict[str, Any]) -> Unit:
        config = {"method": method, "clients_per_round": 4, "participation": 1.0, "rounds": 40}
        return Unit(0, method.get("label", method["name"]), yaml.safe_dump(config), Path("x"))

    local = yaml.safe_load(mas.every_client(unit({"name": "local", "label": "standalone"})).config)
    assert local["clients_per_round"] is None and local["participation"] == 1.0 and local["rounds"] == 40
    federated = unit({"name": "fedavg", "label": "all-in-one-fedavg"})
    assert mas.every_client(federated) is federated


def mas_experiments() -> list[Any]:
    return [e for e in all_experiments() if e.paper == "mas"]


@pytest.mark.parametrize("experiment", mas_experiments(), ids=lambda e: e.id)
def test_every_scale_resolves_and_smoke_runs_the_cpu_members(experiment):
    labels = {name: {u.label for u in units(scale_config(scale), Path("out"), scale.members)}
              for name, scale in experiment.scales.items()}
    assert labels["smoke"] <= labels["cpu"]  # the smoke run's members are the cpu table's (or a part of them)
    if not experiment.scales["smoke"].members:
        assert labels["smoke"] == labels["cpu"]
    assert experiment.id.startswith(("mas/fig", "mas/table"))


@pytest.mark.parametrize("experiment", [e for e in mas_experiments() if "paper" in e.scales], ids=lambda e: e.id)
def test_paper_scales_are_refused_in_one_sentence_without_taskonomy(experiment, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no data/taskonomy here
    with pytest.raises(ManytaskError, match=r"^'mas/.*' at paper scale needs data/taskonomy, which is not on this "
                                            r"machine\.$"):
        refuse_unrunnable(experiment, "paper")


@pytest.mark.slow
def test_fig5_comparison_runs_at_smoke_scale(tmp_path):
    from manytask.experiments.reproduce import reproduce

    result, path = reproduce("mas/fig5-sdnkt-comparison", "smoke", jobs=1, out=tmp_path, log=lambda _: None)
    values = result["values"]
    assert path is None and set(values) == set(mas.FIG5_SMOKE)
    for label, cells in values.items():
        (total,) = cells["total test loss"]
        assert 0 < total < 20, label
    (split,) = values["mas-2"]["split"]
    assert re.fullmatch(r"[sdnkt]+\|[sdnkt]+", split) and sorted(split.replace("|", "")) == sorted("sdnkt")
    assert ", " in values["tag-2"]["split"][0] and values["one-by-one"]["split"] == [None]
    assert values["one-by-one"]["compute ÷ one-by-one"] == [1.0]
    assert result["fingerprint"]["values"]  # every member's final test losses

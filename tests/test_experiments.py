"""The experiment registry's machinery: measures, fingerprints, tables, the page's render (byte-equal to the
committed pages, and failing after a hand edit) and `check` flagging a table whose numbers a changed default moved."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from manytask.experiments import catalogue, check, render, reproduce, results
from manytask.experiments.measures import accuracy, delta_against, fit_mean, minus_member
from manytask.experiments.spec import EXPERIMENTS, PAPERS, Column, PaperExperiment, Scale, paper, register
from manytask.report.runs import RunRecord
from tests.conftest import small_config_dict

REPOSITORY = Path(__file__).resolve().parents[1]


def record(label: str, average: float, tasks: dict[str, dict[str, float]] | None = None,
           fit: list[dict[str, float]] | None = None) -> RunRecord:
    summary = {"label": label, "average": average, "tasks": tasks or {},
               "main_metric": dict.fromkeys(tasks or {}, "accuracy"),
               "higher_is_better": dict.fromkeys(tasks or {}, True)}
    rows = [{"round": i + 1, "fit": row} for i, row in enumerate(fit or [])]
    return RunRecord(Path(label), summary, rows)


def test_measures_against_hand_computed_values() -> None:
    base = record("fedavg", 0.5, {"a": {"accuracy": 0.5}, "b": {"accuracy": 0.8}})
    other = record("fedavg+dea", 0.6, {"a": {"accuracy": 0.6}, "b": {"accuracy": 0.6}},
                   fit=[{"dea/inflation": 1.8}, {"dea/inflation": 2.0}, {"loss": 1.0}])
    runs = {"fedavg": base, "fedavg+dea": other}
    assert accuracy(other, runs) == pytest.approx(60.0)
    # Δ% = mean over tasks of (0.6 - 0.5) / 0.5 and (0.6 - 0.8) / 0.8, in %: (20 - 25) / 2
    assert delta_against("fedavg")(other, runs) == pytest.approx(-2.5)
    assert delta_against("fedavg")(base, runs) is None
    assert fit_mean("dea/inflation")(other, runs) == pytest.approx(1.9)
    assert minus_member(accuracy, "fedavg")(other, runs) == pytest.approx(10.0)


def test_cells_show_every_seed_then_mean_and_sample_std() -> None:
    # mean 2, sample std sqrt(((1-2)^2 + 0 + (3-2)^2) / 2) = 1
    assert results.cell_text([1.0, 2.0, 3.0], "{:.1f}") == "1.0 / 2.0 / 3.0; **2.0 ± 1.0**"
    assert results.cell_text([4.25], "{:.2f}") == "4.25"
    assert results.cell_text(["sd|nkt", "sdn|kt"], "{}") == r"sd\|nkt / sdn\|kt"  # a markdown cell
    assert results.cell_text([None, None], "{:.1f}") == "–"
    assert results.cell_text([20.16, "stopped at round 8"], "{:.1f}") == "20.2 / stopped at round 8"


def test_fingerprints_hold_within_float_rounding_and_not_beyond() -> None:
    runs = {0: {"m": record("m", 0.5, {"a": {"accuracy": 0.5, "loss": 1.234567}})}}
    recorded = results.fingerprint(runs)
    assert recorded["values"] == {"0/m/a": 1.234567}
    nudged = {"values": {"0/m/a": 1.234567 * (1 + 1e-6)}}  # another CPU's last bits
    moved = {"values": {"0/m/a": 1.2351}}  # a change that moves a loss by 4e-4 relative
    assert results.holds(recorded, nudged)
    assert not results.holds(recorded, moved)
    assert not results.holds(recorded, {"values": {}})


def test_table_puts_the_paper_beside_every_column_it_reports() -> None:
    experiment = PaperExperiment("x/t", "T", "s", (Column("acc", accuracy), Column("loss", accuracy)), {},
                                 paper_numbers={"a": {"acc": 79.47}, "b": {"acc": 50.0}})
    result = {"columns": ["acc", "loss"], "values": {"a": {"acc": [80.0], "loss": [1.0]}},
              "paper": experiment.paper_numbers}
    assert results.table_lines(experiment, result) == [
        "| member | acc | paper | loss |", "|---|---|---|---|",
        "| a | 80.0 | 79.47 | 1.0 |", "| b (not run) | – | 50 | – |"]


def test_committed_pages_are_the_render_of_the_result_files() -> None:
    """Nobody edits a generated table by hand: the committed pages must equal their render, byte for byte."""
    for relative, text in render.rendered().items():
        assert (REPOSITORY / relative).read_text() == text, f"{relative} differs from its render: run manytask " \
                                                            "reproduce render"


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A repository root of its own (configs/, results/, docs/) with one test experiment registered."""
    (tmp_path / "configs").mkdir()
    (tmp_path / "docs").mkdir()
    config = small_config_dict(method=["fedavg", "local"], rounds=2)
    (tmp_path / "configs" / "tiny.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)
    paper("sandbox", "A sandbox paper", "Its claim.")
    register(PaperExperiment(
        "sandbox/table1", "Table 1: two methods", "accuracy of FedAvg and local training.",
        (Column("accuracy %", accuracy),), {"smoke": Scale("configs/tiny.yaml"), "cpu": Scale("configs/tiny.yaml")},
        paper_numbers={"fedavg": {"accuracy %": 90.0}}))
    monkeypatch.setattr(catalogue, "PAPER_MODULES", ("sandbox",))
    yield tmp_path
    EXPERIMENTS.pop("sandbox/table1")
    PAPERS.pop("sandbox")


@pytest.mark.slow
def test_render_fails_after_a_hand_edit_and_check_flags_a_moved_default(sandbox: Path) -> None:
    result, path = reproduce.reproduce("sandbox/table1", "cpu", jobs=1, out=sandbox / "runs", log=lambda _: None)
    assert path == sandbox / "results" / "sandbox" / "table1" / "cpu.json"
    assert json.loads(path.read_text())["fingerprint"]["sha256"] == result["fingerprint"]["sha256"]
    render.render()
    page = sandbox / "docs" / "results.md"
    text = page.read_text()
    assert "| fedavg |" in text and "| 90 |" in text
    assert all((sandbox / p).read_text() == t for p, t in render.rendered().items())

    cell = next(line for line in text.splitlines() if line.startswith("| fedavg |"))
    page.write_text(text.replace(cell, cell.replace("| 90 |", "| 91 |")))  # a hand edit of the paper's figure
    assert render.rendered()[render.RESULTS_PAGE] != page.read_text()
    render.render()

    checked = check.check(["sandbox/table1"], 1, lambda _: None)
    assert [c.scales for c in checked] == [{"cpu": "holds"}]

    tiny = sandbox / "configs" / "tiny.yaml"  # a default of the experiment's config that moves its numbers
    tiny.write_text(tiny.read_text().replace("lr: 0.05", "lr: 0.02"))
    checked = check.check(["sandbox/table1"], 1, lambda _: None)
    assert [c.scales for c in checked] == [{"cpu": "stale"}]
    marks, fresh = check.new_marks(checked, "abcdef1234")
    assert fresh == ["sandbox/table1/cpu"]
    reproduce.write_marks(marks)
    render.render()
    assert "**Stale since abcdef1**" in page.read_text()
    shutil.rmtree(sandbox / "runs")


@pytest.mark.slow
def test_every_experiment_runs_at_smoke_and_no_table_went_stale_unmarked() -> None:
    """`manytask reproduce check` over the whole registry (what `make test-all` and CI run): every id's smoke run
    finishes, and every committed table's fingerprint holds or is marked stale on the page."""
    from manytask.experiments.commands import check_tables

    lines: list[str] = []
    assert check_tables([], 2, False, lines.append), "\n".join(lines)
    runnable = [e for e in catalogue.all_experiments() if not e.waiting_for]
    skipped = len([e for e in runnable if reproduce.missing_needs(e.scale("smoke"))])
    assert f"{len(runnable)} smoke experiments: {len(runnable) - skipped} ran, 0 failed, {skipped} skipped" in lines[-1]


def test_a_kept_run_of_other_settings_is_refused_not_measured(tmp_path: Path) -> None:
    from manytask.config import to_yaml, validate
    from manytask.errors import ManytaskError
    from manytask.experiments.runner import Unit, pending

    config = validate(small_config_dict())
    unit = Unit(0, "fedavg", to_yaml(config), tmp_path / "seed0" / "fedavg")
    unit.out.mkdir(parents=True)
    (unit.out / "config.yaml").write_text(to_yaml(config))
    assert pending([unit]) == [unit]  # the same settings: resumed, not refused
    (unit.out / "config.yaml").write_text(to_yaml(validate(small_config_dict(rounds=7))))
    with pytest.raises(ManytaskError, match="holds a run of other settings"):
        pending([unit])


def test_a_member_a_failed_round_stopped_shows_where_and_stays_in_the_fingerprint() -> None:
    experiment = PaperExperiment("x/t", "T", "s", (Column("acc", accuracy),), {})
    fine = record("fedavg", 0.5, {"a": {"accuracy": 0.5, "loss": 1.0}})
    diverged = record("sum", 0.1, {"a": {"accuracy": 0.1, "loss": 9.0}})
    diverged.summary["stopped"] = {"round": 8, "rounds_completed": 7, "reason": "diverged"}
    runs = {0: {"fedavg": fine, "sum": diverged}}
    assert results.measure(experiment, runs) == {"fedavg": {"acc": [50.0]}, "sum": {"acc": ["stopped at round 8"]}}
    assert results.fingerprint(runs)["values"] == {"0/fedavg/a": 1.0, "0/sum/stopped at round": 8.0}

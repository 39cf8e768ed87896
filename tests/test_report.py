"""Reports are built from hand-written run directories: formatting, curves, plots and errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from manytask.errors import ManytaskError
from manytask.report import comparison_rows, load_run, load_runs, markdown_table, rich_table, write_report
from manytask.report.runs import accuracy_curve, cumulative_bits, task_curves
from manytask.report.tables import human_bits, human_bytes

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TASKS = {"digit": "accuracy", "parity": "accuracy", "sum": "mse"}
CHANCE = {"digit": 0.1, "parity": 0.5, "sum": 8.25}
EVAL_ROUNDS = (2, 4)


def _eval(round_: int, tasks: dict[str, str], skill: float) -> dict[str, dict[str, float]]:
    """Per-task metrics that improve with the round."""
    out = {}
    for task, metric in tasks.items():
        value = min(0.99, skill * (0.5 + 0.1 * round_)) if metric == "accuracy" else 2.0 / round_
        out[task] = {metric: round(value, 4), "loss": round(1.0 / round_, 4)}
    return out


def _metrics_row(round_: int, tasks: dict[str, str], communicates: bool, skill: float) -> dict[str, Any]:
    """One metrics.jsonl row: clients 0-2 sampled, client 2 dropped (downloads but never uploads)."""
    up = {"0": 1000, "1": 1000} if communicates else {}
    down = {str(c): 2000 + 100 * round_ for c in range(3)} if communicates else {}
    row: dict[str, Any] = {
        "round": round_, "sampled": [0, 1, 2], "dropped": [2], "bytes_up": up, "bytes_down": down,
        "client_seconds": {"0": 0.12, "1": 0.11}, "wall_seconds": 0.4,
    }
    if round_ in EVAL_ROUNDS:
        row["eval"] = _eval(round_, tasks, skill)
        row["average"] = sum(m["accuracy"] for m in row["eval"].values() if "accuracy" in m) / 2
    return row


def _summary(method: str, tasks: dict[str, str], final: dict[str, dict[str, float]], **extra: Any) -> dict:
    """A summary.json mapping in the engine's format."""
    summary = {
        "method": method, "label": method, "method_params": {"mu": 0.0}, "benchmark": "digits-tasks",
        "seed": 0, "rounds": 5, "num_clients": 10, "backbone": "mlp(hidden=[128, 64])", "pretraining": None,
        "tasks": final, "main_metric": tasks, "chance": {t: CHANCE[t] for t in tasks},
        "average": 0.85, "normalized_average": 0.97, "reference": "centralized",
        "bytes_up": 10_000, "bytes_down": 33_000, "bits_per_task_per_round": 3_350_000.0,
        "wall_seconds": 41.25, "client_compute_seconds": 30.1, "power_watts": 15.0,
        "total_test_loss": sum(m["loss"] for m in final.values()),
        "energy_joules": 451.5, "energy_estimated": True, "energy_source": "estimate: 15 W × client compute seconds",
    }
    summary.update(extra)
    return summary


def make_run(path: Path, method: str, *, tasks: dict[str, str] = TASKS, communicates: bool = True,
             skill: float = 1.0, **extra: Any) -> Path:
    """Write a single-method run directory (config, metrics, summary) and return it."""
    path.mkdir(parents=True)
    rows = [_metrics_row(r, tasks, communicates, skill) for r in range(1, 6)]
    (path / "config.yaml").write_text(yaml.safe_dump({"method": {"name": method}, "rounds": 5}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    final = {"digit": {"accuracy": 0.912, "loss": 0.3}, "parity": {"accuracy": 0.95, "loss": 0.1234},
             "sum": {"mse": 0.01234, "loss": 0.01234}}
    summary = _summary(method, tasks, {t: final[t] for t in tasks}, **extra)
    (path / "summary.json").write_text(json.dumps(summary))
    return path


@pytest.fixture
def comparison(tmp_path: Path) -> Path:
    """fedavg (communicates), local (zero communication), centralized (lacks the 'sum' task)."""
    root = tmp_path / "cmp"
    make_run(root / "fedavg", "fedavg")
    make_run(root / "local", "local", communicates=False, skill=0.8, bytes_up=0, bytes_down=0,
             bits_per_task_per_round=0.0, normalized_average=None)
    make_run(root / "centralized", "centralized", tasks={"digit": "accuracy", "parity": "accuracy"},
             skill=1.1, normalized_average=1.0)
    runs = {name: json.loads((root / name / "summary.json").read_text()) for name in ("fedavg", "local")}
    order = ["centralized", "fedavg", "local"]
    (root / "summary.json").write_text(json.dumps({"runs": runs, "reference": "centralized", "order": order}))
    return root


def _assert_png(path: Path) -> None:
    assert path.is_file()
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 5_000


def test_single_report_has_formatted_task_table_and_plots(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", "fedavg")
    report = write_report(run)
    assert report == run / "report.md"
    text = report.read_text()
    assert "| digit | accuracy | 91.2% | 10.0% | 0.3000 |" in text
    assert "| parity | accuracy | 95.0% | 50.0% | 0.1234 |" in text
    assert "| sum | mse | 0.0123 | 8.2500 | 0.0123 |" in text
    for line in ("- pretraining: none", "- backbone: mlp(hidden=[128, 64])", "- seed: 0", "- clients: 10",
                 "- method: fedavg (mu=0.0)", "- normalized average: 97.0% of centralized",
                 "- total up: 10.0 kB", "- total down: 33.0 kB", "- bits per task per round: 3.35 Mb",
                 "- wall time: 41.2 s", "- client compute: 30.1 s", "- total test loss: 0.4357",
                 "- energy: 452 J (est.) — estimate: 15 W × client compute seconds"):
        assert line in text
    for name in ("accuracy_vs_round", "accuracy_vs_bits", "task_curves"):
        assert f"](plots/{name}.png)" in text
        _assert_png(run / "plots" / f"{name}.png")
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "metrics.jsonl", "plots", "report.md",
                                                     "summary.json"]


def test_pretraining_line_names_the_source(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", "fedavg", pretraining={"source": "mnist", "epochs": 2})
    assert "- pretraining: source=mnist, epochs=2" in write_report(run).read_text()


def test_comparison_report_table_plots_and_sections(comparison: Path) -> None:
    text = write_report(comparison).read_text()
    headers, rows = comparison_rows(load_runs([comparison]))
    assert markdown_table(headers, rows) + "\nenergy (est.) is estimated, not measured: client compute seconds × 15 W" \
        in text
    for name in ("accuracy_vs_round", "accuracy_vs_bits"):
        _assert_png(comparison / "plots" / f"{name}.png")
        assert f"](plots/{name}.png)" in text
    assert [line for line in text.splitlines() if line.startswith("### ")] == [
        "### centralized", "### fedavg", "### local"]
    assert not any((comparison / name / "report.md").exists() for name in ("fedavg", "local"))


def test_comparison_rows_values_order_and_missing(comparison: Path) -> None:
    headers, rows = comparison_rows(load_runs([comparison]))
    assert headers == ["run", "digit (acc)", "parity (acc)", "sum (mse)", "average", "normalized", "total test loss",
                       "bits/task/round", "total bytes", "wall s", "client compute s", "energy"]
    assert [row[0] for row in rows] == ["centralized", "fedavg", "local"]
    assert rows[0] == ["centralized", "91.2%", "95.0%", "–", "85.0%", "100.0%", "0.4234", "3.35 Mb", "43.0 kB",
                       "41.2", "30.1", "452 J (est.)"]
    assert rows[1][1:4] == ["91.2%", "95.0%", "0.0123"]
    assert rows[1][4] == "0.8500"  # mixed accuracy/mse average is shown raw
    assert rows[1][6] == "0.4357"  # 0.3 + 0.1234 + 0.01234
    assert rows[2][5:9] == ["–", "0.4357", "0 b", "0 B"]


def test_union_of_tasks_in_first_seen_order(comparison: Path) -> None:
    records = load_runs([comparison / "fedavg", comparison / "centralized"])
    headers, rows = comparison_rows(records[::-1])
    assert headers[1:4] == ["digit (acc)", "parity (acc)", "sum (mse)"]
    assert rows[0][3] == "–"


def test_cumulative_bits_match_hand_calculation(comparison: Path) -> None:
    record = load_run(comparison / "fedavg")
    assert accuracy_curve(record)[0] == [2, 4]
    # round r: up 2 x 1000 bytes, down 3 x (2000 + 100 r) bytes
    per_round = {r: 2 * 1000 + 3 * (2000 + 100 * r) for r in range(1, 6)}
    assert per_round[1] == 8300
    expected = [8.0 * (per_round[1] + per_round[2]), 8.0 * sum(per_round[r] for r in range(1, 5))]
    assert cumulative_bits(record) == expected == [135_200.0, 280_000.0]
    assert cumulative_bits(load_run(comparison / "local")) == [0.0, 0.0]


def test_curves_follow_eval_rounds(comparison: Path) -> None:
    record = load_run(comparison / "fedavg")
    rounds, averages = accuracy_curve(record)
    assert rounds == [2, 4]
    assert averages == pytest.approx([0.7, 0.9])
    curves = task_curves(record)
    assert list(curves) == ["digit", "parity", "sum"]
    assert curves["sum"] == ([2, 4], [1.0, 0.5])


def test_run_without_eval_rows_still_plots(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", "fedavg")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    stripped = [{k: v for k, v in row.items() if k not in ("eval", "average")} for row in rows]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(row) for row in stripped))
    write_report(run)
    for name in ("accuracy_vs_round", "accuracy_vs_bits", "task_curves"):
        _assert_png(run / "plots" / f"{name}.png")


def test_rich_table_renders(comparison: Path) -> None:
    headers, rows = comparison_rows(load_runs([comparison]))
    console = Console(record=True, width=200)
    console.print(rich_table(headers, rows, title="digits-tasks"))
    output = console.export_text()
    assert "digits-tasks" in output and "centralized" in output and "3.35 Mb" in output
    assert "452 J (est.)" in output and "energy (est.) is estimated, not measured" in output


def test_human_units() -> None:
    assert human_bits(3_350_000) == "3.35 Mb"
    assert human_bits(418_752.0) == "419 kb"
    assert human_bytes(12_400_000) == "12.4 MB"
    assert human_bytes(999_999) == "1.00 MB"
    assert human_bytes(512) == "512 B"
    assert human_bytes(None) == "–"


def test_markdown_table_escapes_pipes() -> None:
    table = markdown_table(["run", "x"], [["a|b", "1"]])
    assert table.splitlines() == ["| run | x |", "| :--- | ---: |", "| a\\|b | 1 |"]


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.mkdir(), "has no summary.json"),
        (lambda p: (p.mkdir(), (p / "summary.json").write_text("{not json")), "not valid JSON"),
        (lambda p: (p.mkdir(), (p / "summary.json").write_text("{}")), "has no metrics.jsonl"),
    ],
)
def test_bad_directory_raises(tmp_path: Path, setup: Any, message: str) -> None:
    bad = tmp_path / "bad"
    setup(bad)
    with pytest.raises(ManytaskError, match=message) as info:
        write_report(bad)
    assert str(bad) in str(info.value)


def test_comparison_with_missing_member_raises(comparison: Path) -> None:
    (comparison / "local" / "summary.json").unlink()
    with pytest.raises(ManytaskError, match="local"):
        load_runs([comparison])


def test_load_run_rejects_comparison_dir(comparison: Path) -> None:
    with pytest.raises(ManytaskError, match="comparison"):
        load_run(comparison)


def test_comparison_rows_drop_per_task_columns_beyond_the_limit(comparison: Path) -> None:
    records = load_runs([comparison])
    full, _ = comparison_rows(records)
    short, rows = comparison_rows(records, max_task_columns=1)
    assert len(full) > len(short)
    assert short == ["run", "average", "normalized", "total test loss", "bits/task/round", "total bytes", "wall s",
                     "client compute s", "energy"]
    assert all(len(row) == len(short) for row in rows)

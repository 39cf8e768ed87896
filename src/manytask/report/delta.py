"""The multi-task gain Δ% of runs against a base run (FedDEA's metric, shared/specs/feddea.md):

    Δ = (1/T) Σ_t s_t · (M_t − M_t^base) / M_t^base × 100,

with M_t a task's main metric and s_t = +1 where a higher main metric is better (accuracy, mIoU, odsF, maxF) and
−1 where lower is better (RMSE, mean angular error, L1), over the tasks both runs evaluated."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from manytask.errors import ManytaskError
from manytask.report.plots import new_figure, run_color, save_figure
from manytask.report.runs import RunRecord, is_comparison, load_run, main_metric
from manytask.report.tables import MISSING

HIGHER, LOWER = "↑", "↓"


def higher_is_better(record: RunRecord, task: str) -> bool:
    return bool((record.summary.get("higher_is_better") or {}).get(task, True))


def task_delta(record: RunRecord, base: RunRecord, task: str) -> float | None:
    """s_t · (M_t − M_t^base) / M_t^base × 100 for one task, or None where either run lacks it (or the base is 0)."""
    metric = main_metric(record, task)
    value = ((record.summary.get("tasks") or {}).get(task) or {}).get(metric)
    reference = ((base.summary.get("tasks") or {}).get(task) or {}).get(metric)
    if value is None or not reference:
        return None
    sign = 1.0 if higher_is_better(record, task) else -1.0
    return sign * (value - reference) / reference * 100


def delta_percent(record: RunRecord, base: RunRecord) -> float | None:
    """Δ% of `record` against `base`; None without common tasks."""
    gains = [d for task in record.tasks if (d := task_delta(record, base, task)) is not None]
    return sum(gains) / len(gains) if gains else None


def signed(value: float | None) -> str:
    return MISSING if value is None else f"{value + 0.0:+.2f}"  # + 0.0 turns −0.0 into 0.0


def delta_table(records: Sequence[RunRecord], base: RunRecord) -> tuple[list[str], list[list[str]]]:
    """One row per run: Δ% against `base` and each task's signed relative change; headers mark each task's
    direction (↑ higher is better, ↓ lower is better)."""
    tasks = list(dict.fromkeys(task for record in records for task in record.tasks))
    headers = ["run", "Δ%", *(f"{task} {main_metric(base, task)} "
                               f"{HIGHER if higher_is_better(base, task) else LOWER} Δ%" for task in tasks)]
    rows = [[record.label, signed(delta_percent(record, base)), *(signed(task_delta(record, base, task))
                                                                   for task in tasks)] for record in records]
    return headers, rows


def resolve_base(records: Sequence[RunRecord], name: str | Path) -> RunRecord:
    """The base run: a run directory on disk, else the member whose label or directory name is `name`."""
    if Path(name).is_dir() and not is_comparison(name):
        return load_run(name)
    found = next((r for r in records if str(name) in (r.label, r.path.name)), None)
    if found is None:
        members = ", ".join(r.label for r in records)
        raise ManytaskError(f"base run '{name}' is neither a run directory nor one of the runs compared ({members}).")
    return found


def _round_metrics(record: RunRecord) -> dict[int, dict[str, dict[str, float]]]:
    return {int(row["round"]): row["eval"] for row in record.metrics if row.get("eval")}


def delta_curve(record: RunRecord, base: RunRecord) -> tuple[list[int], list[float]]:
    """Δ% of `record` against `base` at every round both evaluated."""
    mine, theirs = _round_metrics(record), _round_metrics(base)
    rounds, deltas = [], []
    for round_ in sorted(set(mine) & set(theirs)):
        gains = []
        for task, metrics in mine[round_].items():
            metric, reference = main_metric(record, task), theirs[round_].get(task) or {}
            if metrics.get(metric) is not None and reference.get(metric):
                sign = 1.0 if higher_is_better(record, task) else -1.0
                gains.append(sign * (metrics[metric] - reference[metric]) / reference[metric] * 100)
        if gains:
            rounds.append(round_)
            deltas.append(sum(gains) / len(gains))
    return rounds, deltas


def plot_delta_vs_round(records: Sequence[RunRecord], base: RunRecord, path: str | Path) -> Path:
    """Δ% against `base` by round, one line per run: convergence of runs whose tasks have unlike metrics."""
    many = len(records) > 12
    figure = new_figure((10, 5) if many else (7, 4.5))
    axes = figure.add_subplot()
    axes.axhline(0.0, color="gray", linewidth=1, linestyle="--")
    for i, record in enumerate(records):
        if record is not base:
            rounds, deltas = delta_curve(record, base)
            axes.plot(rounds, deltas, marker="o", markersize=3, color=run_color(i, len(records)), label=record.label)
    axes.set(xlabel="round", ylabel=f"Δ% against {base.label}", title=f"Δ% against {base.label} by round")
    axes.grid(True, alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize=6 if many else "small", ncol=2 if many else 1,
                    **({"loc": "center left", "bbox_to_anchor": (1.01, 0.5)} if many else {}))
    return save_figure(figure, path)

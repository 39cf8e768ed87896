"""Inter-task affinity over rounds (the MAS paper's Fig. 7): one panel per task j with S_{i→j} of every other task
i against the round, from the `affinity/<i>/<j>` values the server logs (the clients' mean) in every measured
round; a dashed line marks the round whose affinities decided a split (MAS logs it as `split_round`)."""

from __future__ import annotations

from pathlib import Path

from manytask.methods.mas.lookahead import AFFINITY_PREFIX
from manytask.methods.mas.mas import SPLIT_ROUND
from manytask.report.plots import new_figure, run_color, save_figure
from manytask.report.runs import RunRecord

Series = dict[tuple[str, str], list[tuple[int, float]]]  # (i, j) -> [(round, S_{i→j})]


def affinity_series(record: RunRecord) -> Series:
    """S_{i→j} per measured round, in the order the run logged the pairs."""
    series: Series = {}
    for row in record.metrics:
        for key, value in (row.get("fit") or {}).items():
            if key.startswith(AFFINITY_PREFIX):
                source, _, target = key[len(AFFINITY_PREFIX):].partition("/")
                series.setdefault((source, target), []).append((int(row["round"]), float(value)))
    return series


def split_round(record: RunRecord) -> int | None:
    """The round whose affinities decided the run's split (MAS logs it with the split), if any."""
    return next((int(r["fit"][SPLIT_ROUND]) for r in record.metrics if SPLIT_ROUND in (r.get("fit") or {})), None)


def plot_affinity_over_rounds(record: RunRecord, path: str | Path) -> Path | None:
    """Panels of S_{i→j} against the round, one per target task j; None when the run measured no affinity."""
    series = affinity_series(record)
    if not series:
        return None
    tasks = list(dict.fromkeys(task for pair in series for task in pair))
    marked = split_round(record)
    columns = min(len(tasks), 3)
    rows = -(-len(tasks) // columns)
    figure = new_figure((4.2 * columns, 3.0 * rows))
    for index, target in enumerate(tasks):
        axes = figure.add_subplot(rows, columns, index + 1)
        for k, source in enumerate(tasks):
            points = series.get((source, target))
            if points:
                axes.plot(*zip(*points, strict=True), marker="o", markersize=3, color=run_color(k, len(tasks)),
                          label=source)
        axes.axhline(0.0, color="grey", linewidth=0.6)
        if marked is not None:
            axes.axvline(marked, color="black", linestyle="--", linewidth=0.8)
        axes.set_title(f"affinity onto {target}", fontsize=9)
        axes.set_xlabel("round", fontsize=8)
        axes.legend(fontsize=7)
    figure.suptitle(f"{record.label}: lookahead affinity S(i→j) per round"
                    + ("" if marked is None else f" (dashed: round {marked}, used for the split)"), fontsize=10)
    return save_figure(figure, path)

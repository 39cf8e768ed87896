"""Plots of finished runs, drawn off-screen with matplotlib's Agg backend."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from manytask.metric_names import SIMILARITY_PREFIX
from manytask.report.runs import (
    RunRecord,
    accuracy_curve,
    all_accuracy,
    cumulative_bits,
    main_metric,
    task_curves,
)
from manytask.report.tables import human_bits

NO_EVAL = "no evaluation rounds recorded"


def new_figure(size: tuple[float, float] = (7, 4.5)) -> Figure:
    """A fresh figure on an Agg canvas (never a screen, never pyplot's global state)."""
    figure = Figure(figsize=size, dpi=110)
    FigureCanvasAgg(figure)
    return figure


def new_axes(title: str) -> tuple[Figure, Axes]:
    """A fresh one-panel figure with a title and a light grid."""
    figure = new_figure()
    axes = figure.add_subplot()
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    return figure, axes


def save_figure(figure: Figure, path: str | Path) -> Path:
    """Write the figure as PNG, creating parent folders, and release it."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(out, format="png")
    figure.clear()
    return out


def _note(axes: Axes, text: str) -> None:
    """Write a note in the middle of otherwise empty axes."""
    axes.text(0.5, 0.5, text, transform=axes.transAxes, ha="center", va="center", color="gray")


def finish_legend(axes: Axes, skipped: list[str]) -> None:
    """Add a legend; runs that could not be drawn are listed in it with the reason."""
    for text in skipped:
        axes.plot([], [], " ", label=text)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize="small")


def _average_scale(records: Sequence[RunRecord]) -> tuple[float, str]:
    """Multiplier and y-axis label for average curves: percent when every task is classification."""
    if all_accuracy(records):
        return 100.0, "average accuracy (%)"
    return 1.0, "average main metric"


def plot_accuracy_vs_round(records: Sequence[RunRecord], path: str | Path) -> Path:
    """Average main metric against round, one line per run."""
    figure, axes = new_axes("Average by round")
    scale, ylabel = _average_scale(records)
    skipped = []
    for i, record in enumerate(records):
        rounds, averages = accuracy_curve(record)
        if not rounds:
            skipped.append(f"{record.label}: {NO_EVAL}")
            continue
        axes.plot(rounds, [scale * v for v in averages], marker="o", markersize=3, color=f"C{i % 10}",
                  label=record.label)
    if len(skipped) == len(records):
        _note(axes, NO_EVAL)
    axes.set(xlabel="round", ylabel=ylabel)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    finish_legend(axes, skipped)
    return save_figure(figure, path)


def _plot_bits_curve(axes: Axes, record: RunRecord, scale: float, color: str) -> str:
    """Draw one run's average against cumulative bits; return 'curve', 'flat' or 'skipped'."""
    _, averages = accuracy_curve(record)
    if not averages:
        return "skipped"
    bits = cumulative_bits(record)
    if bits[-1] <= 0:
        label = f"{record.label} (no communication)"
        axes.axhline(scale * averages[-1], linestyle="--", color=color, label=label)
        return "flat"
    points = [(b, scale * v) for b, v in zip(bits, averages, strict=True) if b > 0]
    axes.plot([b for b, _ in points], [v for _, v in points], marker="o", markersize=3, color=color, label=record.label)
    return "curve"


def _log_bits_axis(axes: Axes) -> None:
    """Log-scale x axis labelled in human units; minor ticks labelled only over a short span."""
    axes.set_xscale("log")
    human = FuncFormatter(lambda x, _: human_bits(x))
    axes.xaxis.set_major_formatter(human)
    axes.xaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
    low, high = axes.get_xlim()
    axes.xaxis.set_minor_formatter(human if high / low < 100 else NullFormatter())


def plot_accuracy_vs_bits(records: Sequence[RunRecord], path: str | Path) -> Path:
    """Average main metric against cumulative transmitted bits (log scale); silent runs as flat lines."""
    figure, axes = new_axes("Average by communication")
    scale, ylabel = _average_scale(records)
    # The same colour per run as in the accuracy-by-round plot (matplotlib's cycle, in run order).
    kinds = [_plot_bits_curve(axes, record, scale, f"C{i % 10}") for i, record in enumerate(records)]
    skipped = [f"{r.label}: {NO_EVAL}" for r, kind in zip(records, kinds, strict=True) if kind == "skipped"]
    if "curve" in kinds:
        _log_bits_axis(axes)
    elif "flat" in kinds:
        _note(axes, "no run communicated")
    else:
        _note(axes, NO_EVAL)
    axes.set(xlabel="cumulative bits transmitted (up + down)", ylabel=ylabel)
    finish_legend(axes, skipped)
    return save_figure(figure, path)


def _task_axes(axes: Axes, metrics: list[str]) -> dict[str, Axes]:
    """Map each metric to an axis: the first on the left, a second (e.g. mse) on a right twin axis."""
    mapping = {metric: axes for metric in metrics}
    if len(metrics) > 1:
        mapping[metrics[1]] = axes.twinx()
    for metric, ax in mapping.items():
        ax.set_ylabel("accuracy (%)" if metric == "accuracy" else metric)
    if len(metrics) > 2:
        axes.set_ylabel(", ".join(m for m in metrics if mapping[m] is axes))
    return mapping


def plot_task_curves(record: RunRecord, path: str | Path) -> Path:
    """Each task's main metric against round for a single run, one line per task."""
    figure, axes = new_axes(f"Per-task metric by round: {record.label}")
    curves = {task: curve for task, curve in task_curves(record).items() if curve[0]}
    metrics = list(dict.fromkeys(main_metric(record, task) for task in curves))
    targets = _task_axes(axes, metrics)
    colors = iter(f"C{i % 10}" for i in range(len(curves)))
    for task, (rounds, values) in curves.items():
        metric = main_metric(record, task)
        scale = 100.0 if metric == "accuracy" else 1.0
        style = "-" if targets[metric] is axes else ":"
        points = [scale * v for v in values]
        label = f"{task} ({metric})"
        targets[metric].plot(rounds, points, style, marker="o", markersize=3, color=next(colors), label=label)
    if not curves:
        _note(axes, NO_EVAL)
    axes.set_xlabel("round")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    _merge_legends(axes, list(targets.values()))
    return save_figure(figure, path)


def _merge_legends(axes: Axes, others: list[Axes]) -> None:
    """One legend on `axes` covering lines drawn on it and on any twin axes."""
    handles, labels = [], []
    for ax in dict.fromkeys([axes, *others]):
        more_handles, more_labels = ax.get_legend_handles_labels()
        handles += more_handles
        labels += more_labels
    if handles:
        axes.legend(handles, labels, fontsize="small")



def _similarity_pairs(row: dict[str, Any]) -> dict[str, float]:
    """The `fit` scalars `similarity/<a>/<b>` of one metrics row, keyed by `<a>/<b>`."""
    fit = row.get("fit") or {}
    return {k[len(SIMILARITY_PREFIX):]: v for k, v in fit.items() if k.startswith(SIMILARITY_PREFIX)}


def similarity_matrix(record: RunRecord) -> tuple[list[str], list[list[float]]] | None:
    """The last logged task-similarity matrix of a run (`fit` scalars `similarity/<a>/<b>`), if any."""
    for row in reversed(record.metrics):
        pairs = _similarity_pairs(row)
        if pairs:
            tasks = list(dict.fromkeys(key.split("/", 1)[0] for key in pairs))
            return tasks, [[pairs[f"{a}/{b}"] for b in tasks] for a in tasks]
    return None


def similarity_ari(record: RunRecord) -> float | None:
    """Adjusted Rand index of an average-linkage clustering of 1 − S (as many clusters as true groups) against
    the benchmark's true task groups; None when the run has no similarity matrix or no groups."""
    found, groups = similarity_matrix(record), record.summary.get("task_groups")
    if found is None or not groups:
        return None
    tasks, values = found
    distance = 1 - np.asarray(values, dtype=float)
    np.fill_diagonal(distance, 0.0)
    truth = [groups[t] for t in tasks]
    # imported here: only runs with task groups need sklearn, and importing it slows every `manytask run`
    from sklearn.cluster import AgglomerativeClustering
    from sklearn.metrics import adjusted_rand_score

    labels = AgglomerativeClustering(
        n_clusters=len(set(truth)), metric="precomputed", linkage="average"
    ).fit_predict(distance)
    return float(adjusted_rand_score(truth, labels))


def plot_similarity_heatmap(record: RunRecord, path: str | Path) -> Path | None:
    """Heatmap of the final task-similarity matrix (MaTU's Fig. 2); None when the run logged none."""
    found = similarity_matrix(record)
    if found is None:
        return None
    tasks, values = found
    figure, axes = new_axes(f"Task similarity S(t, t') at the last round: {record.label}")
    image = axes.imshow(values, cmap="viridis")
    axes.set_xticks(range(len(tasks)), tasks, rotation=45, ha="right")
    axes.set_yticks(range(len(tasks)), tasks)
    for i, row in enumerate(values):
        for j, value in enumerate(row):
            axes.text(j, i, f"{value:.2f}", ha="center", va="center", color="white", fontsize=8)
    figure.colorbar(image, ax=axes)
    return save_figure(figure, path)


def similarity_trajectory(record: RunRecord) -> tuple[list[int], dict[str, list[float]]] | None:
    """Rounds that logged a task-similarity matrix and, per round, the min, median and max of its off-diagonal
    S(t, t') (each unordered pair once, S(t, t) left out); None when no round logged one."""
    rounds: list[int] = []
    stats: dict[str, list[float]] = {"min": [], "median": [], "max": []}
    for row in record.metrics:
        pairs = {frozenset(key.split("/", 1)): float(v) for key, v in _similarity_pairs(row).items()}
        values = [value for pair, value in pairs.items() if len(pair) == 2]
        if values:
            rounds.append(int(row["round"]))
            stats["min"].append(min(values))
            stats["median"].append(float(np.median(values)))
            stats["max"].append(max(values))
    return (rounds, stats) if rounds else None


def plot_similarity_trajectory(record: RunRecord, path: str | Path) -> Path | None:
    """Min, median and max off-diagonal task similarity against round, with MaTU's neighbour threshold ε and
    the 0.5 of unrelated tasks (random signs) marked; None when the run logged no similarity."""
    found = similarity_trajectory(record)
    if found is None:
        return None
    rounds, stats = found
    figure, axes = new_axes(f"Off-diagonal task similarity per round: {record.label}")
    axes.fill_between(rounds, stats["min"], stats["max"], color="C0", alpha=0.2)
    for name, marker, width in (("max", "^", 1.0), ("median", "o", 2.0), ("min", "v", 1.0)):
        axes.plot(rounds, stats[name], marker=marker, markersize=4, linewidth=width, color="C0",
                  label=f"{name} over pairs")
    eps = (record.summary.get("method_params") or {}).get("eps")
    if isinstance(eps, int | float) and not isinstance(eps, bool):
        axes.axhline(eps, linestyle="--", color="C3", label=f"ε = {eps:g} (neighbour threshold)")
    axes.axhline(0.5, linestyle=":", color="gray", label="unrelated (random signs)")
    axes.set(xlabel="round", ylabel="S(t, t')", ylim=(0, 1))
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    finish_legend(axes, [])
    return save_figure(figure, path)


def run_color(index: int, count: int) -> Any:
    """Distinct colours for up to 20 runs (matplotlib's cycle for up to 10, as the other plots use)."""
    from matplotlib import colormaps

    return f"C{index % 10}" if count <= 10 else colormaps["tab20"](index % 20)


def plot_task_panels(records: Sequence[RunRecord], path: str | Path) -> Path:
    """One panel per task with its main metric by round, one line per run, and the legend in a panel of its own:
    the view of tasks whose metrics do not share a scale or a direction (mIoU, RMSE, degrees, odsF)."""
    tasks = list(dict.fromkeys(task for record in records for task in record.tasks))
    columns = min(3, len(tasks) + 1)
    rows = -(-(len(tasks) + 1) // columns)
    figure = new_figure((3.6 * columns, 2.8 * rows + 0.4))
    handles: list[Any] = []
    for index, task in enumerate(tasks):
        axes = figure.add_subplot(rows, columns, index + 1)
        metric = main_metric(records[0], task)
        scale = 100.0 if metric == "accuracy" else 1.0
        for i, record in enumerate(records):
            rounds, values = task_curves(record).get(task, ([], []))
            (line,) = axes.plot(rounds, [scale * v for v in values], marker="o", markersize=2,
                                color=run_color(i, len(records)), label=record.label)
            if index == 0:
                handles.append(line)
        higher = (records[0].summary.get("higher_is_better") or {}).get(task, True)
        axes.set_title(f"{task}: {metric} ({'higher' if higher else 'lower'} is better)", fontsize=9)
        axes.set_xlabel("round", fontsize=8)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.grid(True, alpha=0.3)
    legend = figure.add_subplot(rows, columns, len(tasks) + 1)
    legend.axis("off")
    legend.legend(handles=handles, loc="center", fontsize=6 if len(records) > 12 else 8,
                  ncol=2 if len(records) > 12 else 1)
    return save_figure(figure, path)

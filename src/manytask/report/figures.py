"""The figures of a report, drawn into its plots folder: each as (title, path), in the order the report shows them.
A figure appears only where the runs logged what it draws (task similarity, communities, dense predictions, masks,
affinity, plug-in sweeps, seeds)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from manytask.report.affinity import plot_affinity_over_rounds
from manytask.report.delta import plot_delta_vs_round
from manytask.report.graph import plot_client_graph
from manytask.report.masks import plot_mask_location
from manytask.report.pictures import plot_prediction_grid
from manytask.report.plots import (
    plot_accuracy_vs_bits,
    plot_accuracy_vs_round,
    plot_similarity_heatmap,
    plot_similarity_trajectory,
    plot_task_curves,
    plot_task_panels,
    similarity_ari,
)
from manytask.report.plugins import plot_plugin_sweep, plugin_sweeps
from manytask.report.runs import RunRecord, has_dense_tasks
from manytask.report.seeds import plot_seed_bands

Figures = list[tuple[str, Path]]


def run_figures(record: RunRecord, folder: Path, graph_rounds: Sequence[int] | None = None) -> Figures:
    """The figures of one run's report."""
    return [
        *_curve_plots([record], folder),
        *_similarity_plots([record], folder),
        *_graph_plots([record], folder, graph_rounds),
        *_prediction_grids([record], folder),
        *_mask_plots([record], folder),
        *_affinity_plots([record], folder),
    ]


def comparison_figures(records: list[RunRecord], folder: Path, base: RunRecord | None = None,
                       graph_rounds: Sequence[int] | None = None) -> Figures:
    """The figures of a comparison's report; Δ% curves (dense tasks) against `base`."""
    return [
        *_seed_plots(records, folder),
        *_curve_plots(records, folder, base),
        *_similarity_plots(records, folder),
        *_graph_plots(records, folder, graph_rounds),
        *_sweep_plots(records, folder),
        *_prediction_grids(records, folder),
        *_mask_plots(records, folder),
        *_affinity_plots(records, folder),
    ]


def _average_plots(records: list[RunRecord], folder: Path) -> Figures:
    """Draw the average-by-round and average-by-bits plots into `folder`; return (title, path) pairs."""
    return [
        ("Average accuracy by round", plot_accuracy_vs_round(records, folder / "accuracy_vs_round.png")),
        ("Average accuracy by bits", plot_accuracy_vs_bits(records, folder / "accuracy_vs_bits.png")),
    ]


def _curve_plots(records: list[RunRecord], folder: Path, base: RunRecord | None = None) -> Figures:
    """Curves by round. Dense tasks' metrics differ in scale and direction, so their runs get one panel per task
    and Δ% against the base instead of an average of unlike numbers."""
    if not any(has_dense_tasks(record) for record in records):
        single = [("Per-task metric by round", plot_task_curves(records[0], folder / "task_curves.png"))]
        return [*_average_plots(records, folder), *(single if len(records) == 1 else [])]
    plots = [("Per-task metric by round", plot_task_panels(records, folder / "task_panels.png"))]
    if base is not None and len(records) > 1:
        plots.append((f"Δ% against {base.label} by round",
                      plot_delta_vs_round(records, base, folder / "delta_vs_round.png")))
    return plots


def _seed_plots(records: list[RunRecord], folder: Path) -> Figures:
    path = plot_seed_bands(records, folder / "seeds_accuracy_vs_round.png")
    return [] if path is None else [("Average by round, mean ± std over seeds", path)]


def _similarity_plots(records: list[RunRecord], folder: Path) -> Figures:
    """For every run that logged task similarity (MaTU): the final heatmap, titled with the adjusted Rand index
    against the true task groups where the benchmark has them, and the off-diagonal similarity over rounds."""
    plots = []
    for record in records:
        path = plot_similarity_heatmap(record, folder / f"task_similarity_{record.label}.png")
        if path is not None:
            ari = similarity_ari(record)
            note = "" if ari is None else f"; adjusted Rand index vs the true task groups: {ari:.2f}"
            plots.append((f"Task similarity ({record.label}{note})", path))
        path = plot_similarity_trajectory(record, folder / f"task_similarity_rounds_{record.label}.png")
        if path is not None:
            plots.append((f"Task similarity over rounds ({record.label})", path))
    return plots


def _graph_plots(records: list[RunRecord], folder: Path, rounds: Sequence[int] | None) -> Figures:
    """The client-graph panels for every run that logged communities (SFMTL-Graph) at `rounds` (default: first,
    middle and last)."""
    plots = []
    for record in records:
        path = plot_client_graph(record, folder / f"client_graph_{record.label}.png", rounds)
        if path is not None:
            plots.append((f"Client graph by community ({record.label})", path))
    return plots


def _sweep_plots(records: list[RunRecord], folder: Path) -> Figures:
    """Δ% against the host by the value of a swept plug-in parameter (e.g. DEA's ρ)."""
    return [(f"{plugin}: Δ% by {param}",
             plot_plugin_sweep(plugin, param, sweep, folder / f"sweep_{plugin}_{param}.png"))
            for (plugin, param), sweep in plugin_sweeps(records).items()]


def _per_run_plots(
    records: list[RunRecord], folder: Path, name: str, plot: Callable[[RunRecord, Path], Path | None], title: str
) -> Figures:
    """One plot per run that has what `plot` draws (it returns None for the others)."""
    plots = []
    for record in records:
        path = plot(record, folder / f"{name}_{record.label}.png")
        if path is not None:
            plots.append((f"{title} ({record.label})", path))
    return plots


def _prediction_grids(records: list[RunRecord], folder: Path) -> Figures:
    """Input, truth and prediction of each dense task on a few test images, for every run that kept them."""
    return _per_run_plots(records, folder, "predictions", plot_prediction_grid,
                          "Test images: truth and prediction per task")


def _mask_plots(records: list[RunRecord], folder: Path) -> Figures:
    """Where each TaLoS run's mask lands: the fraction trainable per block and parameter."""
    return _per_run_plots(records, folder, "mask_location", plot_mask_location,
                          "Where the mask lands: fraction trainable per block and parameter")


def _affinity_plots(records: list[RunRecord], folder: Path) -> Figures:
    """Lookahead inter-task affinity over rounds, for every run that measured it (MAS, TAG)."""
    return _per_run_plots(records, folder, "affinity", plot_affinity_over_rounds,
                          "Inter-task affinity over rounds (MAS Fig. 7)")

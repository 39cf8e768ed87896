"""Where a TaLoS mask lands (the FL + TaLoS paper's Fig. 4): the fraction of each scored backbone parameter left
trainable, laid out as blocks (rows) × the parameters inside a block (columns).

The calibration round logs `trainable/<parameter>` (the clients' mean fraction) and, for the partition variant,
`kept/trainable/<parameter>` (the server's voted kept set) in its fit metrics; nothing else is needed."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from manytask.report.plots import new_figure, save_figure
from manytask.report.runs import RunRecord

PANELS = {"trainable/": "clients' masks (mean)", "kept/trainable/": "server's kept set (votes)"}
BLOCK = re.compile(r"^(?P<before>.*?)\.(?P<block>\d+)\.(?P<inside>.+)$")  # the first numbered module is the block
# Shorter column names for the parameters of a transformers ViT block
SHORT = (("attention.", "attn."), ("mlp.", ""), ("layernorm_before", "ln1"), ("layernorm_after", "ln2"),
         (".weight", ".w"), (".bias", ".b"))


def mask_fractions(record: RunRecord) -> dict[str, dict[str, float]]:
    """Per panel prefix, parameter name -> trainable fraction, from the run's calibration round (empty if none)."""
    for row in record.metrics:
        fit = row.get("fit") or {}
        panels = {prefix: {k[len(prefix):]: float(v) for k, v in fit.items()
                           if k.startswith(prefix) and not (prefix == "trainable/" and k.startswith("kept/"))}
                  for prefix in PANELS}
        if any(panels.values()):
            return {prefix: values for prefix, values in panels.items() if values}
    return {}


def block_grid(fractions: dict[str, float]) -> tuple[list[str], list[str], np.ndarray]:
    """(row labels, column labels, fractions with NaN where a block lacks a column): rows are the numbered blocks
    in order, then one row of the parameters outside any block."""
    cells: dict[tuple[str, str], float] = {}
    for name, value in fractions.items():
        match = BLOCK.match(name)
        row, column = (f"block {match['block']}", match["inside"]) if match else ("other", name)
        cells[(row, _short(column))] = value
    rows = list(dict.fromkeys(r for r, _ in cells))
    columns = list(dict.fromkeys(c for _, c in cells))
    grid = np.full((len(rows), len(columns)), np.nan)
    for (row, column), value in cells.items():
        grid[rows.index(row), columns.index(column)] = value
    return rows, columns, grid


def _short(name: str) -> str:
    for long, short in SHORT:
        name = name.replace(long, short)
    return name


def plot_mask_location(record: RunRecord, path: str | Path) -> Path | None:
    """A heatmap per panel of the trainable fraction by block and parameter; None when the run logged no mask."""
    panels = mask_fractions(record)
    if not panels:
        return None
    grids = {prefix: block_grid(values) for prefix, values in panels.items()}
    width = max(len(columns) for _, columns, _ in grids.values())
    height = max(len(rows) for rows, _, _ in grids.values())
    figure = new_figure((min(3 + 0.5 * width, 16), (1.9 + 0.4 * height) * len(grids)))
    for index, (prefix, (rows, columns, grid)) in enumerate(grids.items(), start=1):
        axes = figure.add_subplot(len(grids), 1, index)
        image = axes.imshow(grid, cmap="viridis", vmin=0.0, vmax=max(float(np.nanmax(grid)), 1e-6), aspect="auto")
        axes.set_xticks(range(len(columns)), columns, rotation=60, ha="right", fontsize=7)
        axes.set_yticks(range(len(rows)), rows, fontsize=7)
        axes.set_title(f"{record.label}: {PANELS[prefix]}", fontsize=9)
        figure.colorbar(image, ax=axes, label="fraction trainable")
    return save_figure(figure, path)

"""Comparison tables of finished runs, as markdown, rich, CSV, LaTeX or JSON tables, and the number formats they
use."""

from __future__ import annotations

import csv
import io
import json
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from rich.table import Table

from manytask.energy import DEFAULT_POWER_WATTS, ESTIMATE_MARK
from manytask.report.runs import RunRecord, all_accuracy, has_dense_tasks, main_metric, total_bytes

MISSING = "–"
ESTIMATE_NOTE = (f"energy {ESTIMATE_MARK} is estimated, not measured: client compute seconds × power_watts, the power "
                 f"stated for one busy client process (default {DEFAULT_POWER_WATTS:g} W)")


def format_metric(value: Any, metric: str) -> str:
    """Accuracy as a percentage with one decimal; any other metric (e.g. mse) with four decimals."""
    if value is None:
        return MISSING
    if metric == "accuracy":
        return f"{100 * float(value):.1f}%"
    return f"{float(value):.4f}"


def format_ratio(value: Any) -> str:
    """A fraction of a reference shown as a percentage with one decimal."""
    return MISSING if value is None else f"{100 * float(value):.1f}%"


def average_value(record: RunRecord) -> float | None:
    """A run's average main metric; None for dense task sets, whose main metrics differ in unit and direction (mIoU,
    RMSE, degrees) and compare by Δ% instead."""
    return None if has_dense_tasks(record) else record.summary.get("average")


def format_average(record: RunRecord) -> str:
    """A run's average main metric (`average_value`): a percentage over classification tasks, else a number."""
    return format_metric(average_value(record), "accuracy" if all_accuracy([record]) else "mse")


def format_seconds(value: Any) -> str:
    """Seconds with one decimal."""
    return MISSING if value is None else f"{float(value):.1f}"


def _human(value: Any, units: Sequence[str]) -> str:
    """Scale `value` by powers of 1000 into `units` and keep three significant digits."""
    if value is None:
        return MISSING
    scaled, index = float(value), 0
    while abs(scaled) >= 999.5 and index < len(units) - 1:
        scaled, index = scaled / 1000, index + 1
    if index == 0 and scaled == int(scaled):
        return f"{int(scaled)} {units[0]}"
    decimals = 0 if abs(scaled) >= 99.95 else 1 if abs(scaled) >= 9.995 else 2
    return f"{scaled:.{decimals}f} {units[index]}"


def human_bits(value: Any) -> str:
    """Bits in decimal SI units, e.g. '3.35 Mb'."""
    return _human(value, ("b", "kb", "Mb", "Gb", "Tb", "Pb"))


def human_bytes(value: Any) -> str:
    """Bytes in decimal SI units, e.g. '12.4 MB'."""
    return _human(value, ("B", "kB", "MB", "GB", "TB", "PB"))


def format_loss(value: Any) -> str:
    """A loss with four decimals."""
    return MISSING if value is None else f"{float(value):.4f}"


def total_test_loss(summary: dict[str, Any]) -> float | None:
    """Σ over tasks of the final test loss: the summary's `total_test_loss`, else summed from its per-task metrics
    (runs written before it was recorded); None if a task lacks a loss."""
    if "total_test_loss" in summary:
        return summary["total_test_loss"]
    losses = [(metrics or {}).get("loss") for metrics in (summary.get("tasks") or {}).values()]
    return None if not losses or None in losses else float(sum(losses))


def format_energy(summary: dict[str, Any]) -> str:
    """A run's energy in joules with SI prefixes, e.g. '1.20 kJ', marked '(est.)' when it was estimated."""
    joules = summary.get("energy_joules")
    if joules is None:
        return MISSING
    text = _human(joules, ("J", "kJ", "MJ", "GJ", "TJ"))
    return f"{text} {ESTIMATE_MARK}" if summary.get("energy_estimated", True) else text


def energy_footnote(records: Sequence[RunRecord]) -> str | None:
    """The line under a table whose energies include estimates, saying how they were made; None when every
    energy shown was measured."""
    estimated = [r.summary for r in records if r.summary.get("energy_joules") is not None
                 and r.summary.get("energy_estimated", True)]
    if not estimated:
        return None
    watts = sorted({float(s["power_watts"]) for s in estimated if s.get("power_watts") is not None})
    if not watts:
        return ESTIMATE_NOTE + "."
    stated = " or ".join(f"{w:g} W" for w in watts)
    return (f"energy {ESTIMATE_MARK} is estimated, not measured: client compute seconds × {stated} (power_watts, the "
            "power stated for one busy client process).")


def task_columns(records: Sequence[RunRecord]) -> list[tuple[str, str]]:
    """(task, main metric) for the union of tasks across runs, in first-seen order."""
    columns: dict[str, str] = {}
    for record in records:
        for task in record.tasks:
            columns.setdefault(task, main_metric(record, task))
    return list(columns.items())


Cell = tuple[Any, str]  # a table cell's value (a number, None where missing) and its text


def _cell(value: Any, text: Callable[[Any], str]) -> Cell:
    return value, text(value)


def _task_cell(record: RunRecord, task: str, metric: str) -> Cell:
    """A run's final value of `task`'s main metric (None where the run lacks it)."""
    return _cell(((record.summary.get("tasks") or {}).get(task) or {}).get(metric), lambda v: format_metric(v, metric))


def _row(record: RunRecord, columns: list[tuple[str, str]]) -> list[Cell]:
    """One comparison row for a run."""
    summary = record.summary
    return [
        (record.label, record.label),
        *(_task_cell(record, task, metric) for task, metric in columns),
        (average_value(record), format_average(record)),
        _cell(summary.get("normalized_average"), format_ratio),
        _cell(total_test_loss(summary), format_loss),
        _cell(summary.get("bits_per_task_per_round"), human_bits),
        _cell(total_bytes(record), human_bytes),
        _cell(summary.get("wall_seconds"), format_seconds),
        _cell(summary.get("client_compute_seconds"), format_seconds),
        (summary.get("energy_joules"), format_energy(summary)),
    ]


def _metric_header(task: str, metric: str) -> str:
    """Column header naming a task and its main metric."""
    return f"{task} ({'acc' if metric == 'accuracy' else metric})"


def comparison_rows(
    records: Sequence[RunRecord], max_task_columns: int | None = None
) -> tuple[list[str], list[list[str]]]:
    """Headers and one formatted row per run, comparing final metrics, total test loss, communication, time and
    energy (marked '(est.)' where estimated: show `energy_footnote` with the table).

    With more tasks than `max_task_columns` (e.g. one task per client), the per-task columns are left out and
    only the averages remain; the full per-task tables are in the report."""
    headers, rows = _comparison(records, max_task_columns)
    return headers, [[text for _, text in row] for row in rows]


def comparison_values(records: Sequence[RunRecord]) -> list[dict[str, Any]]:
    """The comparison table's numbers, one mapping per run from column header to value: the run's label, then
    numbers as recorded (accuracies as fractions, bytes, seconds, joules), None where missing."""
    headers, rows = _comparison(records)
    return [dict(zip(headers, (value for value, _ in row), strict=True)) for row in rows]


def _comparison(records: Sequence[RunRecord], max_task_columns: int | None = None
                ) -> tuple[list[str], list[list[Cell]]]:
    columns = task_columns(records)
    if max_task_columns is not None and len(columns) > max_task_columns:
        columns = []
    headers = [
        "run",
        *(_metric_header(task, metric) for task, metric in columns),
        "average",
        "normalized",
        "total test loss",
        "bits/task/round",
        "total bytes",
        "wall s",
        "client compute s",
        "energy",
    ]
    return headers, [_row(record, columns) for record in records]


def _markdown_cell(text: str) -> str:
    """Escape a value for a markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured markdown table: first column left-aligned, the rest right-aligned."""
    align = [":---", *["---:"] * (len(headers) - 1)]
    lines = [
        "| " + " | ".join(_markdown_cell(h) for h in headers) + " |",
        "| " + " | ".join(align) + " |",
        *("| " + " | ".join(_markdown_cell(c) for c in row) + " |" for row in rows),
    ]
    return "\n".join(lines) + "\n"


LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
                  "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    """`text` with LaTeX's special characters escaped (`97.0%` → `97.0\\%`, `lr_0` → `lr\\_0`)."""
    return "".join(LATEX_SPECIALS.get(char, char) for char in text)


def latex_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A LaTeX tabular: first column left-aligned, the rest right-aligned, every cell escaped."""
    lines = [rf"\begin{{tabular}}{{l{'r' * (len(headers) - 1)}}}", r"\hline", _latex_line(headers), r"\hline",
             *(_latex_line(row) for row in rows), r"\hline", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def _latex_line(cells: Sequence[str]) -> str:
    return " & ".join(latex_escape(str(cell)) for cell in cells) + r" \\"


def csv_table(records: Sequence[dict[str, Any]]) -> str:
    """Rows of values (`comparison_values`) as CSV with a header line; missing values are empty cells."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(records[0]) if records else [], lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return buffer.getvalue()


def json_table(records: Sequence[dict[str, Any]]) -> str:
    """Rows of values (`comparison_values`) as a JSON list of objects."""
    return json.dumps(list(records), indent=2, ensure_ascii=False) + "\n"


def comparison_text(records: Sequence[RunRecord], table_format: str) -> str:
    """The comparison table of `records` with every column as `md`, `latex` (their cells formatted), `csv` or `json`
    (their cells numbers: `comparison_values`)."""
    if table_format in ("csv", "json"):
        return (csv_table if table_format == "csv" else json_table)(comparison_values(records))
    return (markdown_table if table_format == "md" else latex_table)(*comparison_rows(records))


# the comparison's columns a narrow terminal leaves out first, in this order; then task columns, right to left. The
# first column (the run) and the averages stay.
DROP_FIRST = ("energy", "client compute s", "wall s", "total bytes", "bits/task/round", "total test loss",
              "normalized")
KEEP = ("average",)


def _column_width(header: str, cells: Sequence[str]) -> int:
    """Characters a column takes at its narrowest without cutting anything: its widest cell or header word, plus
    one space either side and a border."""
    return max([len(word) for word in header.split()] + [len(str(c)) for c in cells]) + 3


def fit_columns(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int
                ) -> tuple[list[str], list[list[str]], int]:
    """The table's columns that fit `width` characters at their narrowest, their headers wrapped to that width (so
    that rich has nothing to shrink: it would cut words), and how many were left out (`DROP_FIRST`, then other
    columns right to left; never the first column or `KEEP`)."""
    keep = list(range(len(headers)))
    widths = [_column_width(h, [row[i] for row in rows]) for i, h in enumerate(headers)]
    order = [i for name in DROP_FIRST for i, h in enumerate(headers) if h == name]
    order += [i for i in reversed(range(1, len(headers))) if i not in order and headers[i] not in KEEP]
    for index in order:
        if 1 + sum(widths[i] for i in keep) <= width:
            break
        keep.remove(index)
    shown = [textwrap.fill(headers[i], widths[i] - 3, break_long_words=False) for i in keep]
    return shown, [[row[i] for i in keep] for row in rows], len(headers) - len(keep)


def rich_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], title: str | None = None, caption: str | None = None
) -> Table:
    """The same table for the terminal, rendered by rich. A table with estimated energies gets a caption saying
    how they are made (`caption`, else a general note)."""
    if caption is None and any(str(cell).endswith(ESTIMATE_MARK) for row in rows for cell in row):
        caption = ESTIMATE_NOTE
    table = Table(title=title, caption=caption)
    for index, header in enumerate(headers):
        table.add_column(header, justify="left" if index == 0 else "right", no_wrap=index == 0)
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    return table


def task_rows(record: RunRecord) -> tuple[list[str], list[list[str]]]:
    """Headers and one row per task of a run: main metric, its final value, chance level and loss."""
    rows = []
    for task in record.tasks:
        metric = main_metric(record, task)
        final = record.summary.get("tasks", {}).get(task) or {}
        chance = (record.summary.get("chance") or {}).get(task)
        loss = final.get("loss")
        rows.append([
            task,
            metric,
            format_metric(final.get(metric), metric),
            format_metric(chance, metric),
            format_loss(loss),
        ])
    return ["task", "metric", "value", "chance", "loss"], rows

"""An experiment's result file, `results/ID/SCALE.json`: every member's value per column and seed, the paper's
numbers, the smoke fingerprint of the tree that measured it, and provenance (tree, dirty flag, machine, torch,
config hashes, wall time); and the table it prints, the paper beside us.

The fingerprint is the final test loss of every task of every member of the experiment's `smoke` run (the main
metric where a task has no loss). Two fingerprints hold when every value agrees within a relative 1e-4: the
project's CPUs (an AMD EPYC and an Intel Xeon) round float kernels differently in the last bits, which a short
smoke run keeps far below that, while any change to the code or a default that moves the numbers moves a loss by
far more."""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from manytask.experiments.runner import Unit, repository_root
from manytask.experiments.spec import Measure, PaperExperiment, Value

RELATIVE_TOLERANCE = 1e-4
Cells = dict[str, dict[str, list[Value]]]  # member label -> column -> value per seed


def results_dir() -> Path:
    return repository_root() / "results"


def result_path(experiment_id: str, scale: str) -> Path:
    return results_dir() / experiment_id / f"{scale}.json"


def measure(experiment: PaperExperiment, runs: Mapping[int, Mapping[str, Any]]) -> Cells:
    """Each member's value per column, seed by seed (seeds in order, members in the config's order)."""
    seeds = sorted(runs)
    labels = list(dict.fromkeys(label for seed in seeds for label in runs[seed]))
    cells: Cells = {}
    for label in labels:
        cells[label] = {}
        for column in experiment.columns:
            values = [_value(column.measure, runs[s][label], runs[s]) if label in runs[s] else None for s in seeds]
            cells[label][column.name] = [_plain(v) for v in values]
    return cells


def _value(measure: Measure, record: Any, runs: Mapping[str, Any]) -> Value:
    """A member's value; for a run a failed round stopped (a diverged member), where it stopped."""
    stopped = record.summary.get("stopped")
    return f"stopped at round {stopped['round']}" if stopped else measure(record, runs)


def _plain(value: Value) -> Value:
    """A JSON-safe value: a float as it is (NaN and infinities as None), a text as it is."""
    if isinstance(value, str) or value is None:
        return value
    number = float(value)
    return number if math.isfinite(number) else None


def fingerprint(runs: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """The smoke fingerprint: seed/member/task -> final test loss (else the main metric), and a hash of them
    rounded to 6 significant digits (the hash names a fingerprint; holding is judged by `holds`)."""
    values: dict[str, float] = {}
    for seed in sorted(runs):
        for label, record in runs[seed].items():
            if record.summary.get("stopped"):
                values[f"{seed}/{label}/stopped at round"] = float(record.summary["stopped"]["round"])
                continue
            for task, metrics in (record.summary.get("tasks") or {}).items():
                main = (record.summary.get("main_metric") or {}).get(task)
                value = metrics.get("loss", metrics.get(main))
                if value is not None:
                    values[f"{seed}/{label}/{task}"] = float(value)
    text = json.dumps({k: f"{v:.6g}" for k, v in values.items()}, sort_keys=True)
    return {"sha256": hashlib.sha256(text.encode()).hexdigest()[:16], "values": values}


def holds(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether two fingerprints agree: the same keys, every value within RELATIVE_TOLERANCE."""
    old, new = recorded.get("values") or {}, current.get("values") or {}
    if set(old) != set(new):
        return False
    return all(math.isclose(old[k], new[k], rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-12) for k in old)


def provenance(todo: list[Unit], wall_seconds: float) -> dict[str, Any]:
    """Where the numbers came from: the tree and whether it had uncommitted changes, the machine, the versions,
    each member's config hash (of its first seed), the wall time and the date."""
    from manytask.provenance import code_state
    from manytask.provenance import provenance as run_provenance

    state, process = code_state(), run_provenance("cpu")
    hashes = {}
    for unit in todo:
        hashes.setdefault(unit.label, hashlib.sha256(unit.config.encode()).hexdigest()[:16])
    return {"tree": state["git_commit"], "dirty": state["git_dirty"], "manytask": state["manytask"],
            "machine": process["device"].partition(" (")[2].rstrip(")") or process["platform"],
            "platform": process["platform"], "python": process["python"], "torch": process["torch"],
            "config_sha256": hashes, "wall_seconds": round(wall_seconds, 1),
            "date": datetime.now(UTC).strftime("%Y-%m-%d"), "command": process["command"]}


def write_result(experiment: PaperExperiment, scale: str, seeds: list[int], cells: Cells,
                 smoke_fingerprint: dict[str, Any], source: dict[str, Any]) -> Path:
    path = result_path(experiment.id, scale)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"id": experiment.id, "title": experiment.title, "scale": scale, "seeds": seeds,
            "columns": [column.name for column in experiment.columns], "values": cells,
            "paper": {k: dict(v) for k, v in experiment.paper_numbers.items()},
            "fingerprint": {**smoke_fingerprint, "tree": source["tree"]}, "provenance": source}
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return path


def load_result(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _one(value: Value, fmt: str) -> str:
    if value is None:
        return "–"
    return value if isinstance(value, str) else fmt.format(value)


def _number_cell(values: list[Value], fmt: str) -> str:
    numbers = [float(v) for v in values if isinstance(v, float | int)]
    if not numbers:
        return "–"
    if len(values) == 1:
        return fmt.format(numbers[0])
    shown = " / ".join(_one(v, fmt) for v in values)
    mean = statistics.fmean(numbers)
    spread = ""
    if len(numbers) > 1:  # a spread too small to show at the column's precision is shown as 0
        std = statistics.stdev(numbers)
        spread = f" ± {'0' if fmt.format(mean + std) == fmt.format(mean) else fmt.format(std).lstrip('+')}"
    return f"{shown}; **{fmt.format(mean)}{spread}**"


def cell_text(values: list[Value], fmt: str) -> str:
    """A column's cell over seeds: `a / b / c; **mean ± std**` for numbers, `a / b / c` for texts (a text's `|`
    escaped: it is a cell of a markdown table)."""
    if any(isinstance(v, str) for v in values):
        return " / ".join(_one(v, fmt).replace("|", "\\|") for v in values)
    return _number_cell(values, fmt)


def paper_text(value: Value) -> str:
    """The paper's figure as the paper gives it (its own digits)."""
    if value is None:
        return "–"
    return value if isinstance(value, str) else f"{value:g}"


def table_lines(experiment: PaperExperiment, result: Mapping[str, Any]) -> list[str]:
    """The result as a markdown table: a row per member (then the paper's rows we did not run), each column's
    value over seeds, and the paper's figure beside every column the paper reports."""
    columns = [c for c in experiment.columns if c.name in result["columns"]]
    paper = result.get("paper") or {}
    with_paper = [c for c in columns if any(c.name in row for row in paper.values())]
    header = ["member"]
    for column in columns:
        header.append(column.name + (" ↓" if column.lower_is_better else ""))
        if column in with_paper:
            header.append("paper")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    values = result["values"]
    for label in [*values, *(name for name in paper if name not in values)]:
        row = [label if label in values else f"{label} (not run)"]
        for column in columns:
            row.append(cell_text(values[label][column.name], column.fmt) if label in values else "–")
            if column in with_paper:
                row.append(paper_text((paper.get(label) or {}).get(column.name)))
        lines.append("| " + " | ".join(row) + " |")
    return lines

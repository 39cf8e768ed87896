"""Loading finished run directories and deriving curves from their recorded metrics."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from manytask.errors import ManytaskError

SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
CONFIG = "config.yaml"
ORACLE = "cross_evaluation.json"  # written by manytask cross-eval (manytask.cross_eval)


@dataclass
class RunRecord:
    """One finished single-method run as recorded on disk."""

    path: Path
    summary: dict[str, Any]
    metrics: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    seeded: bool = False  # one seed of several of the same member (`seeds:`)
    origin: str | None = None  # the directory it was given as, shown where runs compared share a label

    @property
    def group(self) -> str:
        """The member this run is one seed of: its label, else its method, else its directory name."""
        return str(self.summary.get("label") or self.summary.get("method") or self.path.name)

    @property
    def label(self) -> str:
        """The name to show for this run: its group, with `@seed<k>` when it is one seed of several, and
        ` (<origin>)` when it has one."""
        label = f"{self.group}@seed{self.summary.get('seed')}" if self.seeded else self.group
        return label if self.origin is None else f"{label} ({self.origin})"

    @property
    def tasks(self) -> list[str]:
        """Task names in summary order, then any that only appear in evaluation rows."""
        names = list(self.summary.get("tasks") or {})
        for row in self.metrics:
            names += [task for task in row.get("eval") or {} if task not in names]
        return names


def _read_json(path: Path) -> Any:
    """Parse a JSON file, turning a missing or malformed file into a ManytaskError."""
    if not path.is_file():
        raise ManytaskError(f"'{path.parent}' is not a manytask run directory: it has no {path.name}.")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManytaskError(f"cannot read '{path}': it is not valid JSON ({exc}).") from exc


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    """Parse metrics.jsonl (one JSON object per line, blank lines ignored), sorted by round."""
    if not path.is_file():
        raise ManytaskError(f"run directory '{path.parent}' has no {path.name}.")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ManytaskError(f"line {number} of '{path}' is not valid JSON ({exc}).") from exc
        if not isinstance(row, dict):
            raise ManytaskError(f"line {number} of '{path}' is not a JSON object.")
        rows.append(row)
    return sorted(rows, key=lambda row: row.get("round", 0))


def _read_config(path: Path) -> dict[str, Any]:
    """Parse config.yaml if present; a run without one gets an empty config."""
    if not path.is_file():
        return {}
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ManytaskError(f"cannot read '{path}': it is not valid YAML.") from exc
    return config if isinstance(config, dict) else {}


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    """Read a run or comparison directory's summary.json as a mapping."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ManytaskError(f"run directory '{run_dir}' does not exist.")
    summary = _read_json(run_dir / SUMMARY)
    if not isinstance(summary, dict):
        raise ManytaskError(f"'{run_dir / SUMMARY}' does not hold a JSON object.")
    return summary


def is_comparison(path: str | Path) -> bool:
    """True when `path` is a comparison directory (its summary.json lists member runs)."""
    return "runs" in read_summary(Path(path))


def load_run(path: str | Path) -> RunRecord:
    """Load a single-method run directory (summary.json, metrics.jsonl and config.yaml)."""
    run_dir = Path(path)
    summary = read_summary(run_dir)
    if "runs" in summary:
        raise ManytaskError(f"'{run_dir}' is a comparison directory; load it with load_runs instead.")
    return RunRecord(run_dir, summary, _read_metrics(run_dir / METRICS), _read_config(run_dir / CONFIG))


def comparison_order(path: str | Path) -> list[str]:
    """Member run names of a comparison directory, in the order its summary gives."""
    summary = read_summary(Path(path))
    runs = summary.get("runs")
    if not isinstance(runs, dict):
        raise ManytaskError(f"'{Path(path) / SUMMARY}' has no 'runs' mapping of member runs.")
    return list(summary.get("order") or runs)


def load_runs(paths: Iterable[str | Path]) -> list[RunRecord]:
    """Load run directories in order, expanding each comparison directory into its member runs (marked `seeded`
    when the comparison ran several seeds). Runs that share a label get the name of the directory they were given
    as (the comparison's, for a member) as their `origin`."""
    given = [(record, Path(path)) for path in paths for record in _expanded(path)]
    labels = [record.label for record, _ in given]
    for (record, path), label in zip(given, labels, strict=True):
        if labels.count(label) > 1:
            record.origin = path.resolve().name
    return [record for record, _ in given]


def _expanded(path: str | Path) -> list[RunRecord]:
    """A run directory's run, or a comparison directory's members."""
    if not is_comparison(path):
        return [load_run(path)]
    seeded = bool(read_summary(Path(path)).get("seeds"))
    records = [load_run(Path(path) / name) for name in comparison_order(path)]
    for record in records:
        record.seeded = seeded
    return records


def main_metric(record: RunRecord, task: str) -> str:
    """The main metric name of `task`: from the summary, else 'accuracy' or 'mse' if recorded."""
    declared = (record.summary.get("main_metric") or {}).get(task)
    if declared:
        return str(declared)
    seen = dict(record.summary.get("tasks", {}).get(task) or {})
    for row in record.metrics:
        seen.update((row.get("eval") or {}).get(task) or {})
    return "mse" if "mse" in seen and "accuracy" not in seen else "accuracy"


def eval_rows(record: RunRecord) -> list[dict[str, Any]]:
    """The metrics rows of rounds on which evaluation ran."""
    return [row for row in record.metrics if row.get("eval") or row.get("average") is not None]


def accuracy_curve(record: RunRecord) -> tuple[list[int], list[float]]:
    """Rounds and average main metric on evaluation rounds only."""
    rows = [row for row in eval_rows(record) if row.get("average") is not None]
    return [int(row["round"]) for row in rows], [float(row["average"]) for row in rows]


def task_curves(record: RunRecord) -> dict[str, tuple[list[int], list[float]]]:
    """For each task, the rounds it was evaluated on and its main metric there."""
    curves: dict[str, tuple[list[int], list[float]]] = {}
    for task in record.tasks:
        metric = main_metric(record, task)
        points = [
            (int(row["round"]), float(row["eval"][task][metric]))
            for row in eval_rows(record)
            if ((row.get("eval") or {}).get(task) or {}).get(metric) is not None
        ]
        curves[task] = ([r for r, _ in points], [v for _, v in points])
    return curves


def round_bytes(row: dict[str, Any]) -> int:
    """Bytes sent up plus bytes sent down, over all clients, in one round."""
    up = sum((row.get("bytes_up") or {}).values())
    down = sum((row.get("bytes_down") or {}).values())
    return int(up + down)


def cumulative_bits(record: RunRecord) -> list[float]:
    """Cumulative transmitted bits (up + down) through each evaluation round of `accuracy_curve`."""
    eval_rounds = set(accuracy_curve(record)[0])
    total, bits = 0, []
    for row in record.metrics:
        total += round_bytes(row)
        if row.get("round") in eval_rounds:
            bits.append(float(total * 8))
    return bits


def total_bytes(record: RunRecord) -> int | None:
    """Total bytes up + down from the summary, or None when it is not recorded."""
    up, down = record.summary.get("bytes_up"), record.summary.get("bytes_down")
    if up is None and down is None:
        return None
    return int((up or 0) + (down or 0))


def all_accuracy(records: Iterable[RunRecord]) -> bool:
    """True when every task of every run has accuracy as its main metric."""
    return all(main_metric(record, task) == "accuracy" for record in records for task in record.tasks)


def has_dense_tasks(record: RunRecord) -> bool:
    """Whether any task of the run is dense (its kinds are in the summary)."""
    kinds = (record.summary.get("task_kinds") or {}).values()
    return any(kind not in ("classification", "regression") for kind in kinds)


def read_oracle(run_dir: str | Path) -> dict[str, Any] | None:
    """A run's cross-evaluation oracle (manytask cross-eval), or None when it was never computed."""
    path = Path(run_dir) / ORACLE
    return _read_json(path) if path.is_file() else None

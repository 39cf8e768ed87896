"""FL + TaLoS's table (paper Table 4) from finished comparison directories: final test accuracy per method and data
split, the last accuracy evaluated in the head-only phase (where the paper starts TaLoS), the mean upload per
training round and the mean client seconds of the calibration round.

    .venv/bin/python scripts/talos_table.py IID=runs/iid "N_c=50=runs/nc50" ... [--centralized runs/central]

Each argument is COLUMN=DIRECTORY (the column title may itself hold '='; the directory follows the last one)."""

from __future__ import annotations

import argparse
from pathlib import Path

from manytask.report.runs import RunRecord, eval_rows, load_runs
from manytask.report.tables import markdown_table

ORDER = ["centralized-head-only", "centralized-talos", "head-only", "talos", "talos-partition", "talos-oneshot"]


def phase_rounds(record: RunRecord, phase: int) -> list[dict]:
    """The metric rows of one phase (`fit.phase`), in round order."""
    return [row for row in record.metrics if (row.get("fit") or {}).get("phase") == phase]


def last_evaluation(record: RunRecord, round_: int) -> tuple[int, float] | None:
    """(round, average) of the last evaluation at or before `round_`."""
    rows = [row for row in eval_rows(record) if row["round"] <= round_]
    return (rows[-1]["round"], rows[-1]["average"]) if rows else None


def head_phase_end(record: RunRecord) -> int | None:
    head = phase_rounds(record, 0)
    return head[-1]["round"] if head and phase_rounds(record, 1) else None


def upload_per_round(record: RunRecord, phase: int | None) -> float:
    rows = record.metrics if phase is None else phase_rounds(record, phase)
    return sum(sum(row["bytes_up"].values()) for row in rows) / max(len(rows), 1)


def calibration_seconds(record: RunRecord) -> float | None:
    rows = phase_rounds(record, 1)
    seconds = [s for row in rows for s in row["client_seconds"].values()]
    return sum(seconds) / len(seconds) if seconds else None


def cell(record: RunRecord) -> str:
    end = head_phase_end(record)
    before = None if end is None else last_evaluation(record, end)
    text = f"{record.summary['average']:.1%}"
    return text if before is None else f"{text} (head-only phase: {before[1]:.1%} at round {before[0]})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("columns", nargs="+", help="COLUMN=DIRECTORY")
    parser.add_argument("--centralized", help="the centralized references' comparison directory")
    args = parser.parse_args()
    columns = {title: {r.label: r for r in load_runs([Path(path)])}
               for title, path in (item.rsplit("=", 1) for item in args.columns)}
    central = {} if args.centralized is None else {r.label: r for r in load_runs([Path(args.centralized)])}
    rows = []
    for label in ORDER:
        if label in central:
            rows.append([label, cell(central[label]), *["–"] * (len(columns) - 1)])
        elif any(label in runs for runs in columns.values()):
            rows.append([label, *(cell(runs[label]) if label in runs else "–" for runs in columns.values())])
    print(markdown_table(["method", *columns], rows))
    first = next(iter(columns.values()))
    print("\nupload per round in the training phase (mean over rounds, all sampled clients):")
    for label in ("head-only", "talos", "talos-partition", "talos-oneshot"):
        if label in first:
            phase = None if label == "head-only" else 2
            print(f"  {label}: {upload_per_round(first[label], phase) / 1e3:.1f} kB")
    for label in ("talos", "talos-partition", "talos-oneshot", "centralized-talos"):
        record = first.get(label) or central.get(label)
        if record is not None and calibration_seconds(record) is not None:
            print(f"  calibration round, mean client seconds ({label}): {calibration_seconds(record):.2f} s")


if __name__ == "__main__":
    main()

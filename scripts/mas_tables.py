"""The MAS experiments' tables (docs/mas.md) from finished comparison run directories.

    python scripts/mas_tables.py comparison RUN_DIR      # total test loss, cost and split of every method
    python scripts/mas_tables.py splits RUN_DIR [--mas COMPARISON_RUN_DIR]
                                                         # every split from scratch and from the all-in-one,
                                                         # ranked; where MAS-2's own split falls
    python scripts/mas_tables.py sweep RUN_DIR           # the R0 sweep
    python scripts/mas_tables.py cost RUN_DIR --png PATH # total test loss against client compute seconds

Total test loss = Σ over tasks of the final test loss (the MAS paper's figure of merit, lower is better). Energy is
what summary.json says: measured where a meter was readable, else the stated-power estimate, marked "(est.)".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from manytask.errors import ManytaskError
from manytask.report.runs import comparison_order

LETTERS = {"semseg": "s", "depth": "d", "normals": "n", "keypoints": "k", "texture_edges": "t",
           "occlusion_edges": "e", "reshading": "r", "curvature": "c", "autoencoding": "a"}


def members(run_dir: Path) -> dict[str, tuple[dict, list[dict]]]:
    """label -> (summary, metrics rows) of every finished member, in the comparison's order."""
    found = {}
    try:
        order = comparison_order(run_dir)
    except ManytaskError:  # a comparison still running: its finished members, by name
        order = sorted(p.name for p in run_dir.iterdir() if p.is_dir())
    for child in (run_dir / label for label in order):
        if not (child / "summary.json").is_file():
            continue
        rows = [json.loads(line) for line in (child / "metrics.jsonl").read_text().splitlines() if line.strip()]
        found[child.name] = (json.loads((child / "summary.json").read_text()), rows)
    return found


def split_of(rows: list[dict], tasks: list[str]) -> str:
    """The split a staged run logged (`split/<task>` = group id), as letters, e.g. 'sd|nkt'; '' if none."""
    logged = next((r["fit"] for r in rows if any(k.startswith("split/") for k in r.get("fit", {}))), None)
    if logged is None:
        return ""
    groups: dict[int, str] = {}
    for task in tasks:
        groups.setdefault(int(logged[f"split/{task}"]), "")
        groups[int(logged[f"split/{task}"])] += LETTERS.get(task, task)
    return "|".join(groups[g] for g in sorted(groups))


def energy(summary: dict) -> str:
    joules = summary.get("energy_joules")
    if joules is None:
        return "–"
    return f"{joules / 1000:.2f} kJ" + (" (est.)" if summary.get("energy_estimated") else "")


def comparison(run_dir: Path) -> str:
    runs = members(run_dir)
    tasks = list(next(iter(runs.values()))[0]["tasks"])
    header = ["method", "rounds", "total test loss", *(f"{LETTERS.get(t, t)} loss" for t in tasks),
              "client compute s", "wall s", "energy", "split"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, (summary, rows) in runs.items():
        losses = [summary["tasks"][t]["loss"] for t in tasks]
        lines.append("| " + " | ".join([
            label, str(summary.get("engine_rounds", summary["rounds"])), f"{summary['total_test_loss']:.4f}",
            *(f"{v:.4f}" for v in losses), f"{summary['client_compute_seconds']:.0f}",
            f"{summary['wall_seconds']:.0f}", energy(summary), split_of(rows, tasks),
        ]) + " |")
    source = next(iter(runs.values()))[0].get("energy_source")
    return "\n".join(lines) + f"\n\nenergy: {source}\n"


def splits(run_dir: Path, mas_dir: Path | None) -> str:
    runs = members(run_dir)
    by_start: dict[str, dict[str, float]] = {}
    for label, (summary, _) in runs.items():
        start, _, split = label.partition("-")
        if label.startswith("all-in-one-"):
            start, split = "all-in-one", label[len("all-in-one-"):]
        by_start.setdefault(start, {})[split.replace("-", "|")] = summary["total_test_loss"]
    chosen = ""
    if mas_dir is not None:
        summary, rows = members(mas_dir)["mas-2"]
        chosen = split_of(rows, list(summary["tasks"]))
    lines = ["| start | best split (loss) | worst split (loss) | MAS-2's split | its loss | its rank |",
             "|---|---|---|---|---|---|"]
    for start, losses in by_start.items():
        ranked = sorted(losses.items(), key=lambda item: item[1])
        mine = next((s for s in losses if set(s.split("|")) == set(chosen.split("|"))), None)
        rank = next((i + 1 for i, (s, _) in enumerate(ranked) if s == mine), None)
        ours = f"{mine} | {losses[mine]:.4f} | {rank} of {len(ranked)}" if mine else "– | – | –"
        lines.append(f"| {start} | {ranked[0][0]} ({ranked[0][1]:.4f}) | {ranked[-1][0]} ({ranked[-1][1]:.4f}) | "
                     f"{ours} |")
    full = ["", "| split | " + " | ".join(by_start) + " |", "|---|" + "---|" * len(by_start)]
    for split in next(iter(by_start.values())):
        full.append(f"| {split} | " + " | ".join(f"{by_start[s].get(split, float('nan')):.4f}" for s in by_start)
                    + " |")
    return "\n".join(lines + full) + "\n"


def sweep(run_dir: Path) -> str:
    lines = ["| R0 | rounds | total test loss | split | client compute s |", "|---|---|---|---|---|"]
    for summary, rows in sorted(members(run_dir).values(), key=lambda run: run[0]["method_params"]["r0"]):
        lines.append(f"| {summary['method_params']['r0']} | {summary['engine_rounds']} | "
                     f"{summary['total_test_loss']:.4f} | {split_of(rows, list(summary['tasks']))} | "
                     f"{summary['client_compute_seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def cost_plot(run_dir: Path, path: Path) -> Path:
    """Each method's total test loss against its client compute seconds (lower left is better)."""
    from manytask.report.plots import new_figure, run_color, save_figure

    runs = members(run_dir)
    figure = new_figure((7, 4.5))
    axes = figure.add_subplot(1, 1, 1)
    for index, (label, (summary, _)) in enumerate(runs.items()):
        x, y = summary["client_compute_seconds"], summary["total_test_loss"]
        axes.scatter([x], [y], color=run_color(index, len(runs)), s=40)
        axes.annotate(label, (x, y), textcoords="offset points", xytext=(5, 4 if index % 2 else -11), fontsize=8)
    estimated = any(summary.get("energy_estimated") for summary, _ in runs.values())
    axes.set_xlabel("client compute seconds (summed over all fits)" + (", energy ∝ (est.)" if estimated else ""))
    axes.set_ylabel("total test loss over tasks (lower is better)")
    axes.set_title(f"{run_dir.name}: quality against cost", fontsize=10)
    return save_figure(figure, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", choices=["comparison", "splits", "sweep", "cost"])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--mas", type=Path, help="the sdnkt comparison run (for MAS-2's own split)")
    parser.add_argument("--png", type=Path, default=Path("cost.png"), help="where the cost plot goes")
    args = parser.parse_args()
    if args.table == "comparison":
        print(comparison(args.run_dir))
    elif args.table == "cost":
        print(cost_plot(args.run_dir, args.png))
    elif args.table == "splits":
        print(splits(args.run_dir, args.mas))
    else:
        print(sweep(args.run_dir))


if __name__ == "__main__":
    main()

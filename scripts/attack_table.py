"""Which aggregator survives which attack: the default workload under every `adversaries:` attack, FedAvg alone (its
divergence guard on and off) and under each robust plug-in (with the guard off, so each column is one defense).
Prints a markdown table of final average accuracy (and how many replies the server refused) and writes the raw
figures as JSON.

    .venv/bin/python scripts/attack_table.py --out runs/attacks [--rounds 20] [--fraction 0.2]

Every run is a fresh comparison directory under --out; an existing one is resumed, so an interrupted table goes on.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from manytask.config import validate
from manytask.config_sources import default_config
from manytask.engine.loop import RoundFailed
from manytask.launch import resume, run_config


def members(per_task: bool) -> list[dict[str, Any]]:
    """FedAvg (joint by default: one update per client, so Krum chooses among clients; `per_task` is the default
    job's FedAvg) alone, and each plug-in alone: without the host's divergence guard, so each column is one
    defense."""
    host = {"name": "fedavg", "per_task": per_task}
    unguarded = {**host, "guard": 0}
    return [
        {**host, "label": "fedavg"},
        {**unguarded, "label": "fedavg-unguarded"},
        {**unguarded, "plugin": "clip", "label": "clip"},
        {**unguarded, "plugin": "median", "label": "median"},
        {**unguarded, "plugin": {"name": "trimmed-mean", "trim": 0.2}, "label": "trimmed-mean"},  # β ≥ attackers
        {**unguarded, "plugin": {"name": "krum", "byzantine": 2, "select": 6}, "label": "multi-krum"},
    ]

ATTACKS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "garbage": {"attack": "garbage"},
    "truncate": {"attack": "truncate"},
    "wrong-shape": {"attack": "wrong-shape"},
    "missing-count": {"attack": "missing-count"},
    "extra-array": {"attack": "extra-array"},
    "inflate-count ×1e6": {"attack": "inflate-count", "factor": 1e6},
    "scale ×1e3": {"attack": "scale", "factor": 1e3},
    "scale ×10": {"attack": "scale", "factor": 10},
    "sign-flip": {"attack": "sign-flip"},
    "noise σ=0.1": {"attack": "noise", "std": 0.1},
}


def run_attack(
    name: str, attack: dict[str, Any] | None, entries: list[dict[str, Any]], out: Path, rounds: int, fraction: float
) -> dict[str, Any]:
    data = {**default_config(), "name": f"attack-{_slug(name)}", "method": entries, "rounds": rounds,
            "eval_every": rounds, "reference": None}
    if attack is not None:
        data["adversaries"] = {"fraction": fraction, **attack}
    directory = out / _slug(name)
    try:
        resume(directory) if directory.exists() else run_config(validate(data), directory)
    except RoundFailed as failure:  # a member whose round failed: its summary is that of the rounds before
        print(f"{name}: {failure}", flush=True)
    return {m["label"]: _figures(directory / m["label"]) for m in entries}


def _figures(run_dir: Path) -> dict[str, Any]:
    summary = json.loads((run_dir / "summary.json").read_text())
    stopped = summary.get("stopped")
    return {"average": summary["average"], "refused": _refused(run_dir),
            "stopped_round": None if stopped is None else stopped["round"]}


def _refused(run_dir: Path) -> int:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return sum(len(row["failures"]) for row in rows)


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in name).strip("-").lower()


def _cell(figures: dict[str, Any]) -> str:
    stopped = "" if figures["stopped_round"] is None else f", failed in round {figures['stopped_round']}"
    return f"{100 * figures['average']:.1f} ({figures['refused']}{stopped})"


def table(results: dict[str, dict[str, Any]]) -> str:
    labels = list(next(iter(results.values())))
    lines = ["| attack | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for attack, members in results.items():
        cells = [_cell(members[label]) for label in labels]
        lines.append(f"| {attack} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/attacks"))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--fraction", type=float, default=0.2, help="share of clients that attack")
    parser.add_argument("--only", nargs="*", help="attacks to run (default: all)")
    parser.add_argument("--per-task", action="store_true", help="FedAvg as the default job runs it (per_task)")
    args = parser.parse_args()
    entries = members(args.per_task)
    results = {}
    for name, attack in ATTACKS.items():
        if args.only and name not in args.only:
            continue
        began = time.perf_counter()
        results[name] = run_attack(name, attack, entries, args.out, args.rounds, args.fraction)
        print(f"{name}: {time.perf_counter() - began:.0f} s", flush=True)
    print("\nfinal average accuracy % (replies refused over the run)\n")
    print(table(results))
    (args.out / "attacks.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

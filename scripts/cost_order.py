"""Costs do not depend on a member's place in a comparison: run a two-member comparison in both orders, each in a
fresh process as a user would, alternately `--repeats` times, and print each member's median cost in each order.

The orders alternate, so a drift of the machine between processes falls on both; the ratio of the two members'
costs within one process is printed too (order-independent costs give the same ratio both ways).

    python scripts/cost_order.py [CONFIG] [--methods fedavg,fedprox] [--rounds 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

COSTS = ("client_compute_seconds", "energy_joules", "wall_seconds")


def run(config: str, methods: list[str], rounds: int, out: Path) -> tuple[dict[str, dict], float | None]:
    command = [sys.executable, "-m", "manytask", "run", config, f"method=[{','.join(methods)}]", f"rounds={rounds}",
               "--quiet", "--out", str(out)]
    subprocess.run(command, check=True, capture_output=True)
    summary = json.loads((out / "summary.json").read_text())
    return {label: {k: s[k] for k in COSTS} for label, s in summary["runs"].items()}, summary.get("warmup_seconds")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="configs/fedprox_synthetic.yaml")
    parser.add_argument("--methods", default="fedavg,fedprox")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    first, second = args.methods.split(",")
    orders = {"forward": [first, second], "backward": [second, first]}
    runs: dict[str, list[dict[str, dict]]] = {name: [] for name in orders}
    warmups = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name, methods in orders.items():
                costs, warmup = run(args.config, methods, args.rounds, Path(tmp) / f"{name}{repeat}")
                runs[name].append(costs)
                warmups.append(warmup)
    print(f"| member | cost | median, {first} first | median, {second} first | larger / smaller |")
    print("| --- | --- | --- | --- | --- |")
    for member in (first, second):
        for cost in COSTS:
            a, b = (statistics.median(r[member][cost] for r in runs[name]) for name in orders)
            print(f"| {member} | {cost} | {a:.4g} | {b:.4g} | {max(a, b) / min(a, b):.3f} |")
    for cost in COSTS:
        forward, backward = (statistics.median(r[second][cost] / r[first][cost] for r in runs[name])
                             for name in orders)
        print(f"{cost}: {second} / {first} within a process, {forward:.3f} with {first} first and {backward:.3f} "
              f"with {second} first")
    shown = ", ".join(f"{w:.2f}" for w in warmups if w is not None)
    print(f"warm-up seconds, in no member's costs: {shown or 'none'} ({args.repeats} x 2 processes)")


if __name__ == "__main__":
    main()

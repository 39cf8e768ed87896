"""The bit-identity harness: runs a fixed set of shipped configs with `execution: sequential` (few rounds) and writes
every member's metric rows, timings left out, to one JSON file. Run it on two trees and compare the files: a change
that keeps sequential execution bit-identical leaves them equal.

    python scripts/bit_identity.py OUT.json            # this tree
    python scripts/bit_identity.py --compare A.json B.json

The set: the default job; the digits hosts × plug-ins grid (8 hosts × 4 plug-ins); the nyud-like hosts × plug-ins
grid (dense, five hosts); the all-in-one hosts of the MAS comparison on sdnkt; the adaptive server rules; the
personalized methods of the SFMTL comparison (pFedMe, SFMTL-Graph, FedU, Local); MAS's staged methods (MAS-2,
one-by-one, TAG, HOA). Every run uses 2 rounds (the staged ones: R = 4, through every stage) and evaluates at the
last."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from manytask.config import resolve
from manytask.launch import run_config

TIMING = {"seconds", "wall_s", "client_s", "compute_s", "energy_j", "time"}
RUNS: dict[str, tuple[str | None, list[str]]] = {  # name -> (config, overrides)
    "default": (None, ["rounds=2"]),
    "digits-hosts-plugins": ("configs/feddea/digits_hosts_plugins.yaml", ["rounds=2"]),
    "nyud-hosts-plugins": ("configs/feddea/scenes_nyud_hosts_plugins.yaml",
                           ["rounds=2", "method=[fedavg,fedprox,feddyn,fedbn,fedacg]"]),
    "sdnkt-all-in-one": ("configs/mas/sdnkt_comparison.yaml", ["rounds=2", "method=[fedavg,fedprox,gradnorm]",
                                                               "benchmark.train_per_task=160"]),
    "adaptive": ("configs/feddea/digits_hosts_plugins.yaml",
                 ["rounds=2", "method=[fedadam,fedyogi,fedadagrad]", "plugins=null"]),
    "personalized": ("configs/sfmtl/label_skew_digits.yaml",
                     ["rounds=2", "method=[{name: pfedme, lam: 1, train: {lr: 0.5}}, sfmtl-graph, fedu, local]"]),
    "mas-stages": ("configs/mas/sdnkt_comparison.yaml",
                   ["rounds=4", "benchmark.train_per_task=160", "eval_every=2",
                    "method=[{name: mas, groups: 2, r0: 2, affinity_round: 1}, one-by-one, "
                    "{name: tag, groups: 2, affinity_rounds: 2}, {name: hoa, groups: 2, probe_rounds: 4}]"]),
}


def _without_timing(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_timing(v) for k, v in value.items() if not any(t in k for t in TIMING)}
    if isinstance(value, list):
        return [_without_timing(v) for v in value]
    return value


def run_all(names: list[str]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for name in names:
        path, overrides = RUNS[name]
        config = resolve(path, [*overrides, "execution=sequential"])
        with tempfile.TemporaryDirectory() as folder:
            run_config(config, Path(folder))
            for metrics in sorted(Path(folder).rglob("metrics.jsonl")):
                member = f"{name}/{metrics.parent.relative_to(folder)}"
                rows[member] = [_without_timing(json.loads(line)) for line in metrics.read_text().splitlines()]
                print(f"{member}: {len(rows[member])} rows", file=sys.stderr)
    return rows


def compare(a: Path, b: Path) -> int:
    first, second = json.loads(a.read_text()), json.loads(b.read_text())
    differ = [m for m in sorted(set(first) | set(second)) if first.get(m) != second.get(m)]
    print(f"{len(first)} and {len(second)} runs; {len(differ)} differ" + (f": {', '.join(differ)}" if differ else ""))
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path)
    parser.add_argument("--compare", nargs=2, type=Path)
    parser.add_argument("--only", action="append", choices=list(RUNS))
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    args.out.write_text(json.dumps(run_all(args.only or list(RUNS)), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

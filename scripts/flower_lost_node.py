"""A loopback deployment (3 SuperNodes, FedAvg) in which SuperNode 2 dies after round 3, during the run: how long
each round takes before and after (issue 17's "rounds after the kill take no longer than healthy ones plus one
timeout in total"). The kill happens at a drill's hold point after round 3 (`engine/flower/drill.py`), not at a time.

    .venv/bin/python scripts/flower_lost_node.py OUT [--rounds 7] [--timeout 40] [--freeze]

--freeze stops the node's flower-superexec with SIGSTOP instead: the SuperNode keeps heartbeating but never
answers, the case Flower itself never reports as offline. Prints per-round seconds, failures and the bound."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from manytask.config import validate
from manytask.engine.flower.cluster import LocalCluster
from manytask.engine.flower.deployment import run_drill
from manytask.engine.flower.drill import Drill

# -ww: ps otherwise cuts `args` at $COLUMNS where that is set (a CI runner may set it)
PS_CHILDREN = ["ps", "-ww", "-o", "pid=,args=", "--ppid"]

KILLED, AFTER = 2, 3


def config(address: str, rounds: int, timeout: float) -> dict[str, Any]:
    return {
        "name": "lost-node", "method": "fedavg", "rounds": rounds, "seed": 7, "eval_every": 2, "engine": "flower",
        "benchmark": {"name": "digits-tasks", "tasks": ["digit", "parity", "rotated"]},
        "federation": {"num_clients": 3, "tasks": {"kind": "dirichlet", "zeta": 1.0}, "samples": {"kind": "iid"}},
        "model": {"backbone": "mlp", "hidden": [32]}, "train": {"lr": 0.05, "local_steps": 5, "batch_size": 32},
        "flower": {"superlink": address, "round_timeout": timeout},
    }


def stop_node(cluster: LocalCluster, freeze: bool) -> bool:
    """Kill SuperNode `KILLED` (or freeze its flower-superexec); the run goes on."""
    if not freeze:
        cluster.kill_node(KILLED)
        return True
    node = cluster.supernodes[KILLED]
    assert node is not None
    children = subprocess.run([*PS_CHILDREN, str(node.pid)], capture_output=True, text=True)
    for line in children.stdout.splitlines():
        if "flower-superexec" in line:
            os.kill(int(line.split()[0]), signal.SIGSTOP)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=40.0, help="flower.round_timeout")
    parser.add_argument("--freeze", action="store_true", help="SIGSTOP the node's superexec instead of a SIGKILL")
    args = parser.parse_args()
    began = time.monotonic()
    with LocalCluster(3, args.out / "cluster") as cluster:
        drill = Drill({f"after-{AFTER}": lambda: stop_node(cluster, args.freeze)})
        run_drill(validate(config(cluster.address, args.rounds, args.timeout)), args.out / "run", drill)
    rows = [json.loads(line) for line in (args.out / "run" / "metrics.jsonl").read_text().splitlines()]
    seconds = [r["wall_seconds"] for r in rows]
    healthy = sum(seconds[:AFTER]) / AFTER
    after = sum(seconds[AFTER:])
    bound = healthy * (len(rows) - AFTER) + args.timeout
    for row in rows:
        print(f"round {row['round']}: {row['wall_seconds']:.1f} s, failures {row['failures']}")
    print(f"seconds per round: {[round(s, 1) for s in seconds]}")
    print(f"after the kill: {after:.1f} s; healthy mean × rounds + one timeout: {bound:.1f} s "
          f"({'within' if after <= bound else 'OVER'}); whole run {time.monotonic() - began:.0f} s")
    failed = json.loads((args.out / "run" / "summary.json").read_text())["failed_clients"]
    print(f"failed_clients: {failed}")


if __name__ == "__main__":
    main()

"""Time the same run on the local engine and on Flower's simulation engine (the performance baseline).

    unshare -n bash -c 'ip link set lo up && .venv/bin/python scripts/bench_engines.py --clients 30 --rounds 10'

(Ray listens on every interface: the private network namespace keeps it on loopback.) Prints per-round and total
seconds per engine and checks that both engines reached the same final metrics."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from manytask.config import validate
from manytask.launch import run_config


def bench_config(clients: int, rounds: int, engine: str) -> dict:
    return {
        "name": f"bench-{engine}",
        "method": "fedavg",
        "benchmark": {"name": "digits-tasks", "tasks": ["digit", "parity", "rotated", "mod3"]},
        "federation": {"num_clients": clients, "tasks": {"kind": "dirichlet", "zeta": 0.5}, "samples": {"kind": "iid"}},
        "model": {"backbone": "mlp", "hidden": [64]},
        "train": {"lr": 0.05, "local_epochs": 1, "batch_size": 32},
        "rounds": rounds,
        "eval_every": rounds,
        "engine": engine,
    }


def time_engine(engine: str, clients: int, rounds: int, workdir: Path) -> dict:
    began = time.perf_counter()
    summary = run_config(validate(bench_config(clients, rounds, engine)), workdir / engine)["fedavg"]
    total = time.perf_counter() - began
    rows = [json.loads(line) for line in (workdir / engine / "metrics.jsonl").read_text().splitlines()]
    per_round = [r["wall_seconds"] for r in rows]
    return {
        "engine": engine, "total_s": total, "first_round_s": per_round[0],
        "median_round_s": statistics.median(per_round), "client_compute_s": summary["client_compute_seconds"],
        "tasks": summary["tasks"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--engines", nargs="+", default=["local", "flower-sim"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = [time_engine(e, args.clients, args.rounds, Path(tmp)) for e in args.engines]
    print(f"FedAvg, {args.clients} clients, {args.rounds} rounds (digits-tasks, 4 tasks)")
    print(f"{'engine':<12}{'total s':>10}{'first round s':>16}{'median round s':>17}{'client compute s':>19}")
    for r in results:
        print(f"{r['engine']:<12}{r['total_s']:>10.2f}{r['first_round_s']:>16.2f}{r['median_round_s']:>17.3f}"
              f"{r['client_compute_s']:>19.2f}")
    same = all(r["tasks"] == results[0]["tasks"] for r in results)
    print(f"same final metrics on every engine: {same}")


if __name__ == "__main__":
    main()

"""Upload bits per client per round as clients hold more tasks: MaTU (one vector + bit masks) vs FedAvg (one
adapter copy per task). The paper's scaling ablation, on the synthetic benchmark.

    .venv/bin/python scripts/matu_scaling.py --tasks-per-client 1 2 4 8
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from manytask.config import validate
from manytask.launch import run_config


def config(tasks_per_client: int, num_tasks: int) -> dict:
    names = [f"task{i}" for i in range(num_tasks)]
    groups = [names[i : i + tasks_per_client] for i in range(0, num_tasks, tasks_per_client)]
    return {
        "name": f"scaling-{tasks_per_client}",
        "method": ["matu", {"name": "fedavg", "per_task": True}],
        "benchmark": {"name": "synthetic", "num_tasks": num_tasks, "num_groups": 2, "feature_spread": 0.9,
                      "pretrain_samples": 2000, "train_per_task": 200},
        "federation": {"num_clients": len(groups), "tasks": {"kind": "groups", "groups": groups}},
        "model": {"backbone": "mlp", "hidden": [64, 64], "adapter": {"rank": 4, "alpha": 8}, "pretrained": True},
        "rounds": 1,
        "reference": None,
    }


def upload_bits_per_client(run_dir: Path) -> float:
    row = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    return 8 * sum(row["bytes_up"].values()) / len(row["bytes_up"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks-per-client", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args()
    num_tasks = max(args.tasks_per_client)
    print(f"{'tasks/client':>12}{'MaTU kbit/client/round':>25}{'FedAvg kbit/client/round':>27}")
    with tempfile.TemporaryDirectory() as tmp:
        for k in args.tasks_per_client:
            out = Path(tmp) / str(k)
            run_config(validate(config(k, num_tasks)), out)
            matu, fedavg = (upload_bits_per_client(out / label) / 1000 for label in ("matu", "fedavg"))
            print(f"{k:>12}{matu:>25.1f}{fedavg:>27.1f}")


if __name__ == "__main__":
    main()

"""The compute limit of a round, measured side by side with the engine (`manytask bench --only limit`).

Workload: the SFMTL-Graph paper's CNN (3 conv blocks 32-64-128, FC 512, signed features) on its Fashion-MNIST
label-skew config (`configs/sfmtl/fashion_mnist_label_skew.yaml`): 20 clients, each its own 2-class task over the
10 labels, every client sampled, 3 local steps of batch 32, plain SGD with gradient clipping, FedAvg. Where the
Fashion-MNIST files are not on disk the `digits` source stands in (8×8 images), and the result says so.

The yardsticks run on the device the engine trains on (`device: auto`). Two yardsticks, neither with any FL
machinery:
- the *batched limit*: one model trained on the 20 clients' batches concatenated (640 samples a step), for the
  same 3 steps: what one batched round cannot beat;
- the *sequential limit*: one reused model trained on each client's batches in turn, then averaged: the bare loop
  the sequential engine is compared with.

`member_limits` holds every member of the SFMTL comparison (`SFMTL_MEMBERS`) to the batched limit on the same
workload: its batched round against the concatenated loop taking the member's steps (pFedMe's K per batch).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from manytask.benchmarks.fashion_mnist import DEFAULT_ROOT
from manytask.config import RunConfig, validate
from manytask.devices import resolve_device
from manytask.experiment import Experiment
from manytask.seeding import torch_generator

CLIENTS, STEPS, BATCH = 20, 3, 32
# the members of the SFMTL comparison (configs/sfmtl/fashion_mnist_rotated_masked.yaml), each with its steps per batch
SFMTL_MEMBERS: dict[str, tuple[dict[str, Any], int]] = {
    "sfmtl-graph": ({"name": "sfmtl-graph"}, 1),
    "sfmtl-random-graph": ({"name": "sfmtl-graph", "graph": "random"}, 1),
    "fedu": ({"name": "fedu"}, 1),
    "pfedme": ({"name": "pfedme"}, 5),  # K = 5 inner steps on each batch
    "fedavg": ({"name": "fedavg", "shared_head": True}, 1),
    "local": ({"name": "local"}, 1),
}


def source() -> str:
    return "fashion-mnist" if (Path(DEFAULT_ROOT) / "train-images-idx3-ubyte.gz").exists() else "digits"


def limit_config(execution: str, rounds: int, clients: int = CLIENTS, method: dict[str, Any] | None = None
                 ) -> RunConfig:
    return validate({
        "name": f"limit-{execution}", "method": method or "fedavg", "rounds": rounds, "seed": 0, "reference": None,
        "benchmark": {"name": "label-skew", "source": source(), "num_clients": clients, "classes_per_client": 2},
        "federation": {"num_clients": clients, "tasks": {"kind": "one-per-client"}, "samples": {"kind": "iid"}},
        "model": {"backbone": "cnn", "channels": [32, 64, 128], "hidden": 512, "signed_features": True},
        "train": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.0, "local_steps": STEPS, "batch_size": BATCH,
                  "grad_clip": 1.0},
        "eval_every": rounds, "execution": execution,
    })


Data = list[tuple[str, torch.Tensor, torch.Tensor]]


def _client_data(experiment: Experiment, device: torch.device) -> Data:
    """Every client's (task, x, y), on the device the engine trains on (moved once, as the engine's are)."""
    return [(task, x.to(device), y.to(device)) for client in range(experiment.federation.num_clients)
            for task, (x, y) in experiment.client_data(client).items()]


def _client_batches(data: Data, round_index: int) -> list[list[tuple[torch.Tensor, torch.Tensor, str]]]:
    """Per client, its STEPS batches of one round (random draws: the yardsticks' cost does not depend on which)."""
    batches = []
    for client, (task, x, y) in enumerate(data):
        generator = torch_generator(0, "limit", round_index, client)
        picks = [torch.randint(len(y), (BATCH,), generator=generator).to(x.device) for _ in range(STEPS)]
        batches.append([(x[p], y[p], task) for p in picks])
    return batches


def concatenated_runner(rounds: int, inner: int = 1) -> Callable[[int], None]:
    """The batched limit as a function that runs its next `count` rounds: one model, one head, every step on all
    clients' batches at once, `inner` steps on each."""
    experiment = Experiment.build(limit_config("sequential", rounds + 2))
    device = resolve_device(experiment.config.device)
    model = experiment.setup.build_model().to(device)
    data = _client_data(experiment, device)
    task = next(iter(experiment.setup.specs))
    params = [p for p in model.parameters() if p.requires_grad]
    done = [0]

    def run(count: int) -> None:
        for _ in range(count):
            batches = _client_batches(data, done[0])
            steps = [(torch.cat([b[s][0] for b in batches]), torch.cat([b[s][1] for b in batches]))
                     for s in range(STEPS) for _ in range(inner)]
            opt = torch.optim.SGD(params, lr=0.05)
            for x, y in steps:
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x, task), y).backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
            done[0] += 1

    return run


def sequential_runner(rounds: int) -> Callable[[int], None]:
    """The sequential limit as a function that runs its next `count` rounds: each client loads the global state,
    takes its steps with its own head, and the backbone and heads are averaged (FedAvg's weights)."""
    experiment = Experiment.build(limit_config("sequential", rounds + 2))
    device = resolve_device(experiment.config.device)
    model = experiment.setup.build_model().to(device)
    data = _client_data(experiment, device)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    done = [0]

    def run(count: int) -> None:
        nonlocal state
        for _ in range(count):
            sums: dict[str, torch.Tensor] = {}
            weights: dict[str, float] = {}
            for client, steps in enumerate(_client_batches(data, done[0])):
                model.load_state_dict(state)
                params = [p for p in model.parameters() if p.requires_grad]
                opt = torch.optim.SGD(params, lr=0.05)
                for x, y, task in steps:
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(model(x, task), y).backward()
                    torch.nn.utils.clip_grad_norm_(params, 1.0)
                    opt.step()
                size = float(sum(experiment.setup.holdings[client].values()))
                for key, value in model.state_dict().items():
                    if not key.startswith("heads.") or key.split(".")[1] == steps[0][2]:
                        sums[key] = sums.get(key, 0) + size * value
                        weights[key] = weights.get(key, 0.0) + size
            state = {**state, **{k: v / weights[k] for k, v in sums.items()}}
            done[0] += 1

    return run


def compute_limit(turns: int = 15) -> dict[str, Any]:
    """Seconds per round of the engine (batched, sequential) and of both limits (one torch thread), and the two
    ratios the project holds, each the median over turns of the paired rounds' ratio: batched / concatenated ≤ 1.5,
    sequential / bare sequential ≤ 1.05. Each pair is measured in its own block of turns (`paired_rounds`: its two
    rounds side by side, the order swapped from turn to turn), so that each of the two follows itself and the other
    equally often: a round that runs right after the concatenated loop's 640-sample round pays for faulting its
    freed activations back in (about 2 % on this project's 2-core VM)."""
    from manytask.bench.timing import engine_runner, paired_ratio, paired_rounds

    torch.set_num_threads(1)
    total = turns + 3
    with engine_runner(limit_config("vectorized", total)) as batched, \
            engine_runner(limit_config("sequential", total)) as sequential:
        seconds = {**paired_rounds({"batched": batched, "concatenated": concatenated_runner(total)}, turns),
                   **paired_rounds({"sequential": sequential, "bare": sequential_runner(total)}, turns)}
        checkpoint = batched.checkpoint_s_per_round
    return {"clients": CLIENTS, "steps": STEPS, "source": source(), "turns": turns,
            **{f"{k}_s_per_round": statistics.median(v) for k, v in seconds.items()},
            "checkpoint_s_per_round": checkpoint,
            "checkpoint_share": checkpoint / statistics.median(seconds["batched"]),
            "batched_ratio": paired_ratio(seconds["batched"], seconds["concatenated"]),
            "sequential_ratio": paired_ratio(seconds["sequential"], seconds["bare"])}


def member_limits(turns: int = 15) -> list[dict[str, Any]]:
    """Per member of `SFMTL_MEMBERS`: its batched round and the concatenated loop of its steps, side by side
    (`paired_rounds`), the median paired ratio, which the project holds to ≤ 1.5, and the checkpoint's share of the
    batched round (the personal members checkpoint a model per client)."""
    from manytask.bench.timing import engine_runner, paired_ratio, paired_rounds

    torch.set_num_threads(1)
    total = turns + 3
    rows = []
    for label, (method, inner) in SFMTL_MEMBERS.items():
        with engine_runner(limit_config("vectorized", total, method=method)) as batched:
            seconds = paired_rounds({"batched": batched, "concatenated": concatenated_runner(total, inner)}, turns)
            checkpoint = batched.checkpoint_s_per_round
        rows.append({"member": label, "clients": CLIENTS, "steps": STEPS * inner, "source": source(),
                     "turns": turns, **{f"{k}_s_per_round": statistics.median(v) for k, v in seconds.items()},
                     "ratio": paired_ratio(seconds["batched"], seconds["concatenated"]),
                     "checkpoint_share": checkpoint / statistics.median(seconds["batched"])})
    return rows

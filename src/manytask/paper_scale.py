"""The paper-scale speed of a comparison's members (`manytask bench --only paper`): the figure issue 34 holds a GPU to.

For each member of a comparison config (by default SFMTL-Graph's rotated & masked Fashion-MNIST setting at the
paper's scale, `configs/sfmtl/fashion_mnist_rotated_masked.yaml`: 20 of 40 clients a round, E = 5 epochs of about
1 500 images each, batch 32, the paper's CNN), on the device the config names (`auto`: the GPU where there is one):
- its batched round (`execution: auto`): the median of `rounds` rounds after one warm-up round;
- its sequential round (`execution: sequential`): `sequential_rounds` rounds after the batched ones warmed the
  process, their median (0 skips them: a sequential paper-scale round is tens of seconds even on a GPU);
- images/s: the sample passes of a round (Σ over its clients of E × n × K, K = pFedMe's steps on each batch)
  over the round's seconds.
The yardstick is one bare sequential PyTorch loop on the same device: a reused model, each of a round's clients
in turn for E epochs of its data (SGD with the config's step size and clipping), then averaged, with no FL
machinery. Rounds include everything the engine does in a round (messages, aggregation, the checkpoint, whose share
is given apart); evaluation is left out (the runs evaluate beyond the rounds measured)."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from manytask.bench import bare_rounds, engine_runner
from manytask.config import RunConfig, resolve
from manytask.devices import resolve_device
from manytask.engine.sampling import clients_per_round
from manytask.experiment import Experiment

PAPER_CONFIG = Path("configs/sfmtl/fashion_mnist_rotated_masked.yaml")


def member_config(config: RunConfig, method: Any, execution: str, rounds: int) -> RunConfig:
    """One member of `config`, one seed, `rounds` long, evaluating only after them."""
    return config.model_copy(update={"seeds": None, "rounds": rounds, "eval_every": rounds,
                                     "execution": execution}).for_method(method)


def passes_per_round(experiment: Experiment) -> float:
    """Sample passes (forward and backward) of an average round: its clients' E epochs over their data, K times
    where the method takes K steps on each batch."""
    config = experiment.config
    sizes = [sum(experiment.setup.holdings[c].values()) for c in range(experiment.federation.num_clients)]
    count = clients_per_round(len(sizes), config.participation, config.clients_per_round)
    inner = getattr(experiment.method_params, "inner_steps", 1)
    return count * statistics.mean(sizes) * (config.train.local_epochs or 1) * inner


def _timed(run, rounds: int) -> list[float]:
    seconds = []
    for _ in range(rounds):
        began = time.perf_counter()
        run(1)
        _synchronize()
        seconds.append(time.perf_counter() - began)
    return seconds


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def bare_sequential(config: RunConfig, rounds: int) -> tuple[float, Experiment]:
    """Median seconds of the bare sequential loop's rounds (after one warm-up round) on the first member's clients
    of a round, on the config's device; and that member's experiment."""
    experiment = Experiment.build(member_config(config, config.methods[0], "sequential", rounds + 1))
    device = resolve_device(experiment.config.device)
    count = clients_per_round(experiment.federation.num_clients, config.participation, config.clients_per_round)
    data = {c: {t: (x.to(device), y.to(device)) for t, (x, y) in experiment.client_data(c).items()}
            for c in range(count)}
    train = experiment.setup.train
    run = bare_rounds(experiment, data, "paper", epochs=train.local_epochs or 1, clip=train.grad_clip)
    run(1)
    _synchronize()
    return statistics.median(_timed(run, rounds)), experiment


def paper_members(path: Path = PAPER_CONFIG, rounds: int = 2, sequential_rounds: int = 1,
                  overrides: list[str] | None = None) -> dict[str, Any]:
    """Per member of the comparison at `path` (with `overrides`): batched and sequential s/round and images/s,
    against the bare sequential loop's; and the batched rounds of all members together."""
    config = resolve(str(path), list(overrides or []))
    torch.set_num_threads(config.threads)  # as the engine's runs will
    bare, base = bare_sequential(config, rounds)
    bare_passes = passes_per_round(base)
    rows = []
    for method in config.methods:
        total = rounds + sequential_rounds + 2
        with engine_runner(member_config(config, method, "auto", total)) as batched:
            experiment = batched.loop.exp
            batched(1)
            _synchronize()
            batched_s = statistics.median(_timed(batched, rounds))
            checkpoint = batched.checkpoint_s_per_round
        sequential_s = None
        if sequential_rounds:
            with engine_runner(member_config(config, method, "sequential", total)) as sequential:
                sequential_s = statistics.median(_timed(sequential, sequential_rounds))
        passes = passes_per_round(experiment)
        rows.append({"member": experiment.label, "passes_per_round": passes, "batched_s_per_round": batched_s,
                     "sequential_s_per_round": sequential_s, "batched_images_per_s": passes / batched_s,
                     "sequential_images_per_s": None if sequential_s is None else passes / sequential_s,
                     "batched_over_bare": (passes / batched_s) / (bare_passes / bare),
                     "checkpoint_s_per_round": checkpoint, "checkpoint_share": checkpoint / batched_s})
        print(f"paper scale: {experiment.label} batched {batched_s:.3f} s/round, sequential "
              f"{'-' if sequential_s is None else f'{sequential_s:.3f}'} s/round; the bare loop {bare:.3f}",
              file=sys.stderr, flush=True)
    return {"config": str(path), "overrides": list(overrides or []), "device": str(resolve_device(config.device)),
            "clients_per_round": clients_per_round(base.federation.num_clients, config.participation,
                                                   config.clients_per_round),
            "bare_s_per_round": bare, "bare_images_per_s": bare_passes / bare,
            "members": rows, "all_batched_s_per_round": sum(r["batched_s_per_round"] for r in rows)}

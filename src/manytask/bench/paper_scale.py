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

from manytask.bench.timing import bare_rounds, engine_runner
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
    """Sample passes (forward and backward) of an average round: its clients' E epochs over their data (or their
    `local_steps` batches), K times where the method takes K steps on each batch."""
    config = experiment.config
    sizes = [sum(experiment.setup.holdings[c].values()) for c in range(experiment.federation.num_clients)]
    count = clients_per_round(len(sizes), config.participation, config.clients_per_round)
    inner = getattr(experiment.method_params, "inner_steps", 1)
    train = config.train
    per_client = (train.local_steps * train.batch_size if train.local_steps is not None
                  else statistics.mean(sizes) * (train.local_epochs or 1))
    return count * per_client * inner


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
                  overrides: list[str] | None = None, warmup: int = 1) -> dict[str, Any]:
    """Per member of the comparison at `path` (with `overrides`): batched and sequential s/round and images/s,
    against the bare sequential loop's; and the batched rounds of all members together. Both runners time their
    rounds after `warmup` rounds (a phased method's timed rounds are then those of its phase)."""
    config = resolve(str(path), list(overrides or []))
    torch.set_num_threads(config.threads)  # as the engine's runs will
    bare, base = bare_sequential(config, rounds)
    bare_passes = passes_per_round(base)
    rows = []
    for method in config.methods:
        total = warmup + rounds + sequential_rounds + 1
        with engine_runner(member_config(config, method, "auto", total)) as batched:
            experiment = batched.loop.exp
            batched(warmup)
            _synchronize()
            before = batched.loop.checkpoint_seconds
            batched_s = statistics.median(_timed(batched, rounds))
            checkpoint = (batched.loop.checkpoint_seconds - before) / rounds
        sequential_s = None
        if sequential_rounds:
            with engine_runner(member_config(config, method, "sequential", total)) as sequential:
                if warmup > 1:  # a phased method's rounds before the timed phase (the first round is timed as-is)
                    sequential(warmup)
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


# The other methods at scale (`manytask bench --only scale`), each on an offline stand-in that a lent GPU can run in
# about a minute: (config, overrides, warm-up rounds before the timed ones).
SCALE_CHECKS: dict[str, tuple[str, list[str], int]] = {
    # FedDEA's NYUD-v2 setting: one client per task, Swin-T encoder (random weights: the paper's compute without its
    # checkpoint) with BatchNorm decoders at 224×224, on nyud-like scenes
    "FedAvg + DEA, nyud-like on Swin-T": ("configs/feddea/scenes_nyud_hosts_plugins.yaml", [
        "method=[{name: fedavg, plugin: {name: dea, rho: 0.3}}]", "plugins=null", "benchmark.size=224",
        "model={backbone: swin, image_size: 224, decoder: {width: 128, norm: batch}}", "train.batch_size=8"], 1),
    # FL + TaLoS's protocol config from its first sparse round (one head-only round, then the calibration round)
    "FL + TaLoS, sparse rounds": ("configs/talos/scene_objects_protocol.yaml", [
        "method=[{name: talos, head_rounds: 1, calibration_rounds: 5}]", "model.pretrained=false"], 2),
    # MAS-2's all-in-one rounds on sdnkt (32 buildings, 4 a round)
    "MAS-2, all-in-one rounds": ("configs/mas/sdnkt_comparison.yaml", [
        "method=[{name: mas, label: mas-2, groups: 2, r0: 12, affinity_round: 10}]"], 1),
}


def scale_members(rounds: int = 1, sequential_rounds: int = 1,
                  checks: dict[str, tuple[str, list[str], int]] | None = None) -> dict[str, dict[str, Any]]:
    """`paper_members` of each of `checks` (by default `SCALE_CHECKS`), by its label."""
    return {label: paper_members(Path(path), rounds, sequential_rounds, overrides, warmup)
            for label, (path, overrides, warmup) in (checks or SCALE_CHECKS).items()}

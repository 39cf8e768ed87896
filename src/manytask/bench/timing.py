"""The bench's yardsticks, timed side by side: the engine's rounds on a config (`engine_runner`), a bare PyTorch loop
doing the same SGD steps on the same client data with one reused model and no FL machinery (`bare_rounds`), and
the paired timing that turns two of them into a ratio robust to a busy machine (`paired_rounds`, `paired_ratio`)."""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch

from manytask.client.trainer import TaskData, shuffled_batches
from manytask.config import RunConfig, validate
from manytask.engine.local import local_engine
from manytask.engine.loop import RoundLoop
from manytask.engine.pool import ProcessPoolTransport
from manytask.experiment import Experiment
from manytask.rundir import RunDir
from manytask.seeding import derive_seed
from manytask.tasks.task import TaskSpec

Sgd = Callable[[list[torch.nn.Parameter], float, float, float], Any]  # (params, lr, momentum, weight decay)


def torch_sgd(params: list[torch.nn.Parameter], lr: float, momentum: float, weight_decay: float) -> Any:
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)


def engine_config(clients: int, rounds: int, seed: int = 0) -> RunConfig:
    """The engine workload with `clients` clients."""
    return validate({
        "name": f"bench-engine-{clients}", "method": "fedavg", "rounds": rounds, "seed": seed,
        "benchmark": {"name": "digits-tasks", "tasks": ["digit", "parity", "rotated", "mod3"]},
        "federation": {"num_clients": clients, "tasks": {"kind": "dirichlet", "zeta": 0.5}, "samples": {"kind": "iid"}},
        "model": {"backbone": "mlp", "hidden": [64]},
        "train": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "local_epochs": 1, "batch_size": 32},
        "eval_every": rounds, "reference": None, "execution": "sequential",
    })


def interleaved_seconds(runs: Mapping[str, Callable[[int], Any]], rounds: int, repeats: int = 5) -> dict[str, float]:
    """Seconds per round of each run (a function that runs its next `count` rounds), measured side by side: after
    one warm-up round each, `repeats` blocks of `rounds` rounds per run, the runs taking turns, and each run's
    fastest block (as `timeit` advises: load from elsewhere only ever adds time). A burst of load on a shared
    machine then spoils blocks, not a whole figure."""
    for run in runs.values():
        run(1)
    blocks: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            began = time.perf_counter()
            run(rounds)
            blocks[name].append((time.perf_counter() - began) / rounds)
    return {name: min(seconds) for name, seconds in blocks.items()}


def paired_rounds(runs: Mapping[str, Callable[[int], Any]], turns: int) -> dict[str, list[float]]:
    """Seconds of single rounds of each run (a function that runs its next `count` rounds), side by side: after one
    warm-up round each, `turns` turns in which every run does one round, the order rotating from turn to turn."""
    for run in runs.values():
        run(1)
    names = list(runs)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for turn in range(turns):
        shift = turn % len(names)
        for name in names[shift:] + names[:shift]:
            began = time.perf_counter()
            runs[name](1)
            seconds[name].append(time.perf_counter() - began)
    return seconds


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    """The median over turns of one run's round / the other's in the same turn (`paired_rounds`). On a shared VM
    whose speed drifts by tens of percent from minute to minute, both rounds of a turn run at about the same speed,
    and a burst of load spoils one turn's ratio, not the figure; the fastest blocks of each run, taken apart, may
    come from different minutes."""
    return statistics.median(a / b for a, b in zip(numerator, denominator, strict=True))


class EngineRounds:
    """A round loop as a function that runs its next `count` rounds, each going on from the last in memory."""

    def __init__(self, loop: RoundLoop) -> None:
        self.loop, self.done = loop, 0

    def __call__(self, count: int) -> None:
        self.done += count
        self.loop.run(stop_after=self.done, going_on=True)

    @property
    def checkpoint_s_per_round(self) -> float:
        """Seconds a round waited for checkpoints (its own copied, the last one's write finished), on average over
        the rounds run."""
        return self.loop.checkpoint_seconds / max(self.done, 1)


@contextmanager
def engine_runner(config: RunConfig) -> Iterator[EngineRounds]:
    """The local engine (with `config.workers` processes) on `config`, as a function that runs its next `count`
    rounds: serialization, aggregation, checkpoints and metric rows included; no evaluation while the config's
    `rounds` and `eval_every` lie beyond the rounds run."""
    experiment = Experiment.build(config)
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        run_dir = RunDir(Path(folder))
        run_dir.start("", experiment.federation_record())
        if config.workers > 1:
            transport = stack.enter_context(ProcessPoolTransport(experiment, config.workers))
            loop = RoundLoop(experiment, run_dir, transport)
        else:
            loop = local_engine(experiment, run_dir)
        try:
            yield EngineRounds(loop)
        finally:
            loop.wait_for_checkpoint()  # before its folder goes


def bare_runner(clients: int, rounds: int, sgd: Sgd = torch_sgd) -> Callable[[int], None]:
    """The bare loop on the engine workload with `clients` clients, as a function that runs its next `count` rounds:
    the same clients, data, steps and FedAvg, one reused model; `sgd` builds its optimizer (torch's, as plain
    PyTorch code would; or the engine's own `PlainSGD`, for a stricter yardstick)."""
    experiment = Experiment.build(engine_config(clients, rounds + 2))
    return bare_rounds(experiment, {c: experiment.client_data(c) for c in range(clients)}, "bench", sgd)


def bare_rounds(experiment: Experiment, data: dict[int, TaskData], name: str, sgd: Sgd = torch_sgd,
                epochs: int = 1, clip: float | None = None) -> Callable[[int], None]:
    """`bare_round` on `data` (the experiment's model, on the data's device) as a function that runs its next
    `count` rounds, each round's batches seeded by `name` and its index."""
    model = experiment.setup.build_model().to(next(iter(next(iter(data.values())).values()))[0].device)
    train = experiment.setup.train
    state = {k: v.clone() for k, v in model.state_dict().items()}
    done = [0]

    def run(count: int) -> None:
        nonlocal state
        for _ in range(count):
            state = bare_round(model, state, data, experiment.setup.specs, train.batch_size, train.lr,
                               train.momentum, derive_seed(0, name, done[0]), sgd, epochs, clip)
            done[0] += 1

    return run


def bare_round(model: torch.nn.Module, state: dict[str, torch.Tensor], data: dict[int, TaskData],
               specs: Mapping[str, TaskSpec], batch_size: int, lr: float, momentum: float, seed: int,
               sgd: Sgd = torch_sgd, epochs: int = 1, clip: float | None = None) -> dict[str, torch.Tensor]:
    """One FedAvg round in plain PyTorch: every client loads the global state, trains `epochs` epochs (of its
    largest task, each task with its spec's loss; gradients clipped to norm `clip`), and its shared weights and its
    tasks' heads are averaged, weighted by sample counts."""
    sums: dict[str, torch.Tensor] = {}
    weights: dict[str, float] = {}
    for client, tasks in data.items():
        model.load_state_dict(state)
        params = list(model.parameters())
        opt = sgd(params, lr, momentum, 0.0)
        steps = epochs * max(math.ceil(len(y) / batch_size) for _, y in tasks.values())
        streams = {t: shuffled_batches(x, y, batch_size, seed + client, t) for t, (x, y) in tasks.items()}
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = sum(specs[t].loss(model(x, t), y) for t, (x, y) in ((t, next(s)) for t, s in streams.items()))
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(params, clip)
            opt.step()
        size = float(sum(len(y) for _, y in tasks.values()))
        for key, value in model.state_dict().items():
            if not key.startswith("heads.") or key.split(".")[1] in tasks:
                sums[key] = sums.get(key, 0) + size * value
                weights[key] = weights.get(key, 0.0) + size
    return {**state, **{k: v / weights[k] for k, v in sums.items()}}

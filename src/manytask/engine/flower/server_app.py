"""Flower's ServerApp for every manytask method: the engine-independent round loop over a `GridTransport`.

In a deployment the SuperLink starts it with the run config `manytask-config` (the single-method config as YAML),
`run-dir` (where metrics, checkpoints and the summary go, on the SuperLink's machine) and, optionally,
`stop-after` (stop, checkpointed, after that many completed rounds: a resumable interruption driven by the code;
0 runs to the end) and `hold-at` (a drill's hold points, `drill.py`; "" for none)."""

from __future__ import annotations

import hashlib
from typing import Any

import yaml
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from manytask.config import to_yaml, validate
from manytask.engine.checkpoint import identity_of
from manytask.engine.flower.drill import HOLD_KEY, HOLD_TIMEOUT, ServerHolds, holds_folder, parse_points
from manytask.engine.flower.transport import GridTransport
from manytask.engine.loop import RoundLoop, RoundObserver
from manytask.experiment import Experiment
from manytask.rundir import RunDir

app = ServerApp()


def serve(
    grid: Grid, experiment: Experiment, run_dir: RunDir, observer: RoundObserver | None = None,
    stop_after: int | None = None, holds: ServerHolds | None = None, started_at: float | None = None,
) -> dict[str, Any] | None:
    """Run the experiment's rounds through `grid`; returns the summary (None if stopped at `stop_after`). With
    `holds` (a drill), the run waits at its hold points (it is then the loop's observer). From `started_at` (a
    `time.perf_counter()`: the engine's start) to the first round, the handshake included, counts in the run's wall
    time."""
    flower = experiment.config.flower
    transport = GridTransport(
        grid, experiment.federation.num_clients, to_yaml(experiment.config), flower.round_timeout,
        flower.connect_timeout, run_key(experiment, run_dir), holds.pushed if holds else None,
        experiment.client_fingerprint,
    )
    return RoundLoop(experiment, run_dir, transport, holds or observer, started_at=started_at).run(stop_after)


def run_key(experiment: Experiment, run_dir: RunDir) -> str:
    """The name of this run's client states on the SuperNodes: its identity (config, label, rounds) and its run
    directory, so that two runs of one config keep their states apart and a resumed run finds its own."""
    identity = identity_of(experiment)
    text = f"{identity.config_hash}|{identity.label}|{identity.total_rounds}|{run_dir.path.resolve()}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point under `flwr run`: start the run directory, or continue the checkpointed run already in it."""
    config_text = str(context.run_config["manytask-config"])
    experiment = Experiment.build(validate(yaml.safe_load(config_text)))
    run_dir = RunDir(str(context.run_config["run-dir"]))
    if not run_dir.config.exists():
        run_dir.start(to_yaml(experiment.config), experiment.federation_record())
    stop_after = int(context.run_config.get("stop-after", 0))
    points = parse_points(str(context.run_config.get(HOLD_KEY, "")))
    holds = ServerHolds(holds_folder(run_dir.path), points, HOLD_TIMEOUT) if points else None
    serve(grid, experiment, run_dir, stop_after=stop_after or None, holds=holds)

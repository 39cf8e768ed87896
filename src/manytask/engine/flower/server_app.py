"""Flower's ServerApp for every manytask method: the engine-independent round loop over a `GridTransport`.

In a deployment the SuperLink starts it with the run config `manytask-config` (the single-method config as YAML),
`run-dir` (where metrics, checkpoints and the summary go, on the SuperLink's machine) and, optionally,
`stop-after` (stop, checkpointed, after that many completed rounds: a resumable interruption driven by the code;
0 runs to the end)."""

from __future__ import annotations

from typing import Any

import yaml
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from manytask.config import to_yaml, validate
from manytask.engine.flower.transport import GridTransport
from manytask.engine.loop import RoundLoop, RoundObserver
from manytask.experiment import Experiment
from manytask.rundir import RunDir

app = ServerApp()


def serve(
    grid: Grid, experiment: Experiment, run_dir: RunDir, observer: RoundObserver | None = None,
    stop_after: int | None = None,
) -> dict[str, Any] | None:
    """Run the experiment's rounds through `grid`; returns the summary (None if stopped at `stop_after`)."""
    flower = experiment.config.flower
    transport = GridTransport(
        grid, experiment.federation.num_clients, to_yaml(experiment.config), flower.round_timeout,
        flower.connect_timeout,
    )
    return RoundLoop(experiment, run_dir, transport, observer).run(stop_after)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point under `flwr run`: start the run directory, or continue the checkpointed run already in it."""
    config_text = str(context.run_config["manytask-config"])
    experiment = Experiment.build(validate(yaml.safe_load(config_text)))
    run_dir = RunDir(str(context.run_config["run-dir"]))
    if not run_dir.config.exists():
        run_dir.start(to_yaml(experiment.config), experiment.federation.to_json())
    stop_after = int(context.run_config.get("stop-after", 0))
    serve(grid, experiment, run_dir, stop_after=stop_after or None)

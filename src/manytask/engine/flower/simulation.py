"""`engine: flower-sim`: the run on Flower's Simulation Engine (Ray), one virtual SuperNode per client."""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from manytask.engine.flower.client_app import app as client_app
from manytask.engine.flower.cluster import QUIET_FLOWER
from manytask.engine.flower.server_app import serve
from manytask.engine.loop import RoundObserver
from manytask.errors import ManytaskError
from manytask.experiment import Experiment
from manytask.rundir import RunDir


def run_flower_simulation(
    experiment: Experiment, run_dir: RunDir, observer: RoundObserver | None = None, stop_after: int | None = None
) -> dict[str, Any] | None:
    """Run on Flower's simulation engine; the ServerApp runs in this process, so its result and any error come
    straight back here."""
    os.environ.update(QUIET_FLOWER)
    outcome: dict[str, Any] = {}
    server_app = ServerApp()
    began = time.perf_counter()  # Ray's and the apps' start count in the run's wall time

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            outcome["summary"] = serve(grid, experiment, run_dir, observer, stop_after, started_at=began)
        except BaseException as err:  # handed back to the caller below, not lost in Flower's log
            outcome["error"] = err

    resources = experiment.config.flower
    check_client_gpus(resources.client_gpus)
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=experiment.federation.num_clients,
        backend_config={
            "client_resources": {"num_cpus": resources.client_cpus, "num_gpus": resources.client_gpus},
            "init_args": {"num_cpus": resources.sim_cpus, "include_dashboard": False},
        },
    )
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("summary")


def check_client_gpus(gpus: float) -> None:
    """GPUs asked for the virtual clients must exist: Ray would otherwise wait forever for a GPU to schedule them."""
    if gpus > 0 and not torch.cuda.is_available():
        raise ManytaskError(f"flower.client_gpus: {gpus:g}, but torch sees no CUDA GPU here, and Ray would wait for "
                            "one forever; use flower.client_gpus: 0 (the clients train on the CPU).")

"""The cross-evaluation oracle of a finished personalized run (one task per client): every client's final model on
every client's test data, A[i, j] = the main metric of client j's model on client i's data.

Clients whose data are alike score each other's models well, so A holds the similarity structure the clients'
models learned, whatever a method uploads. Communities of the symmetric S = (A + Aᵀ) / 2 (Louvain, seeded, as
SFMTL-Graph finds its own) and their adjusted Rand index against the benchmark's true clusters are a ceiling for
what a method's client graph can recover: SFMTL-Graph sees only heads and anchors, this oracle sees the models
and every client's data. It needs the run's checkpoint and data, and is written to `cross_evaluation.json`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from sklearn.metrics import adjusted_rand_score

from manytask.config import validate
from manytask.config_sources import load_yaml
from manytask.engine.checkpoint import identity_of, load_checkpoint
from manytask.engine.client_runner import ClientRunner
from manytask.errors import ManytaskError
from manytask.experiment import Experiment
from manytask.messages import encode
from manytask.methods.manytask.sfmtl_math import communities
from manytask.report.runs import ORACLE
from manytask.rundir import RunDir
from manytask.seeding import derive_seed


def cross_matrix(experiment: Experiment, run_dir: RunDir) -> torch.Tensor:
    """A[i, j]: client j's final model (from the run's checkpoint) on client i's test data, its task's main
    metric; every client holds one task and every task one output space (the heads are interchangeable)."""
    clients = list(range(experiment.federation.num_clients))
    tasks = [_only_task(experiment, c) for c in clients]
    outputs = {experiment.setup.specs[t].num_outputs for t in tasks}
    if len(outputs) > 1:
        raise ManytaskError("a cross-evaluation needs every client's task to have the same outputs, to run one "
                            f"client's model on another's data; these have {sorted(outputs)}.")
    checkpoint = load_checkpoint(run_dir.checkpoint, identity_of(experiment))
    server = experiment.server_program()
    server.load_state_dict(checkpoint.server)
    payloads = {c: None if m is None else encode(m) for c, m in server.configure_evaluate(clients).items()}
    runner = ClientRunner(experiment)
    tests = [experiment.test_data([t])[t] for t in tasks]
    matrix = torch.zeros(len(clients), len(clients), dtype=torch.float64)
    for j, task in enumerate(tasks):
        main = experiment.setup.specs[task].main_metric
        state = checkpoint.clients.get(j, {})
        for i, data in enumerate(tests):
            matrix[i, j] = runner.evaluate(j, payloads[j], state, {task: data})[task][main]
    return matrix


def _only_task(experiment: Experiment, client: int) -> str:
    held = experiment.federation.tasks_of(client)
    if len(held) != 1:
        raise ManytaskError(f"a cross-evaluation needs one task per client; client {client} holds {len(held)}.")
    return held[0]


def oracle(run_path: Path) -> dict[str, Any]:
    """Cross-evaluate a finished run, find the oracle's communities on S = (A + Aᵀ)/2, and score them against the
    benchmark's true clusters; written to the run's cross_evaluation.json and returned."""
    run_dir = RunDir(Path(run_path))
    if not run_dir.is_finished():
        raise ManytaskError(f"'{run_path}' is not a finished run directory; cross-evaluate a run that completed.")
    experiment = Experiment.build(validate(load_yaml(run_dir.config)))
    matrix = cross_matrix(experiment, run_dir)
    similarity = (matrix + matrix.T) / 2
    similarity.fill_diagonal_(0.0)
    found = communities(similarity.float(), derive_seed(experiment.config.seed, "oracle"))
    label = {client: number for number, group in enumerate(found) for client in group}
    groups = _true_clusters(experiment)
    result = {
        "matrix": matrix.tolist(),
        "own": matrix.diagonal().mean().item(),  # each client's model on its own data
        "others": (matrix.sum() - matrix.diagonal().sum()).item() / max(1, matrix.numel() - len(matrix)),
        "communities": found,
        "ari": None if groups is None else float(adjusted_rand_score(
            [groups[c] for c in range(len(matrix))], [label[c] for c in range(len(matrix))])),
    }
    run_dir.write_json(run_dir.path / ORACLE, result)
    return result


def _true_clusters(experiment: Experiment) -> dict[int, Any] | None:
    """Each client's true cluster (its task's group: the benchmark's metadata `groups`, by task), or None."""
    groups = experiment.benchmark.metadata.get("groups")
    if not groups:
        return None
    return {c: groups[_only_task(experiment, c)] for c in range(experiment.federation.num_clients)}

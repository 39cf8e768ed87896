"""`manytask bench`: the speed ratios that matter, each measured side by side in one process, never as absolute
targets (the machines are shared and noisy).

The engine workload (issue 16): FedAvg on `digits-tasks` (digit, parity, rotated, mod3), MLP [64], Dirichlet(0.5)
task allocation, IID samples, one local epoch of batch 32, every client sampled. Its yardstick is a bare PyTorch
loop that runs the same SGD steps on the same client data with one reused model and no FL machinery (no
messages, no checkpoints, no evaluation, no per-client model): the engine's overhead is the ratio of the two.
"""

from __future__ import annotations

import importlib.util
import json
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import torch

from manytask.bench.compute_limit import compute_limit, member_limits
from manytask.bench.kernels import kernel_table
from manytask.bench.timing import bare_runner, engine_config, engine_runner, interleaved_seconds
from manytask.client.optimizers import PlainSGD
from manytask.config import RunConfig, validate
from manytask.errors import ManytaskError, unknown_choice


def vectorized(config: RunConfig) -> RunConfig:
    return config.model_copy(update={"execution": "vectorized"})


def engine_overhead(clients: tuple[int, ...] = (30, 100), rounds: int = 5, repeats: int = 5
                    ) -> list[dict[str, float]]:
    """Per client count (one torch thread): seconds per round of the local engine (sequential and vectorized) and
    of the bare loop, measured side by side in alternating blocks (`interleaved_seconds`); the engine's overhead
    (engine / bare) and the vectorized speed-up (bare / vectorized)."""
    torch.set_num_threads(1)
    rows = []
    for count in clients:
        config = engine_config(count, rounds * repeats + 3)
        with engine_runner(config) as engine, engine_runner(vectorized(config)) as batched:
            seconds = interleaved_seconds({"engine": engine, "vectorized": batched, "bare": bare_runner(count, rounds),
                                           "strict": bare_runner(count, rounds, PlainSGD)}, rounds, repeats)
        engine_s, bare_s, batched_s, strict_s = (seconds[k] for k in ("engine", "bare", "vectorized", "strict"))
        rows.append({"clients": count, "engine_s_per_round": engine_s, "bare_s_per_round": bare_s,
                     "vectorized_s_per_round": batched_s, "ratio": engine_s / bare_s,
                     "vectorized_speedup": bare_s / batched_s, "bare_plain_sgd_s_per_round": strict_s,
                     "ratio_plain_sgd": engine_s / strict_s})
    return rows


def parallel_config(workers: int, rounds: int, seed: int = 0) -> RunConfig:
    """A workload with enough compute per client for processes to pay: 20 clients, a wider MLP, 4 local epochs."""
    data = engine_config(20, rounds, seed).model_dump(mode="json")
    data["model"] = {"backbone": "mlp", "hidden": [256, 256]}
    data["train"]["local_epochs"] = 4
    return validate({**data, "name": f"bench-workers-{workers}", "workers": workers})


def parallel_speedup(workers: int = 2, rounds: int = 3, repeats: int = 5) -> dict[str, float]:
    """Seconds per round with one process and with `workers`, side by side (`interleaved_seconds`), and the
    speed-up (same numbers either way)."""
    torch.set_num_threads(1)
    total = rounds * repeats + 3
    with engine_runner(parallel_config(1, total)) as one, engine_runner(parallel_config(workers, total)) as many:
        seconds = interleaved_seconds({"one": one, "many": many}, rounds, repeats)
    return {"workers": workers, "one_process_s_per_round": seconds["one"], "workers_s_per_round": seconds["many"],
            "speedup": seconds["one"] / seconds["many"]}


def round_seconds(run_dir: Path) -> list[float]:
    """The wall seconds of a finished run's rounds after the first (start-up), without the last (evaluation)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["wall_seconds"] for row in rows[1:-1]]


def flower_ratio(clients: int = 30, rounds: int = 5, repeats: int = 2) -> dict[str, float]:
    """Seconds per round of Flower's simulation against the local engine, sequential and vectorized, on the engine
    workload: each run `repeats` times, the three taking turns, and the fastest of the round times each records in
    metrics.jsonl (`round_seconds`), as `interleaved_seconds` takes the fastest block."""
    from manytask.launch import run_config

    config = engine_config(clients, rounds + 2)
    runs = {"local": config, "vectorized": vectorized(config), "flower-sim": config.model_copy(update={"engine":
                                                                                                     "flower-sim"})}
    times: dict[str, list[float]] = {name: [] for name in runs}
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(repeats):
            for name, run in runs.items():
                run_config(run, Path(folder) / f"{name}-{repeat}")
                times[name] += round_seconds(Path(folder) / f"{name}-{repeat}")
    seconds = {name: min(values) for name, values in times.items()}
    flower = seconds["flower-sim"]
    return {"clients": clients, "local_s_per_round": seconds["local"], "vectorized_s_per_round": seconds["vectorized"],
            "flower_sim_s_per_round": flower, "ratio": flower / seconds["local"],
            "vectorized_ratio": flower / seconds["vectorized"]}


def scale_config(clients: int, participation: float, rounds: int = 5) -> dict[str, Any]:
    """FedAvg on `synthetic` (4 tasks of 100 000 samples) with `clients` registered clients, a fraction sampled."""
    return {
        "name": f"bench-scale-{clients}", "method": "fedavg", "rounds": rounds, "seed": 0, "reference": None,
        "benchmark": {"name": "synthetic", "num_tasks": 4, "train_per_task": 100_000, "test_per_task": 500},
        "federation": {"num_clients": clients, "tasks": {"kind": "dirichlet", "zeta": 0.5}, "samples": {"kind": "iid"}},
        "model": {"backbone": "mlp", "hidden": [64]}, "participation": participation, "eval_every": rounds,
        "train": {"optimizer": "sgd", "lr": 0.05, "local_epochs": 1, "batch_size": 32},
    }


PEAK_RSS = """
import json, resource, sys, tempfile
from pathlib import Path
from manytask.config import validate
from manytask.launch import run_config
with tempfile.TemporaryDirectory() as out:
    run_config(validate(json.loads(sys.argv[1])), Path(out) / "run")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_memory(runs: tuple[tuple[int, float], ...] = ((1000, 0.1), (10_000, 0.01))) -> list[dict[str, float]]:
    """Peak resident memory (MB) of a whole 5-round run in a fresh process, per (registered clients, participation)."""
    rows = []
    for clients, participation in runs:
        done = subprocess.run([sys.executable, "-c", PEAK_RSS, json.dumps(scale_config(clients, participation))],
                              capture_output=True, text=True, check=True)
        rows.append({"clients": clients, "participation": participation,
                     "peak_rss_mb": int(done.stdout.split()[-1]) / 1024})
    return rows


def machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpus": torch.get_num_threads(), "processor": platform.processor() or platform.machine()}


def matu_server_step(d: int = 10_000_000, tasks: int = 30) -> dict[str, float]:
    """MaTU's server step (`matu_aggregate.aggregate`) over one upload per task of a d-entry unified vector, against one
    pass over the same memory (summing the uploads): how far the server math is from memory-bound."""
    from manytask.methods.manytask.matu_aggregate import aggregate

    generator = torch.Generator().manual_seed(0)
    uploads = []
    for t in range(tasks):
        name = f"task{t:02d}"
        uploads.append({"unified": torch.randn(d, generator=generator), "rescalers": {name: 1.0},
                        "masks": {name: torch.rand(d, generator=generator) < 0.5}, "sizes": {name: 100}})
    began = time.perf_counter()
    total = torch.zeros(d)
    for upload in uploads:
        total += upload["unified"]
    one_pass = time.perf_counter() - began
    began = time.perf_counter()
    aggregate(uploads)
    step = time.perf_counter() - began
    return {"d": d, "tasks": tasks, "server_step_s": step, "one_pass_s": one_pass, "ratio": step / one_pass}


def sfmtl_graph(clients: int = 1000, features: int = 64, classes: int = 10) -> dict[str, float]:
    """SFMTL-Graph's server step at `clients` participants: the similarity graph over every pair (heads on anchors,
    anchor cosines) and Louvain communities on it, each timed."""
    from manytask.methods.manytask.sfmtl_math import communities, similarity_graph

    generator = torch.Generator().manual_seed(0)
    heads = [(torch.randn(classes, features, generator=generator), torch.randn(classes, generator=generator))
             for _ in range(clients)]
    anchors = [torch.randn(classes, features, generator=generator) for _ in range(clients)]
    labels = [sorted(torch.randperm(classes, generator=generator)[:2].tolist()) for _ in range(clients)]
    began = time.perf_counter()
    weights = similarity_graph(heads, anchors, labels)
    graph = time.perf_counter() - began
    began = time.perf_counter()
    communities(weights, seed=0)
    return {"clients": clients, "graph_s": graph, "louvain_s": time.perf_counter() - began}


def flower_installed() -> bool:
    return importlib.util.find_spec("flwr") is not None


# what `--only` picks from
PARTS = ("kernels", "limit", "members", "paper", "scale", "engine", "workers", "memory", "matu", "sfmtl", "flower")
# paper scale and the other methods at scale: tens of minutes without a GPU
DEFAULT_PARTS = tuple(part for part in PARTS if part not in ("paper", "scale"))


def run_bench(
    out: Path, rounds: int = 5, flower: bool = True, matu_d: int = 10_000_000, sfmtl_clients: int = 1000,
    only: Collection[str] = DEFAULT_PARTS,
) -> dict[str, Any]:
    """The ratios of the parts in `only` (all by default), printed by the caller and written to `out` as JSON;
    Flower's only where it is installed and `flower` holds."""
    unknown = sorted(set(only) - set(PARTS))
    if unknown:
        raise unknown_choice("bench part", unknown[0], PARTS)
    measures: dict[str, tuple[str, Callable[[], Any]]] = {
        "kernels_per_round": ("kernels", kernel_table),
        "compute_limit": ("limit", lambda: compute_limit(turns=3 * rounds)),
        "member_limits": ("members", lambda: member_limits(turns=rounds)),
        "paper_members": ("paper", lambda: _paper_members(rounds)),
        "scale_members": ("scale", lambda: _scale_members(rounds)),
        "engine_overhead": ("engine", lambda: engine_overhead(rounds=rounds)),
        "parallel_clients": ("workers", lambda: parallel_speedup(rounds=rounds)),
        "peak_memory": ("memory", peak_memory),
        "matu_server_step": ("matu", lambda: matu_server_step(d=matu_d)),
        "sfmtl_graph": ("sfmtl", lambda: sfmtl_graph(clients=sfmtl_clients)),
        "flower_simulation": ("flower", lambda: flower_ratio(rounds=rounds)),
    }
    wanted = {part for part in only if part != "flower" or (flower and flower_installed())}
    results = {"machine": machine()}
    results.update({key: measure() for key, (part, measure) in measures.items() if part in wanted})
    out.write_text(json.dumps(results, indent=2))
    return results


def _scale_members(rounds: int) -> dict[str, Any]:
    from manytask.bench.paper_scale import SCALE_CHECKS, scale_members

    missing = [path for path, _, _ in SCALE_CHECKS.values() if not Path(path).exists()]
    if missing:
        raise ManytaskError(f"bench part 'scale' reads {missing[0]}: run it from the repository's root.")
    return scale_members(rounds=rounds)


def _paper_members(rounds: int) -> dict[str, Any]:
    from manytask.bench.paper_scale import PAPER_CONFIG, paper_members

    if not PAPER_CONFIG.exists():
        raise ManytaskError(f"bench part 'paper' reads {PAPER_CONFIG}: run it from the repository's root.")
    return paper_members(rounds=rounds)

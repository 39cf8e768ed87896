"""MaTU's experiments ("Many-Task Federated Fine-Tuning via Unified Task Vectors"): Tables 1-2, Figs. 2-6.

Besides the plain runner, MaTU's experiments use three of their own: `matu-paper-rounds` (the paper trains MaT-FL
three times as long as the others in Tables 1-2), `matu-config-set` (one figure over several configs: Fig. 6a's
three task-conflict groups) and `matu-tasks-per-client` (Fig. 5: clients holding k tasks of the 30-task benchmark,
k swept). The task-relatedness measures of Figs. 2-3 read the task vectors MaTU's server checkpoints."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from manytask.errors import ManytaskError
from manytask.experiments.measures import accuracy, summary_key
from manytask.experiments.runner import (
    RUNNERS,
    Unit,
    Workers,
    run_with_estimate,
    scale_config,
    units,
)
from manytask.experiments.spec import TWO_ROUNDS, Column, Measure, PaperExperiment, Scale, Value, paper, register

if TYPE_CHECKING:
    from torch import Tensor

    from manytask.config import RunConfig
    from manytask.report.runs import RunRecord

paper("matu", "MaTU: many-task federated fine-tuning via unified task vectors",
      "MaTU's claim: one unified task vector per client, with per-task masks and rescalers and sign-based task "
      "similarity, beats FedAvg, FedProx, NTK-FedAvg, FedPer and MaT-FL on single-task and multi-task clients, "
      "at a fraction of their upload.")

SMOKE = (*TWO_ROUNDS, "federation.num_clients=4")
ACCURACY = Column("accuracy %", accuracy)
BITS = Column("bits per task per round", summary_key("bits_per_task_per_round", 1e-6), fmt="{:.3f} M")

register(
    PaperExperiment(
        id="matu/table2-multi-task",
        title="Table 2: multi-task clients",
        shows="average test accuracy with multi-task clients (Dirichlet task allocation, ζ = 0.5), MaTU against "
              "one FedAvg model per task, MaT-FL and individual training.",
        columns=(ACCURACY, BITS),
        scales={"smoke": Scale("configs/matu/digits_multi_task.yaml", SMOKE),
                "cpu": Scale("configs/matu/digits_multi_task.yaml", seeds=(0, 1, 2, 3, 4))},
        paper_numbers={"matu": {"accuracy %": 79.47, "bits per task per round": 8.04},
                       "fedavg-per-task": {"accuracy %": 51.63, "bits per task per round": 20.43},
                       "matfl": {"accuracy %": 67.60}, "individual": {"accuracy %": 90.21},
                       "fedprox": {"accuracy %": 56.32}, "ntk-fedavg": {"accuracy %": 56.06},
                       "fedper": {"accuracy %": 48.37}},
        paper_note="The paper: ViT-B/32 with LoRA r = 16 on 8 vision datasets, N = 30 clients, R = 100 rounds of "
                   "E = 1 step, ξ = 0.2. Here: the offline `digits-tasks` stand-in (6 tasks), an MLP backbone "
                   "pretrained on held-out digits with LoRA r = 8, 10 clients, 20 rounds.",
    ),
)


# ---------------------------------------------------------------- measures

REFERENCE = "individual"  # MaTU's normalizer: centralized per-task fine-tuning


def normalized(reference: str = REFERENCE) -> Measure:
    """The average over classification tasks of the member's accuracy divided by the `reference` member's on the
    same seed, in % (the paper's "normalized accuracy"); None where the seed has no such member."""

    def measure(record: RunRecord, runs: Mapping[str, RunRecord]) -> Value:
        from manytask.summary import normalize

        if reference not in runs:
            return None
        mine = {"tasks": record.summary.get("tasks") or {}, "main_metric": record.summary.get("main_metric") or {}}
        normalize(mine, runs[reference].summary, reference)
        value = mine.get("normalized_average")
        return None if value is None else 100 * float(value)

    return measure


def upload_per_client(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    """Bytes a participating client uploads in a round, in kB, averaged over rounds and clients (Fig. 5a's
    communication per round); None for a member that sends nothing."""
    sent = [float(b) for row in record.metrics for b in (row.get("bytes_up") or {}).values()]
    return statistics.fmean(sent) / 1000 if any(sent) else None


def task_vectors(record: RunRecord) -> tuple[list[str], Tensor] | None:
    """The server's final task vectors of a MaTU run (task names, and one row per task), read from its checkpoint;
    None for a run without them (another method, or no checkpoint)."""
    path = record.path / "checkpoint.safetensors"
    return _vectors(str(path), path.stat().st_mtime_ns) if path.is_file() else None


@lru_cache(maxsize=8)
def _vectors(path: str, _mtime: int) -> tuple[list[str], Tensor] | None:
    """Read once per file version: every relatedness column of a member reads the same vectors."""
    import torch

    from manytask.engine.checkpoint import load_checkpoint
    from manytask.methods.manytask.matu import VECTOR_PREFIX

    server = load_checkpoint(Path(path)).server
    tasks = [key[len(VECTOR_PREFIX):] for key in server if key.startswith(VECTOR_PREFIX)]
    if not tasks:
        return None
    return tasks, torch.stack([server[VECTOR_PREFIX + t].to(torch.float64) for t in tasks])


def sign_similarity(vectors: Tensor) -> Tensor:
    """MaTU's S(t, t') (eq. 5), the sign agreement of two task vectors in [0, 1]."""
    from manytask.methods.manytask.matu_math import task_similarity

    return task_similarity(vectors).to(vectors.dtype)


def cosine_similarity(vectors: Tensor) -> Tensor:
    """Cosine similarity of the task vectors (the first measure the paper compares S against)."""
    unit = vectors / vectors.norm(dim=1, keepdim=True).clamp_min(1e-30)
    return unit @ unit.T


SIMILARITIES = {"sign": sign_similarity, "cosine": cosine_similarity}


def off_diagonal(matrix: Tensor) -> list[float]:
    """Each unordered pair's entry once (i < j)."""
    size = matrix.shape[0]
    return [float(matrix[i, j]) for i in range(size) for j in range(i + 1, size)]


def pearson(xs: list[float], ys: list[float]) -> float | None:
    """Pearson's r of two paired lists; None where one of them is constant or there are under two pairs."""
    if len(xs) < 2 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return statistics.correlation(xs, ys)


def pearson_sign_against(other: str) -> Measure:
    """Pearson's r, over task pairs, between S and the `other` similarity of the member's final task vectors
    (the paper's Fig. 3)."""

    def measure(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
        found = task_vectors(record)
        if found is None:
            return None
        _, vectors = found
        return pearson(off_diagonal(sign_similarity(vectors)), off_diagonal(SIMILARITIES[other](vectors)))

    return measure


def cluster_agreement(similarity: Tensor, truth: list[int]) -> float:
    """Adjusted Rand index of an average-linkage clustering of 1 − similarity (as many clusters as true groups)
    against the true groups: 1 when the measure recovers them, about 0 for a random grouping."""
    import numpy as np
    from sklearn.cluster import AgglomerativeClustering
    from sklearn.metrics import adjusted_rand_score

    distance = 1 - similarity.numpy()
    np.fill_diagonal(distance, 0.0)
    distance = (distance + distance.T) / 2
    clusters = AgglomerativeClustering(n_clusters=len(set(truth)), metric="precomputed", linkage="average")
    return float(adjusted_rand_score(truth, clusters.fit_predict(distance)))


def groups_recovered(name: str) -> Measure:
    """How well the similarity `name` of the member's final task vectors finds the benchmark's true task groups
    (adjusted Rand index; the paper's Fig. 2 reads its matrices for the same); None without groups."""

    def measure(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
        found, groups = task_vectors(record), record.summary.get("task_groups")
        if found is None or not groups:
            return None
        tasks, vectors = found
        return cluster_agreement(SIMILARITIES[name](vectors), [groups[t] for t in tasks])

    return measure


def mean_sign_similarity(within: bool) -> Measure:
    """The mean S over pairs of tasks in the same true group (`within`) or in different ones."""

    def measure(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
        found, groups = task_vectors(record), record.summary.get("task_groups")
        if found is None or not groups:
            return None
        tasks, vectors = found
        similarity = sign_similarity(vectors)
        pairs = [float(similarity[i, j]) for i in range(len(tasks)) for j in range(i + 1, len(tasks))
                 if (groups[tasks[i]] == groups[tasks[j]]) == within]
        return statistics.fmean(pairs) if pairs else None

    return measure


def task_accuracy(task: str) -> Measure:
    """The member's final main metric on one task, in % (accuracy for a classification task); None where the run
    does not have the task."""

    def measure(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
        metric = (record.summary.get("main_metric") or {}).get(task, "accuracy")
        value = ((record.summary.get("tasks") or {}).get(task) or {}).get(metric)
        return None if value is None else 100 * float(value)

    return measure


def sign_similarity_bound(highest: bool) -> Measure:
    """The highest (`highest`) or lowest S over pairs of the member's final task vectors: where every pair is
    above MaTU's ε = 0.5, its neighbour graph is connected."""

    def measure(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
        found = task_vectors(record)
        pairs = off_diagonal(sign_similarity(found[1])) if found is not None else []
        return (max if highest else min)(pairs) if pairs else None

    return measure


# ---------------------------------------------------------------- runners

SHARED_MEMBERS = (REFERENCE,)  # members no config of a set or k changes: run once, under their own label
PAPER_ROUNDS = {"matfl": 300}  # Tables 1-2: R = 100 "except MaT-FL where R = 300"
TASKS_PER_CLIENT = (3, 6, 15, 30)  # Fig. 5 sweeps 2 to 30; from 3 here, so that ten clients hold every task
CONFIG_SETS: dict[str, tuple[tuple[str, str], ...]] = {  # a scale's config -> (label suffix, config) of its figure
    "configs/matu/digits_domains_conflict_0.yaml": (
        ("no conflict", "configs/matu/digits_domains_conflict_0.yaml"),
        ("2-conflict", "configs/matu/digits_domains_conflict_2.yaml"),
        ("3-conflict", "configs/matu/digits_domains_conflict_3.yaml"),
    ),
}


def relabel(unit: Unit, label: str, out: Path) -> Unit:
    return replace(unit, label=label, out=out / f"seed{unit.seed}" / label)


def with_rounds(unit: Unit, rounds: int) -> Unit:
    """The unit's run with `rounds` rounds (its evaluations and checkpoints as its config has them)."""
    from manytask.config import to_yaml, validate

    return replace(unit, config=to_yaml(validate({**yaml.safe_load(unit.config), "rounds": rounds})))


def chosen_seeds(config: RunConfig) -> tuple[int, ...]:
    return tuple(config.seeds) if config.seeds else (config.seed,)


def paper_rounds_runner(experiment: PaperExperiment, scale: Scale, config: RunConfig, out: Path, workers: Workers,
                        probe: bool) -> list[Unit]:
    """Every member once per seed, as the plain runner; at the paper scale the members of `PAPER_ROUNDS` run the
    rounds the paper gave them (a config has one round count for all its members)."""
    todo = units(config, out, scale.members)
    if scale == experiment.scales.get("paper"):
        todo = [with_rounds(u, PAPER_ROUNDS[u.label]) if u.label in PAPER_ROUNDS else u for u in todo]
    run_with_estimate(todo, workers, probe)
    return todo


def keep_shared_once(found: list[Unit], suffix: str, out: Path, seen: set[tuple[int, str]]) -> list[Unit]:
    """`found` with every label suffixed, except a shared member's, which is kept only the first time a seed
    has it."""
    kept = []
    for unit in found:
        if unit.label not in SHARED_MEMBERS:
            kept.append(relabel(unit, f"{unit.label} {suffix}", out))
        elif (unit.seed, unit.label) not in seen:
            seen.add((unit.seed, unit.label))
            kept.append(unit)
    return kept


def config_set_runner(experiment: PaperExperiment, scale: Scale, config: RunConfig, out: Path, workers: Workers,
                      probe: bool) -> list[Unit]:
    """The members of every config of the scale's set (`CONFIG_SETS`), each labelled with its config's suffix
    ("matu 2-conflict"), the scale's overrides and seeds applied to all; a shared member runs once."""
    seeds, todo, seen = chosen_seeds(config), [], set()
    for suffix, path in CONFIG_SETS.get(scale.config, (("", scale.config),)):
        found = units(scale_config(replace(scale, config=path), seeds), out, scale.members)
        todo += keep_shared_once(found, suffix, out, seen) if suffix else found
    run_with_estimate(todo, workers, probe)
    return todo


def benchmark_tasks(config: RunConfig) -> list[str]:
    """The task names the config's benchmark selects (its `tasks`, else the benchmark's default)."""
    from manytask.benchmarks import BENCHMARKS

    params = {k: v for k, v in config.benchmark.items() if k != "name"}
    return list(BENCHMARKS.parse_params(config.benchmark["name"], params).tasks)


def windows(tasks: list[str], num_clients: int, k: int) -> list[list[str]]:
    """Client n's k tasks: the k consecutive tasks (cyclically) from task n·T/N, so that every task is held once
    k ≥ T/N; the task count must be a multiple of the client count."""
    if len(tasks) % num_clients:
        raise ManytaskError(f"clients holding k of {len(tasks)} tasks need a client count that divides it, got "
                            f"{num_clients}.")
    stride = len(tasks) // num_clients
    return [[tasks[(n * stride + j) % len(tasks)] for j in range(k)] for n in range(num_clients)]


def tasks_per_client(config: RunConfig) -> list[int]:
    """The k of `TASKS_PER_CLIENT` for which every task has a holder and no client holds a task twice."""
    count, clients = len(benchmark_tasks(config)), config.federation.num_clients
    return [k for k in TASKS_PER_CLIENT if count // clients <= k <= count]


def tasks_per_client_runner(experiment: PaperExperiment, scale: Scale, config: RunConfig, out: Path,
                            workers: Workers, probe: bool) -> list[Unit]:
    """Every member once per seed and per k of `tasks_per_client`, each client holding k tasks (labelled
    "matu k=6"); the reference, which no allocation changes, once per seed."""
    tasks, todo, seen = benchmark_tasks(config), [], set()
    for k in tasks_per_client(config):
        allocation = {"kind": "groups", "groups": windows(tasks, config.federation.num_clients, k)}
        federation = config.federation.model_copy(update={"tasks": allocation})
        found = units(config.model_copy(update={"federation": federation}), out, scale.members)
        todo += keep_shared_once(found, f"k={k}", out, seen)
    run_with_estimate(todo, workers, probe)
    return todo


RUNNERS.update({"matu-paper-rounds": paper_rounds_runner, "matu-config-set": config_set_runner,
                "matu-tasks-per-client": tasks_per_client_runner})


# ---------------------------------------------------------------- the experiments

VISION8 = "configs/matu/vision8.yaml"
VISION8_NEEDS = ("/data/vision8", "/models/vit-b32")  # the config's benchmark.root and model.weights
ONE_TASK_PER_CLIENT = "federation.tasks={kind: one-per-client}"
NORMALIZED = Column("normalized accuracy %", normalized())
TABLE1 = {"matu": {"accuracy %": 84.32, "bits per task per round": 6.32},
          "fedavg-per-task": {"accuracy %": 64.60, "bits per task per round": 6.32},
          "fedprox": {"accuracy %": 67.14, "bits per task per round": 6.32},
          "ntk-fedavg": {"accuracy %": 65.13, "bits per task per round": 6.32},
          "fedper": {"accuracy %": 82.11, "bits per task per round": 5.36},
          "matfl": {"accuracy %": 76.66, "bits per task per round": 6.32},
          "individual": {"accuracy %": 90.21}}
TABLE2 = {"matu": {"accuracy %": 79.47, "bits per task per round": 8.04},
          "fedavg-per-task": {"accuracy %": 51.63, "bits per task per round": 20.43},
          "fedprox": {"accuracy %": 56.32, "bits per task per round": 20.43},
          "ntk-fedavg": {"accuracy %": 56.06, "bits per task per round": 20.43},
          "fedper": {"accuracy %": 48.37, "bits per task per round": 17.16},
          "matfl": {"accuracy %": 67.60, "bits per task per round": 20.43},
          "individual": {"accuracy %": 90.21}}
PAPER_TABLES = ("The paper: ViT-B/32 with LoRA r = 16 on 8 vision datasets, N = 30 clients, ξ = 0.2, R = 100 rounds "
                "of E = 1 step (MaT-FL: 300).")
DIGITS = "the offline `digits-tasks` stand-in (6 tasks), an MLP pretrained on held-out digits with LoRA r = 8"
FASHION_MNIST = ("/usr/share/datasets/fashion-mnist",)  # the 30 tasks' second dataset: Debian's package
THIRTY_SMOKE = (*TWO_ROUNDS, "benchmark.train_per_dataset=60", "benchmark.test_per_dataset=30",
                "benchmark.source_per_dataset=60", "benchmark.tasks=[digits, digits-rotated-parity, "
                "digits-permuted-mod3, fashion, fashion-inverted-parity, fashion-mirrored-mod3]")
RELATEDNESS = (Column("r(S, cosine)", pearson_sign_against("cosine"), fmt="{:.2f}"),
               Column("ARI of S vs domains", groups_recovered("sign"), fmt="{:.2f}"),
               Column("ARI of cosine vs domains", groups_recovered("cosine"), fmt="{:.2f}"),
               Column("S within domains", mean_sign_similarity(within=True), fmt="{:.2f}"),
               Column("S across domains", mean_sign_similarity(within=False), fmt="{:.2f}"))

register(
    PaperExperiment(
        id="matu/table1-single-task",
        title="Table 1: single-task clients",
        shows="average test accuracy and upload with one task per client (ζ_t = 0, ξ = 0.2), MaTU against FedAvg, "
              "FedProx, NTK-FedAvg, FedPer, MaT-FL and individual training.",
        columns=(ACCURACY, BITS),
        scales={"smoke": Scale("configs/matu/digits_single_task.yaml",
                               (*TWO_ROUNDS, "federation.num_clients=6")),
                "cpu": Scale("configs/matu/digits_single_task.yaml", seeds=(0, 1, 2)),
                "paper": Scale(VISION8, (ONE_TASK_PER_CLIENT,), needs=VISION8_NEEDS)},
        paper_numbers=TABLE1,
        paper_note=f"{PAPER_TABLES} Here: {DIGITS}, 30 clients (5 per task), ξ = 0.2, 40 rounds of one local epoch; "
                   "every member runs the same rounds except at the paper scale.",
        runner="matu-paper-rounds",
    ),
    PaperExperiment(
        id="matu/table2-all-baselines",
        title="Table 2: multi-task clients, every baseline",
        shows="average test accuracy and upload with multi-task clients (Dirichlet task allocation), MaTU against "
              "every baseline of the paper: FedAvg, FedProx, NTK-FedAvg, FedPer, MaT-FL and individual training.",
        columns=(ACCURACY, BITS),
        scales={"smoke": Scale("configs/matu/digits_all_baselines.yaml", SMOKE),
                "cpu": Scale("configs/matu/digits_all_baselines.yaml", seeds=(0, 1, 2)),
                "paper": Scale(VISION8, needs=VISION8_NEEDS)},
        paper_numbers=TABLE2,
        paper_note=f"{PAPER_TABLES} ζ_t = 0.5. Here: {DIGITS}, the default job's federation (10 clients, ζ_t = 0.5, "
                   "every client every round, 20 rounds) with a Dirichlet class skew on every task.",
        runner="matu-paper-rounds",
    ),
    PaperExperiment(
        id="matu/table2-paper-shape",
        title="Table 2: multi-task clients in the paper's federation shape",
        shows="Table 2 with the paper's federation: 30 clients, ζ_t = 0.5, ζ_c = 0.1, a fifth of them per round "
              "(ξ = 0.2) for 100 rounds.",
        columns=(ACCURACY, BITS),
        scales={"smoke": Scale("configs/matu/digits_multi_task_paper_shape.yaml",
                               (*TWO_ROUNDS, "federation.num_clients=10")),
                "cpu": Scale("configs/matu/digits_multi_task_paper_shape.yaml", seeds=(0, 1, 2))},
        paper_numbers={k: v for k, v in TABLE2.items() if k in ("matu", "fedavg-per-task", "matfl", "individual")},
        paper_note=f"{PAPER_TABLES} Here: {DIGITS}, N = 30, ζ_t = 0.5, ζ_c = 0.1, ξ = 0.2, 100 rounds of one local "
                   "epoch (not one step) for every member.",
    ),
    PaperExperiment(
        id="matu/fig2-3-task-relatedness",
        title="Figs. 2-3: sign similarity against cosine similarity",
        shows="how MaTU's sign similarity S of the final task vectors relates to their cosine similarity (Pearson's "
              "r over task pairs, the paper's Fig. 3) and how well each finds the true task groups (Fig. 2).",
        columns=RELATEDNESS,
        scales={"smoke": Scale("configs/matu/digits_domains_single_task.yaml",
                               (*TWO_ROUNDS, "federation.num_clients=9"),
                               members=("matu", "matu-none")),
                "cpu": Scale("configs/matu/digits_domains_single_task.yaml", seeds=(0, 1, 2),
                             members=("matu", "matu-none")),
                "paper": Scale(VISION8, (ONE_TASK_PER_CLIENT,), needs=VISION8_NEEDS, members=("matu",))},
        paper_numbers={"matu": {"r(S, cosine)": "> 0.8"}},
        paper_note="The paper compares S of task vectors of 8 vision datasets (ViT-B/32) with cosine similarity, "
                   "LogME, E-Trans, WTE and FIM, Pearson's r > 0.8 with each, and reads 3 task clusters off S. Here: "
                   "the server's final task vectors of MaTU (and of MaTU without its cross-task term, whose vectors "
                   "no mixing pulls together) on the 9 domains tasks with one task per client, against the 3 input "
                   "domains; only cosine similarity of the paper's other measures is computed.",
    ),
    PaperExperiment(
        id="matu/fig4-thirty-tasks",
        title="Fig. 4: the 30-task benchmark",
        shows="accuracy normalized to individual training on 30 tasks with multi-task clients (ζ_t = 0.2), MaTU "
              "against MaT-FL (and FedAvg).",
        columns=(NORMALIZED, ACCURACY),
        scales={"smoke": Scale("configs/matu/fashion_mnist_thirty_tasks.yaml",
                               (*THIRTY_SMOKE, "federation.num_clients=3"), needs=FASHION_MNIST),
                "cpu": Scale("configs/matu/fashion_mnist_thirty_tasks.yaml", seeds=(0, 1, 2))},
        paper_numbers={"matu": {"normalized accuracy %": 77.40}, "matfl": {"normalized accuracy %": 52.62}},
        paper_note="The paper: ViT-B/32 on the 30-task benchmark of Huang et al. (2024), N = 30, ζ_t = 0.2, ξ = 1, "
                   "R = 300 rounds of E = 1 step. Here: `thirty-tasks` (15 tasks each over 8x8 digits and "
                   "Fashion-MNIST: five inputs × three label spaces), an MLP pretrained on held-out images of both "
                   "with LoRA r = 8, N = 30, 50 rounds of one local epoch.",
    ),
    PaperExperiment(
        id="matu/fig5-tasks-per-client",
        title="Fig. 5: scaling the tasks per client",
        shows="upload per client per round (Fig. 5a) and accuracy normalized to individual training (Fig. 5b) as "
              "each client holds k of the 30 tasks, MaTU against MaT-FL and FedAvg.",
        columns=(Column("upload per client per round, kB", upload_per_client, lower_is_better=True), NORMALIZED),
        scales={"smoke": Scale("configs/matu/fashion_mnist_thirty_tasks.yaml",
                               (*THIRTY_SMOKE, "federation.num_clients=2"), needs=FASHION_MNIST),
                "cpu": Scale("configs/matu/fashion_mnist_thirty_tasks.yaml", ("federation.num_clients=10",),
                             seeds=(0, 1, 2))},
        paper_note="The paper: ViT-B/32 on its 30-task benchmark, N = 10, ξ = 1, R = 300, clients holding 2 to 30 "
                   "tasks; it plots MaTU's communication nearly flat in k and the baselines' growing, and MaT-FL's "
                   "accuracy falling beyond 5 tasks while MaTU's holds past 15 (no numbers printed). Here: "
                   "`thirty-tasks`, N = 10, client n holding the k tasks from 3n on, k = 3, 6, 15, 30, 50 rounds.",
        runner="matu-tasks-per-client",
    ),
    PaperExperiment(
        id="matu/fig6a-conflict-groups",
        title="Fig. 6a: task-conflict groups",
        shows="accuracy normalized to individual training when every client holds a fixed group of three tasks "
              "with no, 2 or 3 conflicting ones, MaTU (with and without its cross-task term) against FedAvg and "
              "MaT-FL.",
        columns=(NORMALIZED, ACCURACY),
        scales={"smoke": Scale("configs/matu/digits_domains_conflict_0.yaml",
                               ("rounds=1", "eval_every=1", "federation.num_clients=3"),
                               members=("matu", "fedavg", "individual")),  # 7 runs of 13: a smoke run's time
                "cpu": Scale("configs/matu/digits_domains_conflict_0.yaml", seeds=(0, 1, 2))},
        paper_note="The paper: 10 clients on its 8-task benchmark, each holding three tasks drawn from its 3 task "
                   "clusters, ξ = 1, R = 300; MaTU drops under 6 % as conflicts grow, MaT-FL more (a plot, no numbers "
                   "printed). Here: the 9 domains tasks (3 pixel permutations × 3 label spaces), the domains as "
                   "clusters, 12 clients (4 per group), every client every round, 40 rounds.",
        runner="matu-config-set",
    ),
    PaperExperiment(
        id="matu/fig6b-cross-task",
        title="Fig. 6b: cross-task aggregation variants",
        shows="average test accuracy of MaTU's cross-task aggregation as published (`mean`), as eq. 7 writes it "
              "(`sum`), without it (`none`) and with uniform weights (`uniform`).",
        columns=(ACCURACY,),
        scales={"smoke": Scale("configs/matu/digits_cross_task_ablation.yaml", SMOKE),
                "cpu": Scale("configs/matu/digits_cross_task_ablation.yaml", seeds=(0, 1, 2))},
        paper_note="The paper: its 8-task benchmark in the task-conflict groups, N = 10, ξ = 1, R = 300; MaTU best "
                   "with no conflict, `uniform` worse under conflicts, `none` lower (a plot, no numbers printed; it "
                   "has no `sum` variant). Here: " + DIGITS + ", the default job's federation (10 clients, Dirichlet "
                   "task allocation), 20 rounds.",
    ),
)


# ---------------------------------------------------------------- our analyses around the paper

THIRTY_CLIENTS = ("federation.num_clients=30", "federation.tasks.zeta=0.1",
                  "method=[matu, {name: matu, cross_task: none, label: matu-none}, "
                  "{name: fedavg, per_task: true, label: fedavg-per-task}, matfl]")
DOMAINS_SINGLE = "configs/matu/digits_domains_single_task.yaml"
DOMAINS_MULTI = "configs/matu/digits_domains_multi_task.yaml"
UNIFICATION = "configs/matu/digits_domains_unification_ablation.yaml"
S_RANGE = (Column("S, lowest pair", sign_similarity_bound(highest=False), fmt="{:.2f}"),
           Column("S, highest pair", sign_similarity_bound(highest=True), fmt="{:.2f}"))
DOMAINS = ("the 9 domains tasks (3 fixed pixel permutations × digit, parity and mod-3 labels), an MLP pretrained on "
           "held-out digits with LoRA r = 8")

register(
    PaperExperiment(
        id="matu/analysis-thirty-clients",
        title="Analysis: thirty clients with few tasks each",
        shows="the default job with 30 clients holding 1-4 tasks each (ζ_t = 0.1): MaTU with and without its "
              "cross-task term against one FedAvg model per task and MaT-FL, the accuracy on `permuted` (the task "
              "whose inputs share nothing with the pretraining) and the range of S over task pairs.",
        columns=(ACCURACY, Column("permuted %", task_accuracy("permuted")), *S_RANGE),
        scales={"smoke": Scale("configs/matu/digits_multi_task.yaml", (*THIRTY_CLIENTS, *SMOKE)),
                "cpu": Scale("configs/matu/digits_multi_task.yaml", THIRTY_CLIENTS, seeds=(0, 1, 2))},
        paper_note=f"Not in the paper. {DIGITS}; 30 clients, Dirichlet task allocation ζ_t = 0.1, every client every "
                   "round (not the paper's ξ = 0.2: `matu/table2-paper-shape`), 20 rounds of one local epoch.",
    ),
    PaperExperiment(
        id="matu/analysis-domains-single-task",
        title="Analysis: three input domains, single-task clients",
        shows="accuracy with one task per client on a benchmark of three conflicting task clusters (input domains), "
              "MaTU with and without its cross-task term against one FedAvg model per task, MaT-FL and individual "
              "training, and how well MaTU's S finds the domains.",
        columns=(ACCURACY, Column("ARI of S vs domains", groups_recovered("sign"), fmt="{:.2f}")),
        scales={"smoke": Scale(DOMAINS_SINGLE, (*TWO_ROUNDS, "federation.num_clients=9")),
                "cpu": Scale(DOMAINS_SINGLE, seeds=(0, 1, 2))},
        paper_note=f"Not in the paper. {DOMAINS}; 36 clients, 4 per task, every client every round, 20 rounds.",
    ),
    PaperExperiment(
        id="matu/analysis-domains-multi-task",
        title="Analysis: three input domains, multi-task clients",
        shows="the domains benchmark with multi-task clients (Dirichlet task allocation, ζ_t = 0.5): accuracy and "
              "upload of MaTU with and without its cross-task term against one FedAvg model per task and MaT-FL, "
              "and the range of S over task pairs.",
        columns=(ACCURACY, BITS, *S_RANGE),
        scales={"smoke": Scale(DOMAINS_MULTI, SMOKE, members=("matu", "matu-none", "fedavg", "matfl")),
                "cpu": Scale(DOMAINS_MULTI, seeds=(0, 1, 2), members=("matu", "matu-none", "fedavg", "matfl"))},
        paper_note=f"Not in the paper. {DOMAINS}; 10 clients, ζ_t = 0.5, every client every round, 20 rounds.",
    ),
    PaperExperiment(
        id="matu/analysis-unification",
        title="Analysis: what unification costs",
        shows="MaTU as published against MaTU with `unify: false` (one float vector per task both ways), each with "
              "and without its cross-task term, and one FedAvg model per task, on the domains benchmark with "
              "multi-task clients: accuracy and upload.",
        columns=(ACCURACY, BITS),
        scales={"smoke": Scale(UNIFICATION, SMOKE), "cpu": Scale(UNIFICATION, seeds=(0, 1, 2))},
        paper_note=f"Not in the paper (`unify: false` is our ablation). {DOMAINS}; the federation of "
                   "`digits_domains_multi_task.yaml`: 10 clients, ζ_t = 0.5, every client every round, 20 rounds.",
    ),
)

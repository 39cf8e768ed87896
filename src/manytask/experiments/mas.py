"""MAS's experiments ("MAS: Towards Resource-Efficient Federated Multiple-Task Learning"): Fig. 5 (the `sdnkt`
comparison, its per-task and single-task reference losses, and two tests of why our MAS-2 does not lead the
all-in-one by the paper's margin), Table 1 (split quality), Table 2 (K = 8), Fig. 6 (`erckt`, `sdnkterca`), Fig. 7
(affinities over rounds), Fig. 8 (R0), Fig. 9 (standalone training) and Fig. 10 (E and K).

The measures read what MAS's staged runs log: `split/<task>` (the group serving each task, in the first round
after the split), TAG's `cover/<group>/<task>` and the lookahead affinities `affinity/<i>/<j>` of every measuring
round."""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from manytask.config import RunConfig
from manytask.experiments.measures import engine_rounds, summary_key
from manytask.experiments.runner import RUNNERS, Unit, Workers, run_with_estimate, units
from manytask.experiments.spec import TWO_ROUNDS, Column, Measure, PaperExperiment, Scale, Value, paper, register
from manytask.report.runs import RunRecord

paper("mas", "MAS: Towards Resource-Efficient Federated Multiple-Task Learning",
      "MAS's claim: merging simultaneous FL tasks into one all-in-one model for R0 rounds, then splitting them by "
      "their lookahead affinities and training each group on from the all-in-one parameters, gives a lower total "
      "test loss than one-by-one, all-in-one (FedAvg, FedProx, GradNorm), TAG and HOA training, at about half the "
      "training time of one-by-one.")

LETTERS = {"semseg": "s", "depth": "d", "normals": "n", "keypoints": "k", "texture_edges": "t",
           "occlusion_edges": "e", "reshading": "r", "curvature": "c", "autoencoding": "a"}
REFERENCE_METHODS = ("local", "centralized", "individual")  # private models: every client trains every round

# ---------------------------------------------------------------------------------------------------------- measures


def letters(tasks: Sequence[str]) -> str:
    """Tasks as the paper's letters, in the order given ('sd' for semseg, depth)."""
    return "".join(LETTERS.get(task, task) for task in tasks)


def _first_fit_with(record: RunRecord, prefix: str) -> dict[str, Any] | None:
    return next((row["fit"] for row in record.metrics if any(k.startswith(prefix) for k in row.get("fit") or {})),
                None)


def logged_groups(record: RunRecord) -> tuple[list[list[str]], bool] | None:
    """The groups a staged run trained, each in task order and ordered by its first task, and whether they may
    overlap (TAG's cover); None for a run that logged no split."""
    tasks = record.tasks
    cover = _first_fit_with(record, "cover/")
    if cover is not None:
        count = max(int(key.split("/")[1]) for key in cover if key.startswith("cover/"))
        groups = [[t for t in tasks if cover.get(f"cover/{g}/{t}")] for g in range(1, count + 1)]
        return sorted((g for g in groups if g), key=lambda g: tasks.index(g[0])), True
    split = _first_fit_with(record, "split/")
    if split is None:
        return None
    ids: dict[int, list[str]] = {}
    for task in tasks:
        ids.setdefault(int(split[f"split/{task}"]), []).append(task)
    return sorted(ids.values(), key=lambda g: tasks.index(g[0])), False


def split_text(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    """The split as letters: 'sd|nkt' for a partition, 'sdnkt, sn' for TAG's possibly overlapping groups."""
    found = logged_groups(record)
    if found is None:
        return None
    groups, overlapping = found
    return (", " if overlapping else "|").join(letters(g) for g in groups)


def _partition_key(record: RunRecord) -> frozenset[str] | None:
    """The partition a run logged, as a set of letter groups ({'sd', 'nkt'}); None for none or for TAG's cover."""
    found = logged_groups(record)
    return None if found is None or found[1] else frozenset(letters(g) for g in found[0])


def split_rank(prefix: str) -> Measure:
    """The rank (1: lowest total test loss) among the same seed's members labelled `prefix-<groups>` (the splits of
    one start in Table 1, named by letters: `scratch-sd-nkt`): of the member itself, or, for a member that chose its
    own split (MAS-2), of the `prefix` member that trains that split; None where there is none."""

    def measure(record: RunRecord, runs: Mapping[str, RunRecord]) -> Value:
        starts = {label: frozenset(label[len(prefix) + 1:].split("-")) for label in runs
                  if label.startswith(prefix + "-")}
        mine = _partition_key(record)
        target = record.group if record.group in starts else next(
            (label for label, split in starts.items() if mine is not None and split == mine), None)
        if target is None:
            return None
        ranked = sorted(starts, key=lambda label: float(runs[label].summary["total_test_loss"]))
        return float(ranked.index(target) + 1)

    return measure


def ratio_to(key: str, base: str) -> Measure:
    """A summary number of the member divided by the same of member `base` on the same seed (compute against
    one-by-one's: the paper's ~2x training-time claim)."""

    def measure(record: RunRecord, runs: Mapping[str, RunRecord]) -> Value:
        if base not in runs or record.summary.get(key) is None:
            return None
        theirs = float(runs[base].summary.get(key) or 0)
        return float(record.summary[key]) / theirs if theirs else None

    return measure


def gap_percent(base: str) -> Measure:
    """(total test loss − that of member `base` at the same sweep point) / base's × 100, paired on the seed; None
    for `base` itself. A member `mas-2 channels=[64, 128, 256]` is set against `base channels=[64, 128, 256]`."""

    def measure(record: RunRecord, runs: Mapping[str, RunRecord]) -> Value:
        point = record.group.partition(" ")[2]
        other = f"{base} {point}" if point else base
        if record.group == other or other not in runs:
            return None
        theirs = float(runs[other].summary["total_test_loss"])
        return 100 * (float(record.summary["total_test_loss"]) - theirs) / theirs

    return measure


def task_loss(task: str) -> Measure:
    """The final test loss of one task."""

    def measure(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
        value = ((record.summary.get("tasks") or {}).get(task) or {}).get("loss")
        return None if value is None else float(value)

    return measure


def loss_share(task: str) -> Measure:
    """One task's share of the total test loss, in % (how much of the figure of merit it decides)."""
    own = task_loss(task)

    def measure(record: RunRecord, runs: Mapping[str, RunRecord]) -> Value:
        value, total = own(record, runs), record.summary.get("total_test_loss")
        return None if not isinstance(value, float) or not total else 100 * value / float(total)

    return measure


def r0(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    """MAS's R0: its all-in-one rounds (the default, 30 % of R, where the config leaves it out)."""
    given = (record.summary.get("method_params") or {}).get("r0")
    return float(given) if given is not None else float(max(1, round(0.3 * int(record.summary["rounds"]))))


def affinities(record: RunRecord) -> list[list[list[float]]]:
    """S[i][j] = S_{i→j} of every round that measured all pairs (the round's mean over its clients)."""
    tasks, found = record.tasks, []
    for row in record.metrics:
        fit = row.get("fit") or {}
        keys = [[f"affinity/{a}/{b}" for b in tasks] for a in tasks]
        if all(fit.get(k) is not None for i, line in enumerate(keys) for j, k in enumerate(line) if i != j):
            found.append([[0.0 if i == j else float(fit[k]) for j, k in enumerate(line)]
                          for i, line in enumerate(keys)])
    return found


def _mean_affinity(record: RunRecord) -> list[list[float]] | None:
    rounds = affinities(record)
    if not rounds:
        return None
    n = len(rounds[0])
    return [[statistics.fmean(S[i][j] for S in rounds) for j in range(n)] for i in range(n)]


def _strongest(record: RunRecord) -> tuple[int, int, float] | None:
    mean = _mean_affinity(record)
    if mean is None:
        return None
    pairs = [(i, j) for i in range(len(mean)) for j in range(len(mean)) if i != j]
    i, j = max(pairs, key=lambda pair: mean[pair[0]][pair[1]])
    return i, j, mean[i][j]


def strongest_pair(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    """The ordered pair i→j with the highest affinity averaged over the measured rounds, as letters ('d→s')."""
    found = _strongest(record)
    return None if found is None else f"{letters([record.tasks[found[0]]])}→{letters([record.tasks[found[1]]])}"


def strongest_value(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    """The mean S of that pair over the measured rounds."""
    found = _strongest(record)
    return None if found is None else found[2]


def split_agreement(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    """The % of measured rounds whose affinities alone would have chosen the split the run chose (MAS's best
    partition into as many groups): how early, and how steadily, the split shows (the paper's Fig. 7 claim)."""
    import torch

    from manytask.methods.mas.grouping import best_partition

    chosen, rounds = _partition_key(record), affinities(record)
    if chosen is None or not rounds:
        return None
    tasks = record.tasks
    agree = [frozenset(letters([tasks[i] for i in g]) for g in best_partition(torch.tensor(S), len(chosen)))
             == chosen for S in rounds]
    return 100 * sum(agree) / len(agree)


def measured_rounds(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    return float(len(affinities(record)))


# ------------------------------------------------------------------------------------------------------------ runner


def every_client(unit: Unit) -> Unit:
    """A reference member's unit (standalone `local`, `centralized`) set to train every client in every round: its
    rounds are then epochs of each client's own data (of each task's pooled data), as training alone is, where the
    federated members of the same config sample K clients a round. Other units as they are."""
    data = yaml.safe_load(unit.config)
    if data["method"]["name"] not in REFERENCE_METHODS:
        return unit
    data.update(clients_per_round=None, participation=1.0)
    return dataclasses.replace(unit, config=yaml.safe_dump(data, sort_keys=False))


def references_runner(experiment: PaperExperiment, scale: Scale, config: RunConfig, out: Path, workers: Workers,
                      probe: bool) -> list[Unit]:
    """The members runner, with every reference member training all of its clients each round (`every_client`)."""
    todo = [every_client(unit) for unit in units(config, out, scale.members)]
    run_with_estimate(todo, workers, probe)
    return todo


RUNNERS["mas-references"] = references_runner

# ------------------------------------------------------------------------------------------------------- the scales

COMPARISON = "configs/mas/sdnkt_comparison.yaml"
TASKONOMY = "configs/mas/taskonomy_sdnkt.yaml"
TASKONOMY_NEEDS = ("data/taskonomy",)
SEEDS = (0, 1, 2)
SDNKT = ("semseg", "depth", "normals", "keypoints", "texture_edges")
SDNKTERCA = (*SDNKT, "occlusion_edges", "reshading", "curvature", "autoencoding")
ERCKT = ("occlusion_edges", "reshading", "curvature", "keypoints", "texture_edges")
# every smoke run: 4 buildings of 16x16 images, 2 rounds of 2 clients
SMOKE = (*TWO_ROUNDS, "benchmark.size=16", "benchmark.buildings=4", "federation.num_clients=4",
         "benchmark.train_per_task=32", "benchmark.test_size=8", "clients_per_round=2")


def methods(entries: Sequence[dict[str, Any] | str]) -> str:
    """An override giving the member list (as JSON, which is YAML)."""
    return "method=" + json.dumps(list(entries))


def mas(label: str, groups: int, r0_rounds: int, **params: Any) -> dict[str, Any]:
    """A MAS member splitting into `groups` after `r0_rounds`, on the affinities of round min(10, R0)."""
    return {"name": "mas", "label": label, "groups": groups, "r0": r0_rounds,
            "affinity_round": min(10, r0_rounds), **params}


def only(entries: Sequence[dict[str, Any] | str], labels: Sequence[str]) -> list[dict[str, Any] | str]:
    """The entries with these labels (a bare method name is its own label)."""
    return [e for e in entries if (e if isinstance(e, str) else e["label"]) in labels]


def smoke_comparison(labels: Sequence[str]) -> str:
    """The `sdnkt` comparison's members (configs/mas/sdnkt_comparison.yaml) that have `labels`, with every stage
    one round long (R0, TAG's affinity rounds, HOA's probes) for the 2 smoke rounds."""
    entries: list[dict[str, Any] | str] = [
        *(mas(f"mas-{x}", x, 1) for x in (2, 3, 4)), "one-by-one", {"name": "fedavg", "label": "all-in-one-fedavg"},
        {"name": "fedprox", "label": "all-in-one-fedprox", "mu": 0.01},
        {"name": "gradnorm", "label": "all-in-one-gradnorm"},
        *({"name": "tag", "label": f"tag-{x}", "groups": x, "affinity_rounds": 1} for x in (2, 3, 4)),
        *({"name": "hoa", "label": f"hoa-{x}", "groups": x, "probe_rounds": 1} for x in (2, 3, 4)), "centralized"]
    return methods(only(entries, labels))


def split_members(r0_rounds: int) -> list[dict[str, Any]]:
    """Table 1's members (configs/mas/sdnkt_split_quality.yaml): MAS-2, then every split of `sdnkt` into two groups
    from scratch and from the all-in-one parameters, labelled by letters with semseg's group first."""
    from manytask.methods.mas.grouping import partitions_into

    splits = [[[SDNKT[i] for i in group] for group in split] for split in partitions_into(len(SDNKT), 2)]
    named = [("-".join(letters(g) for g in split), split) for split in splits]
    return [mas("mas-2", 2, r0_rounds),
            *({"name": "fixed-split", "label": f"scratch-{name}", "partition": split} for name, split in named),
            *({"name": "mas", "label": f"all-in-one-{name}", "r0": r0_rounds, "partition": split}
              for name, split in named)]


FIG5_MEMBERS = ("mas-2", "mas-3", "mas-4", "one-by-one", "all-in-one-fedavg", "all-in-one-fedprox",
                "all-in-one-gradnorm", "tag-2", "tag-3", "tag-4", "hoa-2", "hoa-3", "hoa-4")
# one member of each method for the smoke run (all thirteen would take it far past its few seconds)
FIG5_SMOKE = ("mas-2", "one-by-one", "all-in-one-fedavg", "all-in-one-fedprox", "all-in-one-gradnorm", "tag-2", "hoa-2")
# MAS-2 and three splits from each start (all 31 would take the smoke run far past its few seconds)
TABLE1_SMOKE = ("mas-2", *(f"{start}-{split}" for start in ("scratch", "all-in-one")
                           for split in ("sd-nkt", "snk-dt", "s-dnkt")))
REFERENCE_MEMBERS = ("centralized", "one-by-one", "all-in-one-fedavg", "mas-2")
GROUPING_MEMBERS = ("mas-2", "mas-3", "one-by-one", "all-in-one-fedavg")
GAP_DATA_SMOKE = ("mas-2", "one-by-one", "all-in-one-fedavg")


def taskonomy(*overrides: str, members: tuple[str, ...] = (), seeds: tuple[int, ...] = SEEDS) -> Scale:
    """A paper scale: the paper's Taskonomy setting (configs/mas/taskonomy_sdnkt.yaml) with overrides."""
    return Scale(TASKONOMY, overrides, seeds, TASKONOMY_NEEDS, members)


# ---------------------------------------------------------------------------------------------------------- columns

TOTAL = Column("total test loss", summary_key("total_test_loss"), fmt="{:.4f}", lower_is_better=True)
COMPUTE = Column("client compute s", summary_key("client_compute_seconds"), fmt="{:.0f}", lower_is_better=True)
SPLIT = Column("split", split_text)
VS_ONE_BY_ONE = Column("compute ÷ one-by-one", ratio_to("client_compute_seconds", "one-by-one"), fmt="{:.2f}",
                       lower_is_better=True)
ROUNDS = Column("engine rounds", engine_rounds, fmt="{:.0f}")

# the paper's Fig. 5 table: total test loss, and training time in GPU·h (here as a fraction of one-by-one's 16.9)
FIG5_LOSS = {"one-by-one": 0.603, "all-in-one-fedavg": 0.677, "all-in-one-fedprox": 0.711, "all-in-one-gradnorm": 0.691,
             "hoa-2": 0.651, "hoa-3": 0.598, "hoa-4": 0.597, "tag-2": 0.624, "tag-3": 0.613, "tag-4": 0.603,
             "mas-2": 0.578, "mas-3": 0.555, "mas-4": 0.548}
FIG5_GPU_HOURS = {"one-by-one": 16.9, "all-in-one-fedavg": 7.3, "all-in-one-fedprox": 7.7, "all-in-one-gradnorm": 7.8,
                  "hoa-2": 63.0, "hoa-3": 63.0, "hoa-4": 63.0, "tag-2": 17.4, "tag-3": 20.5, "tag-4": 25.2,
                  "mas-2": 8.8, "mas-3": 9.7, "mas-4": 12.9}
SCENES = ("Here: the offline `scenes` buildings (32 clients of 18 to 74 images of 32x32, 1 280 in all, every image "
          "labelled for every task), a 3-level CNN encoder (16/32/64 channels) with FCN decoders, K = 4, E = 1, batch "
          "16, R = 40")
SCENES_NOTE = f"{SCENES}, R0 = 12, the split from round 10's affinities."
PAPER_SETTING = ("The paper: Taskonomy, 32 clients of one building each (4k to 16k images), a modified Xception "
                 "encoder, K = 4, E = 1, batch 64, R = 100, R0 = 30 to 40, 3 runs.")


def fig5() -> PaperExperiment:
    return PaperExperiment(
        id="mas/fig5-sdnkt-comparison",
        title="Fig. 5: the sdnkt comparison",
        shows="total test loss over the five sdnkt tasks and client compute of MAS-2/3/4 against one-by-one, the "
              "all-in-one model (FedAvg, FedProx, GradNorm), TAG-2/3/4 and HOA-2/3/4.",
        columns=(TOTAL, COMPUTE, VS_ONE_BY_ONE, SPLIT),
        scales={"smoke": Scale(COMPARISON, (*SMOKE, smoke_comparison(FIG5_SMOKE)), members=FIG5_SMOKE),
                "cpu": Scale(COMPARISON, seeds=SEEDS, members=FIG5_MEMBERS),
                "paper": taskonomy(members=FIG5_MEMBERS)},
        paper_numbers={label: {"total test loss": loss,
                               "compute ÷ one-by-one": round(FIG5_GPU_HOURS[label] / FIG5_GPU_HOURS["one-by-one"], 2)}
                       for label, loss in FIG5_LOSS.items()},
        paper_note=f"{PAPER_SETTING} Its training time is in GPU·h (one-by-one 16.9); the paper's column here is each "
                   f"method's GPU·h over one-by-one's. {SCENES_NOTE} TAG and HOA train their groups from scratch.",
    )


def per_task_losses() -> PaperExperiment:
    tasks = [Column(f"{LETTERS[t]} loss", task_loss(t), fmt="{:.4f}", lower_is_better=True) for t in SDNKT]
    return PaperExperiment(
        id="mas/fig5-per-task-losses",
        title="Fig. 5: per-task and reference losses",
        shows="each sdnkt task's final test loss for MAS-2, the all-in-one FedAvg model, one-by-one (each task alone "
              "in FL) and the centralized single-task reference (each task alone on every client's data pooled), "
              "with the texture-edge loss's share of the total.",
        columns=(*tasks, TOTAL, Column("t share %", loss_share("texture_edges"))),
        scales={"smoke": Scale(COMPARISON, (*SMOKE, smoke_comparison(REFERENCE_MEMBERS)),
                               members=REFERENCE_MEMBERS),
                "cpu": Scale(COMPARISON, seeds=SEEDS, members=REFERENCE_MEMBERS),
                "paper": taskonomy(members=REFERENCE_MEMBERS)},
        runner="mas-references",
        paper_note=f"{PAPER_SETTING} It reports only the total (Fig. 5), not each task's loss nor a single-task "
                   f"reference. {SCENES_NOTE} The centralized reference trains every task's pooled data each round "
                   "(R = 40 epochs): the single-task reference the federated models are set against.",
    )


def table1() -> PaperExperiment:
    return PaperExperiment(
        id="mas/table1-split-quality",
        title="Table 1: MAS's split against every split",
        shows="total test loss of every split of sdnkt into two groups, trained from scratch and from the all-in-one "
              "parameters, each ranked within its start, and where MAS-2's own split ranks in each.",
        columns=(TOTAL, SPLIT, Column("rank from scratch", split_rank("scratch"), fmt="{:.0f}", lower_is_better=True),
                 Column("rank from the all-in-one", split_rank("all-in-one"), fmt="{:.0f}", lower_is_better=True)),
        scales={"smoke": Scale("configs/mas/sdnkt_split_quality.yaml",
                               (*SMOKE, methods(only(split_members(1), TABLE1_SMOKE))), members=TABLE1_SMOKE),
                "cpu": Scale("configs/mas/sdnkt_split_quality.yaml"),
                "paper": taskonomy(methods(split_members(40)))},
        paper_numbers={"mas-2": {"total test loss": 0.578},
                       "best split from scratch": {"total test loss": 0.622},
                       "worst split from scratch": {"total test loss": 0.685},
                       "best split from the all-in-one": {"total test loss": 0.595},
                       "worst split from the all-in-one": {"total test loss": 0.595}},
        paper_note=f"{PAPER_SETTING} Its Table 1 gives MAS's loss and the best and worst of the 15 two-group splits "
                   "of sdnkt from each start (and the same for three groups and for erckt, not run here). "
                   f"{SCENES_NOTE} One seed: 31 runs.",
    )


def table2() -> PaperExperiment:
    return PaperExperiment(
        id="mas/table2-k8",
        title="Table 2: K = 8 clients per round",
        shows="total test loss of MAS-2 against the all-in-one FedAvg model on sdnkt with 8 clients per round.",
        columns=(TOTAL, COMPUTE, SPLIT),
        scales={"smoke": Scale("configs/mas/sdnkt_k8.yaml", (*SMOKE, "clients_per_round=4",
                                                              methods([mas("mas-2", 2, 1),
                                                                       {"name": "fedavg",
                                                                        "label": "all-in-one-fedavg"}]))),
                "cpu": Scale("configs/mas/sdnkt_k8.yaml", seeds=SEEDS),
                "paper": taskonomy("clients_per_round=8", members=("mas-2", "all-in-one-fedavg"))},
        paper_numbers={"all-in-one-fedavg": {"total test loss": 0.618}, "mas-2": {"total test loss": 0.512}},
        paper_note=f"{PAPER_SETTING} Table 2 is the same with K = 8. {SCENES_NOTE.replace('K = 4', 'K = 8')}",
    )


def fig6(task_set: str, tasks: tuple[str, ...], numbers: dict[str, dict[str, Value]]) -> PaperExperiment:
    batch = 32 if len(tasks) > 5 else 64  # the paper's batch; half the encoder's parameters for nine tasks
    half = ("model.width=45",) if len(tasks) > 5 else ()
    return PaperExperiment(
        id=f"mas/fig6-{task_set}",
        title=f"Fig. 6: the {task_set} comparison",
        shows=f"total test loss and client compute over the {len(tasks)} tasks of {task_set}: MAS-2/3 against "
              "one-by-one and the all-in-one FedAvg model.",
        columns=(TOTAL, COMPUTE, VS_ONE_BY_ONE, SPLIT),
        scales={"smoke": Scale(f"configs/mas/{task_set}_comparison.yaml",
                               (*SMOKE, methods([mas("mas-2", 2, 1), mas("mas-3", 3, 1), "one-by-one",
                                                 {"name": "fedavg", "label": "all-in-one-fedavg"}]))),
                "cpu": Scale(f"configs/mas/{task_set}_comparison.yaml", seeds=SEEDS),
                "paper": taskonomy(f"benchmark.tasks={json.dumps(list(tasks))}", f"train.batch_size={batch}", *half,
                                   members=GROUPING_MEMBERS)},
        paper_numbers=numbers,
        paper_note=f"{PAPER_SETTING.replace('batch 64', f'batch {batch}')} Fig. 6 plots {task_set} without numbers"
                   + ("; MAS-2's and MAS-3's losses are those of its Table 1. " if numbers else
                      " (a half-size encoder for nine tasks). ") + SCENES_NOTE,
    )


def fig7() -> PaperExperiment:
    config = "configs/mas/sdnkt_affinity.yaml"
    return PaperExperiment(
        id="mas/fig7-affinity",
        title="Fig. 7: affinities over rounds",
        shows="the lookahead affinities measured in every all-in-one round: the strongest pair on average, and in how "
              "many rounds the affinities alone would have chosen the split MAS took from round 10.",
        columns=(SPLIT, Column("rounds measured", measured_rounds, fmt="{:.0f}"),
                 Column("strongest pair", strongest_pair), Column("its mean S", strongest_value, fmt="{:.3f}"),
                 Column("rounds agreeing with the split %", split_agreement), TOTAL),
        scales={"smoke": Scale(config, (*SMOKE, "rounds=4", "eval_every=4",
                                        methods([mas("mas-2-affinity", 2, 2, affinity_rounds="all")]))),
                "cpu": Scale(config, seeds=SEEDS),
                "paper": taskonomy(f"benchmark.tasks={json.dumps(list(SDNKTERCA))}", "train.batch_size=32",
                                   "model.width=45", methods([mas("mas-2-affinity", 2, 40, affinity_rounds="all")]))},
        paper_note="The paper plots the affinities onto three tasks of sdnkterca over rounds (d and r help each other "
                   "most; the trends show early, so it splits on round 10's) without numbers. "
                   f"{SCENES.replace('buildings', 'buildings with sdnkt')}, R0 = 20 with every all-in-one round "
                   "measured, the split from round 10's affinities.",
    )


def fig8() -> PaperExperiment:
    config = "configs/mas/sdnkt_r0_sweep.yaml"
    smoke = [mas(f"mas-2-r0-{r}", 2, small) for r, small in ((4, 1), (20, 2), (36, 3))]  # of R = 4
    return PaperExperiment(
        id="mas/fig8-r0-sweep",
        title="Fig. 8: when to split (R0)",
        shows="total test loss of MAS-2 split after R0 all-in-one rounds of R = 40, R0 from 4 to 36.",
        columns=(Column("R0", r0, fmt="{:.0f}"), ROUNDS, TOTAL, COMPUTE, SPLIT),
        scales={"smoke": Scale(config, (*SMOKE, "rounds=4", "eval_every=4", methods(smoke)),
                               members=tuple(entry["label"] for entry in smoke)),
                "cpu": Scale(config, seeds=SEEDS),
                "paper": taskonomy(methods([mas(f"mas-2-r0-{r}", 2, r) for r in range(10, 100, 10)]))},
        paper_note="The paper sweeps R0 from 10 to 90 of R = 100 on sdnkt, erckt and sdnkterca and finds R0 = 30 or 40 "
                   f"best (a plot, without numbers). {SCENES}; each R0 splits on the affinities of round "
                   "min(10, R0).",
    )


def fig9() -> PaperExperiment:
    config = "configs/mas/sdnkt_standalone.yaml"
    members = [{"name": "local", "label": "standalone"}, {"name": "fedavg", "label": "all-in-one-fedavg"}]
    return PaperExperiment(
        id="mas/fig9-standalone",
        title="Fig. 9: standalone training",
        shows="total test loss of every client training an all-in-one model on its own data alone (mean over the 32 "
              "clients' models) against the federated all-in-one FedAvg model and MAS-2.",
        columns=(TOTAL, COMPUTE),
        scales={"smoke": Scale(config, (*SMOKE, methods([*members, mas("mas-2", 2, 1)]))),
                "cpu": Scale(config, seeds=SEEDS),
                "paper": taskonomy(methods([*members, mas("mas-2", 2, 40)]))},
        runner="mas-references",
        paper_note="The paper (sdnkt on Taskonomy) plots each of its 32 clients' standalone test loss (Fig. 9a) and "
                   "their comparison with the FL methods (Fig. 9b), without numbers: both FL methods are far better. "
                   f"{SCENES_NOTE} The standalone clients train every round (R = 40 epochs of their own data); the "
                   "runs record the mean over clients, not each client's loss, so Fig. 9a is not drawn."
    )


def fig10_local_epochs() -> PaperExperiment:
    config = "configs/mas/sdnkt_local_epochs.yaml"
    smoke = [{"name": "fedavg", "label": f"all-in-one-e{e}", "train": {"local_epochs": e}} for e in (1, 2, 5, 10)]
    return PaperExperiment(
        id="mas/fig10-local-epochs",
        title="Fig. 10a: local epochs E",
        shows="total test loss and client compute of the all-in-one FedAvg model with E = 1, 2, 5, 10 local epochs, "
              "R fixed, and of MAS-2 at E = 1.",
        columns=(TOTAL, COMPUTE, Column("compute ÷ E = 1", ratio_to("client_compute_seconds", "all-in-one-e1"),
                                        fmt="{:.2f}", lower_is_better=True)),
        scales={"smoke": Scale(config, (*SMOKE, methods([*smoke, mas("mas-2", 2, 1)]))),
                "cpu": Scale(config, seeds=SEEDS),
                "paper": taskonomy(methods([*smoke, mas("mas-2", 2, 40)]))},
        paper_note="The paper (sdnkt, all-in-one, R = 100) plots E = 1, 2, 5, 10 without numbers: a larger E lowers "
                   "the loss, E = 10 no more than E = 5, and MAS beats E = 5 at about a fifth of its computation. "
                   + SCENES_NOTE,
    )


def fig10_clients_per_round() -> PaperExperiment:
    config = "configs/mas/sdnkt_clients_per_round.yaml"
    return PaperExperiment(
        id="mas/fig10-clients-per-round",
        title="Fig. 10b: clients per round K",
        shows="total test loss and client compute of the all-in-one FedAvg model with K = 2, 4, 6, 8, 16 clients per "
              "round, R fixed.",
        columns=(TOTAL, COMPUTE),
        scales={"smoke": Scale(config, (*SMOKE, "benchmark.buildings=16", "federation.num_clients=16",
                                        "benchmark.train_per_task=64")),
                "cpu": Scale(config, seeds=SEEDS),
                "paper": taskonomy("method=[{name: fedavg, label: all-in-one-fedavg}]",
                                   "sweep={clients_per_round: [2, 4, 6, 8, 16]}")},
        paper_note="The paper (sdnkt, all-in-one, R = 100) plots K = 2, 4, 6, 8, 16 without numbers: a larger K "
                   "lowers the loss, less and less. " + SCENES_NOTE,
    )


def gap_data() -> PaperExperiment:
    config = "configs/mas/sdnkt_data_4x.yaml"
    members = GAP_DATA_SMOKE
    return PaperExperiment(
        id="mas/fig5-gap-data",
        title="Fig. 5's gap: 4x data per client",
        shows="the sdnkt comparison with each building's images x4 (72 to 296 a client): whether more data per "
              "client puts MAS-2 ahead of the all-in-one model by the paper's margin.",
        columns=(TOTAL, Column("vs all-in-one %", gap_percent("all-in-one-fedavg"), fmt="{:+.1f}",
                               lower_is_better=True), COMPUTE, SPLIT),
        scales={"smoke": Scale(config, (*SMOKE, "benchmark.train_per_task=128", smoke_comparison(GAP_DATA_SMOKE)),
                               members=GAP_DATA_SMOKE),
                "cpu": Scale(config, seeds=SEEDS)},
        paper_numbers={label: {"total test loss": FIG5_LOSS[label]} for label in members},
        paper_note=f"{PAPER_SETTING} Its MAS-2 is 15 % below the all-in-one FedAvg model (0.578 against 0.677). "
                   f"{SCENES_NOTE.replace('18 to 74 images', '72 to 296 images').replace('1 280', '5 120')}",
    )


def gap_capacity() -> PaperExperiment:
    config = "configs/mas/sdnkt_capacity.yaml"
    return PaperExperiment(
        id="mas/fig5-gap-capacity",
        title="Fig. 5's gap: the encoder's capacity",
        shows="MAS-2, the all-in-one FedAvg model and one-by-one with the comparison's encoder (16/32/64 channels) "
              "and one 4x as wide (64/128/256): whether more shared capacity puts MAS-2 and one-by-one ahead of the "
              "all-in-one, as in the paper.",
        columns=(TOTAL, Column("vs all-in-one %", gap_percent("all-in-one-fedavg"), fmt="{:+.1f}",
                               lower_is_better=True), COMPUTE, SPLIT),
        scales={"smoke": Scale(config, (*SMOKE, methods([mas("mas-2", 2, 1),
                                                         {"name": "fedavg", "label": "all-in-one-fedavg"},
                                                         "one-by-one"]))),
                "cpu": Scale(config, seeds=SEEDS)},
        paper_numbers={"MAS-2 (paper)": {"total test loss": 0.578},
                       "all-in-one FedAvg (paper)": {"total test loss": 0.677},
                       "one-by-one (paper)": {"total test loss": 0.603}},
        paper_note=f"{PAPER_SETTING} Its MAS-2 is 15 % below the all-in-one FedAvg model and one-by-one 11 % below "
                   f"it. {SCENES_NOTE} Our encoder has 24 k parameters, about as many as the five decoders together "
                   "(21 k); the wide one has 372 k.",
    )


register(fig5(), per_task_losses(), gap_capacity(), gap_data(), table1(), table2(),
         fig6("erckt", ERCKT, {"mas-2": {"total test loss": 1.039}, "mas-3": {"total test loss": 1.015}}),
         fig6("sdnkterca", SDNKTERCA, {}), fig7(), fig8(), fig9(), fig10_local_epochs(), fig10_clients_per_round())

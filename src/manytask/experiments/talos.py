"""FL + TaLoS's experiments ("Analyzing TaLoS in Federated Learning Scenarios"): Tables 1-4 and Figs. 1-12, and the
control of the gap between the paper's TaLoS gain and ours.

The offline stand-in is `scene-objects` under the protocol of configs/talos/scene_objects_protocol.yaml (a plateaued
head-only start, as many sparse rounds as head rounds); the paper's setting is configs/talos/cifar100_vit_s16.yaml.
The paper's tables cross its members with data splits (IID, N_c classes per client), local steps J at a constant
J × rounds, and phase lengths, none of which a config's member list can vary: the `talos-settings` runner runs each
member once per setting of the experiment (`SETTINGS`), labelled `<member> <setting>`."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from manytask.config import RunConfig, resolve, to_yaml, validate
from manytask.errors import ManytaskError
from manytask.experiments.measures import accuracy, accuracy_at_phase_end, gain_over_phase_end, minus_member
from manytask.experiments.runner import RUNNERS, Unit, Workers, repository_root, run_with_estimate, units
from manytask.experiments.spec import Column, Measure, PaperExperiment, Scale, Value, paper, register
from manytask.report.runs import RunRecord, eval_rows

paper("talos", "FL + TaLoS: Analyzing TaLoS in Federated Learning Scenarios",
      "The paper's claim: TaLoS (sparse fine-tuning of the backbone entries least sensitive by the Fisher diagonal) "
      "lifts FL head-only on a DINO ViT-S/16 from 44.51 to 53.90 % on IID CIFAR-100 (and from 42.88 to 52.14 % at "
      "N_c = 50), with little or none at N_c = 5 and 1; disjoint parameter partitions gain less (47.58 %), and a "
      "one-shot assembly of the partitions collapses to chance (1.08 % at N_c = 1).")

HEAD, CALIBRATION, SPARSE = 0, 1, 2  # TaLoS's phases, as its rounds log them in `fit.phase`
PROTOCOL = "configs/talos/scene_objects_protocol.yaml"
CENTRALIZED = "configs/talos/scene_objects_centralized.yaml"
PAPER_CONFIG = "configs/talos/cifar100_vit_s16.yaml"
NEEDS = ("data/cifar-100-python", "checkpoints/dino-vits16")
PAPER_HEAD = ("rounds=300",)  # the paper's head-only runs: 300 rounds of J = 4 (its Fig. 2's trade-off)
QKV = re.compile(r"(q_proj|k_proj|v_proj|query|key|value)\.weight$")

# smoke: scene-objects shrunk to 10 classes of 20 images, a 2-block ViT of width 16 pretrained for one epoch,
# batches of 8, 10 clients, 6 rounds
SMOKE_DATA = ("benchmark.classes=10", "benchmark.source_classes=4", "benchmark.train_per_class=20",
              "benchmark.test_per_class=10", "benchmark.source_per_class=20", "model.pretrain.epochs=1",
              "model.hidden_size=16", "model.num_hidden_layers=2", "model.num_attention_heads=2",
              "model.intermediate_size=32", "train.batch_size=8", "federation.num_clients=10", "eval_every=2")
SMOKE = (*SMOKE_DATA, "rounds=6")
# the protocol's members with the one-shot's round cut from 80 local steps to 8
SMOKE_PROTOCOL = (*SMOKE, "method=[head-only, {name: talos, calibration_rounds: 5}, {name: talos-partition, "
                  "calibration_rounds: 5}, {name: talos-oneshot, shot_steps: 8, calibration_rounds: 5}]")
# the centralized members with 4 steps a round instead of 40
SMOKE_CENTRAL = (*SMOKE, "method=[{name: centralized-head-only, train: {local_steps: 4}}, {name: centralized-talos, "
                 "calibration_rounds: 5, train: {local_steps: 4}}, {name: centralized-talos, label: centralized-dense, "
                 "sparsity: 0.0, calibration_rounds: 1, train: {local_steps: 4}}]")
SMOKE_GRID = (*SMOKE_DATA, "rounds=2", "method=[{name: centralized-head-only, train: {local_steps: 4}}]")
PAPER_CLASSES = 100  # CIFAR-100's classes, of which the paper's N_c are a count


def shards(classes_per_client: int) -> str:
    """The override of the paper's pathological split: every client holds `classes_per_client` classes."""
    return f"federation.samples={{kind: shards, classes_per_client: {classes_per_client}}}"


def scaled_shards(config: RunConfig, classes_per_client: int) -> str:
    """The paper's split N_c (of its 100 classes) on `config`'s data: the same share of its classes, and at least
    as many as let its clients cover them all (the smoke's 10 classes on 10 clients); N_c itself at 100 classes."""
    classes = int(config.benchmark.get("classes", PAPER_CLASSES))
    share = max(1, round(classes_per_client * classes / PAPER_CLASSES))
    return shards(max(share, math.ceil(classes / config.federation.num_clients)))


# --- measures -------------------------------------------------------------------------------------------------


def _last_evaluation(record: RunRecord, round_: int) -> Value:
    """The average (in %) of the last evaluation at or before `round_` (1-based)."""
    rows = [row for row in eval_rows(record) if row["round"] <= round_ and row.get("average") is not None]
    return 100 * float(rows[-1]["average"]) if rows else None


def accuracy_at_share(share: float) -> Measure:
    """The accuracy at a share of the run's rounds (its last evaluation by then): a point of a curve that holds
    at every scale (a quarter of 240 rounds is round 60)."""

    def measure(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
        rounds = max((row["round"] for row in record.metrics), default=0)
        return _last_evaluation(record, math.ceil(share * rounds)) if rounds else None

    return measure


def _phase_rounds(record: RunRecord, phase: int) -> list[int]:
    return [row["round"] for row in record.metrics if (row.get("fit") or {}).get("phase") == phase]


def accuracy_into_phase(phase: int, share: float) -> Measure:
    """The accuracy after a share of phase `phase`'s rounds (its last evaluation by then): whether TaLoS's sparse
    curve is still rising halfway; None for a run without that phase."""

    def measure(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
        rounds = _phase_rounds(record, phase)
        return _last_evaluation(record, rounds[0] + math.ceil(share * len(rounds)) - 1) if rounds else None

    return measure


def train_loss_tail(share: float) -> Measure:
    """The clients' mean training loss over the last `share` of the rounds: the paper's Fig. 9 plots the clients'
    training accuracy, which the rounds do not log; their training loss shows the same specialization."""

    def measure(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
        rows = [row for row in record.metrics if row.get("fit")]
        tail = rows[len(rows) - max(1, math.ceil(share * len(rows))):]
        losses = [value for row in tail for key, value in row["fit"].items() if key.startswith("train_loss/")]
        return statistics.fmean(losses) if losses else None

    return measure


def _trainable_fractions(record: RunRecord) -> dict[str, float]:
    """The calibration round's trainable fraction of every scored parameter (the clients' mean), by name."""
    for row in record.metrics:
        fit = row.get("fit") or {}
        if fit.get("phase") == CALIBRATION:
            return {key.split("/", 1)[1]: float(v) for key, v in fit.items() if key.startswith("trainable/")}
    return {}


def mask_parameters(outside_qkv: bool) -> Measure:
    """How many scored parameters hold a trainable entry (the layers the paper's Fig. 4 labels), or only those
    outside the attention Q, K, V weights (its "noise across other layers"); None without a calibration."""

    def measure(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
        fractions = _trainable_fractions(record)
        if not fractions:
            return None
        return float(sum(1 for name, f in fractions.items() if f > 0 and not (outside_qkv and QKV.search(name))))

    return measure


def qkv_share(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    """The mean trainable fraction of the Q, K, V weight matrices, in % (the whole mask keeps 1 − ρ*): how strongly
    the mask concentrates in self-attention."""
    fractions = [f for name, f in _trainable_fractions(record).items() if QKV.search(name)]
    return 100 * statistics.fmean(fractions) if fractions else None


def upload_per_round(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    """The mean upload (kB, every sampled client) of a round of the run's last phase: the sparse rounds of TaLoS,
    the one shot of the one-shot variant, every round of head-only."""
    phases = [row["fit"]["phase"] for row in record.metrics if "phase" in (row.get("fit") or {})]
    last = max(phases, default=None)
    rows = [row for row in record.metrics if last is None or (row.get("fit") or {}).get("phase") == last]
    return statistics.fmean(sum(row["bytes_up"].values()) for row in rows) / 1e3 if rows else None


# --- the settings runner --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One setting an experiment runs its members in: a name added to their labels (none: the labels as they are),
    config overrides, and the members it applies to (all where empty). `classes_per_client` is the paper's
    pathological split N_c (of its 100 classes), scaled to the config's classes (`scaled_shards`); `local_steps` sets
    J and scales the rounds so that J × rounds stays the config's (the paper's J sweep); `sparse_share` stretches
    TaLoS's sparse phase to that share of the config's, its head phase unchanged."""

    name: str = ""
    overrides: tuple[str, ...] = ()
    members: tuple[str, ...] = ()
    classes_per_client: int | None = None
    local_steps: int | None = None
    sparse_share: float | None = None


SETTINGS: dict[str, tuple[Setting, ...]] = {}


def adjusted(config: dict[str, Any], setting: Setting, label: str) -> dict[str, Any]:
    """A member's single-run config in `setting`: labelled `label`, with its J or its sparse phase changed."""
    data = {**config, "method": {**config["method"], "label": label}, "train": dict(config["train"])}
    if setting.local_steps is not None:
        data["rounds"] = max(1, data["rounds"] * data["train"]["local_steps"] // setting.local_steps)
        data["train"]["local_steps"] = setting.local_steps
    if setting.sparse_share is not None:
        head = data["method"].get("head_rounds") or max(1, data["rounds"] // 2)
        sparse = max(1, round(setting.sparse_share * (data["rounds"] - head - 1)))
        data["method"]["head_rounds"], data["rounds"] = head, head + 1 + sparse
    return data


def setting_config(scale: Scale, setting: Setting, seeds: list[int]) -> RunConfig:
    """The scale's config in `setting` (its overrides, then its split), on `seeds`."""
    given = [*scale.overrides, *setting.overrides, f"seeds=[{','.join(map(str, seeds))}]"]
    config = resolve(str(repository_root() / scale.config), given)
    if setting.classes_per_client is None:
        return config
    return resolve(str(repository_root() / scale.config),
                   [*given, scaled_shards(config, setting.classes_per_client)])


def setting_units(scale: Scale, setting: Setting, seeds: list[int], out: Path) -> list[Unit]:
    """The members of the scale's config in one setting, once per seed."""
    found = []
    for unit in units(setting_config(scale, setting, seeds), out, setting.members):
        label = f"{unit.label} {setting.name}".strip()
        data = adjusted(yaml.safe_load(unit.config), setting, label)
        found.append(Unit(unit.seed, label, to_yaml(validate(data)), out / f"seed{unit.seed}" / label))
    return found


def settings_runner(experiment: PaperExperiment, scale: Scale, config: RunConfig, out: Path, workers: Workers,
                    probe: bool) -> list[Unit]:
    """Every member of the scale's config in every setting of the experiment, once per seed (only the labels in
    `scale.members` where given), seed by seed."""
    seeds = config.seeds or [config.seed]
    found = [unit for setting in SETTINGS[experiment.id] for unit in setting_units(scale, setting, seeds, out)]
    labels = [unit.label for unit in found]
    missing = [label for label in scale.members if label not in labels]
    if missing:
        raise ManytaskError(f"'{experiment.id}' has no member '{missing[0]}'; its members: "
                            f"{', '.join(dict.fromkeys(labels))}.")
    todo = sorted((u for u in found if not scale.members or u.label in scale.members), key=lambda u: u.seed)
    run_with_estimate(todo, workers, probe)
    return todo


RUNNERS["talos-settings"] = settings_runner

# --- columns, scales and the paper's numbers ----------------------------------------------------------------------

ACCURACY = Column("accuracy %", accuracy)
START = Column("head phase's last evaluation %", accuracy_at_phase_end(HEAD))
GAIN = Column("gain over it", gain_over_phase_end(HEAD), fmt="{:+.1f}")
HALFWAY = Column("halfway through the sparse phase %", accuracy_into_phase(SPARSE, 0.5))
VS_HEAD_ONLY = Column("final − FL head-only", minus_member(accuracy, "head-only"), fmt="{:+.1f}")
VS_CENTRAL = Column("final − centralized head-only", minus_member(accuracy, "centralized-head-only"), fmt="{:+.1f}")
UPLOAD = Column("upload per round of the last phase (kB)", upload_per_round, fmt="{:.1f}", lower_is_better=True)
TRAIN_LOSS = Column("client train loss, last tenth of the rounds", train_loss_tail(0.1), fmt="{:.3f}",
                    lower_is_better=True)
MASKED = Column("parameters with trainable entries", mask_parameters(outside_qkv=False), fmt="{:.0f}")
OUTSIDE_QKV = Column("of them outside Q/K/V", mask_parameters(outside_qkv=True), fmt="{:.0f}", lower_is_better=True)
QKV_SHARE = Column("Q/K/V weights trainable %", qkv_share)
TABLE4_COLUMNS = (ACCURACY, START, GAIN, HALFWAY, VS_HEAD_ONLY)

SPLITS: dict[str, int | None] = {"IID": None, "N_c=50": 50, "N_c=10": 10, "N_c=5": 5, "N_c=1": 1}
J_VALUES = (4, 8, 16)
FL_MEMBERS = ("head-only", "talos", "talos-partition")
CENTRAL_MEMBERS = ("centralized-head-only", "centralized-talos")

# Table 4 by split: FL head-only, FL + TaLoS (from that head-only model), the partition variant ("Our")
TABLE4 = {"IID": (44.51, 53.90, 47.58), "N_c=50": (42.88, 52.14, 44.83), "N_c=10": (41.11, 45.09, 36.58),
          "N_c=5": (38.70, 39.15, 22.50), "N_c=1": (31.96, 31.92, 23.52)}
# Fig. 3: FL head-only's validation accuracy by split (the paper's row "100" is IID), J = 4, 8, 16
FIG3 = {"IID": (44.64, 44.26, 43.84), "N_c=50": (42.87, 41.93, 38.97), "N_c=10": (40.82, 35.28, 26.41),
        "N_c=5": (38.80, 29.62, 27.39), "N_c=1": (32.38, 27.73, 22.63)}
# Tables 1 and 2: centralized head-only's validation accuracy by weight decay, at lr 0.001, 0.005, 0.01
GRID_LR = (0.001, 0.005, 0.01)
TABLE1 = {0.0001: (46.54, 46.30, 47.07), 0.001: (45.59, 46.59, 46.83)}
TABLE2 = {0.0001: (45.99, 46.34, 46.65), 0.001: (45.40, 46.22, 46.50)}
CENTRAL_HEAD_ONLY, CENTRAL_TALOS = 46.50, 58.38


def talos_row(final: float, start: float) -> dict[str, Value]:
    """A TaLoS row of the paper: its final accuracy, its start (the head-only model it fine-tunes) and the gain."""
    return {ACCURACY.name: final, START.name: start, GAIN.name: round(final - start, 2)}


def table4_numbers(split: str) -> dict[str, Mapping[str, Value]]:
    head, talos, partition = TABLE4[split]
    return {"head-only": {ACCURACY.name: head}, "talos": talos_row(talos, head),
            "talos-partition": talos_row(partition, head)}


def grid_numbers(table: Mapping[float, tuple[float, ...]]) -> dict[str, Mapping[str, Value]]:
    return {f"centralized-head-only lr={lr} weight_decay={wd}": {ACCURACY.name: value}
            for wd, values in table.items() for lr, value in zip(GRID_LR, values, strict=True)}


def j_numbers(splits: tuple[str, ...]) -> dict[str, Mapping[str, Value]]:
    return {f"head-only {split} J={j}": {ACCURACY.name: value}
            for split in splits for j, value in zip(J_VALUES, FIG3[split], strict=True)}


def split_settings(splits: tuple[str, ...], members: tuple[str, ...], j_values: tuple[int, ...] = ()
                   ) -> tuple[Setting, ...]:
    """One setting per split, and per J where `j_values` (J × rounds kept)."""
    if not j_values:
        return tuple(Setting(split, members=members, classes_per_client=SPLITS[split]) for split in splits)
    return tuple(Setting(f"{split} J={j}", members=members, classes_per_client=SPLITS[split], local_steps=j)
                 for split in splits for j in j_values)


def scales(config: str, seeds: tuple[int, ...], members: tuple[str, ...] = (), smoke: tuple[str, ...] = SMOKE,
           paper_overrides: tuple[str, ...] = (), paper_members: tuple[str, ...] | None = None) -> dict[str, Scale]:
    """The three scales of an experiment on `config`: smoke (shrunk by `smoke`), cpu on `seeds`, and the paper's
    CIFAR-100 + ViT-S/16 setting (its members by default the cpu's)."""
    chosen = members if paper_members is None else paper_members
    return {"smoke": Scale(config, smoke, members=members), "cpu": Scale(config, (), seeds, members=members),
            "paper": Scale(PAPER_CONFIG, paper_overrides, needs=NEEDS, members=chosen)}


def settings_experiment(settings: tuple[Setting, ...], **fields: Any) -> PaperExperiment:
    """An experiment run by the settings runner over `settings`."""
    experiment = PaperExperiment(runner="talos-settings", **fields)
    SETTINGS[experiment.id] = settings
    return experiment


def paper_methods(*entries: str) -> str:
    """A `method=[...]` override: the members a paper scale runs from the CIFAR-100 config."""
    return f"method=[{', '.join(entries)}]"


HEAD_GRID = "configs/talos/scene_objects_head_grid.yaml"
CALIBRATION_CONFIG = "configs/talos/scene_objects_calibration.yaml"
SPARSITY = "configs/talos/scene_objects_sparsity.yaml"
PARTICIPATION = "configs/talos/scene_objects_partition_participation.yaml"
GRID_SWEEP = "sweep={train.lr: [0.001, 0.005, 0.01, 0.05], train.weight_decay: [0.0001, 0.001]}"
PAPER_GRID = (paper_methods("{name: centralized-head-only, train: {local_steps: 40}}"), "rounds=300", GRID_SWEEP)
CENTRAL_PAPER = "{name: centralized-talos, head_rounds: 300, train: {local_steps: 40}}"
PROTOCOL_NOTE = ("The paper: DINO ViT-S/16 on CIFAR-100, 100 clients, C = 0.1, J = 4, ρ* = 0.9; TaLoS fine-tunes "
                 "for 300 rounds from the FL head-only model of 300 rounds. Here: `scene-objects` (100 rendered "
                 "classes) on a 4-block ViT of width 64 pretrained on 28 held-out classes, under the protocol of "
                 "configs/talos/scene_objects_protocol.yaml: 120 head-only rounds (where FL head-only plateaus), "
                 "the calibration (R = 5), 119 sparse rounds; FL head-only trains its head all 240 rounds.")
SPLIT_NOTE = " The split: every client holds N_c classes in shards (McMahan et al.)."
SPARSITY_PAPER = (paper_methods(*(
    f"{{name: talos, label: talos-rho{round(100 * rho)}, sparsity: {rho}, head_rounds: 300}}"
    for rho in (0.5, 0.8, 0.9, 0.95, 0.99))),)
SPARSITY_NOTE = ("The paper: FL + TaLoS's validation accuracy for several ρ* (DINO ViT-S/16, CIFAR-100). Here: FL + "
                 "TaLoS under the protocol (configs/talos/scene_objects_sparsity.yaml), its start the same head phase "
                 "for every ρ*. One seed.")
J_NOTE = ("The paper: FL head-only on DINO ViT-S/16 and CIFAR-100, J = 4, 8, 16 local steps at a constant J × rounds "
          "(300 rounds at J = 4), validation accuracy. Here: FL head-only under the protocol "
          "(configs/talos/scene_objects_protocol.yaml), 240 rounds at J = 4, 120 at J = 8, 60 at J = 16, test "
          "accuracy.")
CENTRAL_NOTE = ("The paper: centralized head-only for 30 epochs, then centralized TaLoS for 30 epochs from it (DINO "
                "ViT-S/16, CIFAR-100, lr 0.01). Here: configs/talos/scene_objects_centralized.yaml, one client "
                "holding all of `scene-objects`, 240 rounds of 40 steps: the head phase 120 rounds, the sparse phase "
                "119 (7.6 epochs).")

register(
    PaperExperiment(
        id="talos/table1-head-grid-cosine",
        title="Table 1: centralized head-only, learning rate × weight decay (cosine)",
        shows="centralized head-only accuracy over a grid of learning rates and weight decays under a cosine "
              "schedule, the grid the paper picks its lr 0.01 and weight decay 1e-4 from.",
        columns=(ACCURACY,),
        scales={"smoke": Scale(HEAD_GRID, SMOKE_GRID), "cpu": Scale(HEAD_GRID),
                "paper": Scale(PAPER_CONFIG, PAPER_GRID, needs=NEEDS)},
        paper_numbers=grid_numbers(TABLE1),
        paper_note="The paper: DINO ViT-S/16 on CIFAR-100, 30 epochs of SGDM, validation accuracy. Here: "
                   "configs/talos/scene_objects_head_grid.yaml, 120 rounds of 40 steps (the head phase centralized "
                   "TaLoS starts from), test accuracy; lr 0.05 is the stand-in's own.",
    ),
    PaperExperiment(
        id="talos/table2-head-grid-step",
        title="Table 2: centralized head-only, learning rate × weight decay (step schedule)",
        shows="the grid of Table 1 under StepLR (× 0.1 every third of the run), which the paper finds slightly "
              "worse than the cosine schedule.",
        columns=(ACCURACY,),
        scales={"smoke": Scale(HEAD_GRID, (*SMOKE_GRID, "train.lr_schedule=step", "train.lr_step=1")),
                "cpu": Scale(HEAD_GRID, ("train.lr_schedule=step", "train.lr_step=40")),
                "paper": Scale(PAPER_CONFIG, (*PAPER_GRID, "train.lr_schedule=step", "train.lr_step=100"),
                               needs=NEEDS)},
        paper_numbers=grid_numbers(TABLE2),
        paper_note="The paper: as Table 1 under StepLR, × 0.1 every 10 of its 30 epochs. Here: "
                   "configs/talos/scene_objects_head_grid.yaml with the lr × 0.1 every 40 of its 120 rounds.",
    ),
    settings_experiment(
        split_settings(tuple(SPLITS), ("head-only",)),
        id="talos/table3-head-only-nc",
        title="Table 3: FL head-only with J = 4 by data split",
        shows="the FL head-only baselines TaLoS starts from: accuracy falls as each client holds fewer classes.",
        columns=(ACCURACY,),
        scales=scales(PROTOCOL, (0,), paper_overrides=PAPER_HEAD),
        paper_numbers={f"head-only {split}": {ACCURACY.name: TABLE4[split][0]} for split in SPLITS},
        paper_note=PROTOCOL_NOTE + SPLIT_NOTE + " One seed.",
    ),
    PaperExperiment(
        id="talos/table4-iid",
        title="Table 4 and Figs. 10-11, IID: FL head-only, FL + TaLoS, the partition and one-shot variants",
        shows="whether FL + TaLoS gains over its plateaued head-only start and over FL head-only trained for the "
              "same rounds, and where the partition and one-shot variants land (the paper's headline: 44.51 → "
              "53.90 %).",
        columns=(*TABLE4_COLUMNS, UPLOAD),
        scales=scales(PROTOCOL, (0, 1, 2), smoke=SMOKE_PROTOCOL, paper_members=(*FL_MEMBERS, "talos-oneshot")),
        paper_numbers=table4_numbers("IID"),
        paper_note=PROTOCOL_NOTE + " The one-shot trains the head 238 rounds, calibrates, and assembles one round of "
                   "80 local steps on every client; its start is its last evaluation before that round.",
    ),
    *(settings_experiment(
        (Setting(members=FL_MEMBERS, classes_per_client=SPLITS[split]),),
        id=f"talos/table4-nc{SPLITS[split]}",
        title=f"Table 4 and Figs. 10-11, {split.replace('N_c=', 'N_c = ')}: FL head-only, FL + TaLoS, the partition "
              "variant",
        shows=f"FL + TaLoS and its partition variant against FL head-only when every client holds "
              f"{SPLITS[split]} of the 100 classes.",
        columns=TABLE4_COLUMNS,
        scales=scales(PROTOCOL, (0,)),
        paper_numbers=table4_numbers(split),
        paper_note=PROTOCOL_NOTE + SPLIT_NOTE + " One seed.",
    ) for split in ("N_c=50", "N_c=10", "N_c=5", "N_c=1")),
    settings_experiment(
        (Setting(members=("talos-oneshot",), classes_per_client=1),),
        id="talos/table4-oneshot-nc1",
        title="Table 4's one-shot variant at N_c = 1 (Sec. 3.3)",
        shows="whether one assembly of every single-class client's 80-step update on its own partition collapses "
              "the model to chance, as the paper finds (1.08 %, chance 1 %).",
        columns=(ACCURACY, START, GAIN),
        scales=scales(PROTOCOL, (0, 1, 2), smoke=SMOKE_PROTOCOL),
        paper_numbers={"talos-oneshot": {ACCURACY.name: 1.08}},
        paper_note="The paper: DINO ViT-S/16 on CIFAR-100, one class per client, ~80 local steps (25 epochs) per "
                   "client on its own partition of the kept entries, one assembly. Here: the protocol "
                   "(configs/talos/scene_objects_protocol.yaml) at N_c = 1: 238 head-only rounds, the calibration, "
                   "one round of 80 steps on all 100 clients." + SPLIT_NOTE,
    ),
    PaperExperiment(
        id="talos/table4-centralized",
        title="Table 4's centralized rows, Figs. 1 and 6: centralized head-only and centralized TaLoS",
        shows="how much sparse fine-tuning adds over head-only training without federation (the paper: 46.50 → "
              "58.38 %).",
        columns=(ACCURACY, START, GAIN, HALFWAY, VS_CENTRAL),
        scales=scales(CENTRALIZED, (0, 1, 2), CENTRAL_MEMBERS, smoke=SMOKE_CENTRAL),
        paper_numbers={"centralized-head-only": {ACCURACY.name: CENTRAL_HEAD_ONLY},
                       "centralized-talos": talos_row(CENTRAL_TALOS, CENTRAL_HEAD_ONLY)},
        paper_note=CENTRAL_NOTE,
    ),
    settings_experiment(
        (Setting(), Setting("sparse-x4", members=("centralized-talos",), sparse_share=4.0)),
        id="talos/table4-gap-headroom",
        title="Table 4's gap: the stand-in's headroom for backbone fine-tuning",
        shows="why TaLoS gains far less here than in the paper, without federation: centralized TaLoS against a "
              "sparse phase four times as long (the paper's 30 epochs) and against fine-tuning every scored "
              "backbone entry (ρ* = 0), which bounds what any mask can add on this backbone.",
        columns=(ACCURACY, START, GAIN, HALFWAY, VS_CENTRAL),
        scales=scales(CENTRALIZED, (0,), smoke=SMOKE_CENTRAL, paper_overrides=(paper_methods(
            "{name: centralized-head-only, train: {local_steps: 40}}", CENTRAL_PAPER,
            "{name: centralized-talos, label: centralized-dense, sparsity: 0.0, calibration_rounds: 1, "
            "head_rounds: 300, train: {local_steps: 40}}"),)),
        paper_numbers={"centralized-head-only": {ACCURACY.name: CENTRAL_HEAD_ONLY},
                       "centralized-talos": talos_row(CENTRAL_TALOS, CENTRAL_HEAD_ONLY)},
        paper_note=CENTRAL_NOTE + " The paper's 30 epochs of sparse fine-tuning are `centralized-talos sparse-x4` "
                   "(476 sparse rounds from the same head phase); `centralized-dense` fine-tunes all 134 k scored "
                   "entries instead of 10 %. One seed.",
    ),
    PaperExperiment(
        id="talos/fig2-head-only-rounds",
        title="Fig. 2: FL head-only over the rounds (IID)",
        shows="where FL head-only's accuracy plateaus, the round the protocol starts TaLoS from (half the run).",
        columns=(Column("at 1/4 of the rounds %", accuracy_at_share(0.25)),
                 Column("at 1/2 (TaLoS's start) %", accuracy_at_share(0.5)),
                 Column("at 3/4 %", accuracy_at_share(0.75)), ACCURACY),
        scales=scales(PROTOCOL, (0, 1, 2), ("head-only",), paper_overrides=("rounds=600",)),
        paper_note="The paper: FL head-only for 600 rounds (DINO ViT-S/16, CIFAR-100, IID, J = 4), from which it "
                   "takes 300 rounds as the trade-off. Here: FL head-only under the protocol "
                   "(configs/talos/scene_objects_protocol.yaml), one cosine over 240 rounds.",
    ),
    settings_experiment(
        split_settings(tuple(SPLITS), ("head-only",), J_VALUES),
        id="talos/fig3-nc-by-j",
        title="Fig. 3: FL head-only by data split and local steps J",
        shows="FL head-only's accuracy for every split and J = 4, 8, 16 at a constant J × rounds: J = 4 is best "
              "at every split, and more local steps hurt more as clients hold fewer classes.",
        columns=(ACCURACY, TRAIN_LOSS),
        scales=scales(PROTOCOL, (0,), paper_overrides=PAPER_HEAD),
        paper_numbers=j_numbers(tuple(SPLITS)),
        paper_note=J_NOTE + SPLIT_NOTE + " One seed.",
    ),
    PaperExperiment(
        id="talos/fig4-calibration-masks",
        title="Fig. 4: the mask's calibration rounds R and soft-zero factor",
        shows="where the mask lands (how many parameters hold trainable entries, how many outside the attention "
              "Q, K, V weights) and what FL + TaLoS reaches, for R = 3, 5, 10 and soft-zero 0.1, 0.01, 0.001.",
        columns=(ACCURACY, GAIN, MASKED, OUTSIDE_QKV, QKV_SHARE),
        scales=scales(CALIBRATION_CONFIG, (0,), paper_overrides=(paper_methods(*(
            f"{{name: talos, label: talos-r{r}-sz{sz}, calibration_rounds: {r}, soft_zero: {sz}, head_rounds: 300}}"
            for r, sz in ((3, 0.01), (5, 0.01), (10, 0.01), (5, 0.1), (10, 0.1), (10, 0.001)))),)),
        paper_note="The paper: masks at ρ* = 0.9 on DINO ViT-S/16 (blocks 8-11 shown); R = 10 with soft-zero 0.01 "
                   "keeps the mask in Q, K, V with less noise elsewhere than R = 5 with soft-zero 0.1. Here: FL + "
                   "TaLoS under the protocol (configs/talos/scene_objects_calibration.yaml, IID), the clients' mean "
                   "mask from the calibration round's log. One seed.",
    ),
    settings_experiment(
        tuple(Setting(name, members=("centralized-talos",), sparse_share=share)
              for name, share in (("sparse-x0.67", 2 / 3), ("sparse-x1", 1.0), ("sparse-x1.33", 4 / 3))),
        id="talos/fig5-centralized-durations",
        title="Fig. 5: centralized TaLoS for different training durations",
        shows="centralized TaLoS's test accuracy and training loss for sparse phases of 2/3, 1 and 4/3 of the "
              "protocol's (the paper: 20, 30, 40 epochs; past 30 the training accuracy keeps rising and the "
              "validation accuracy hardly moves).",
        columns=(ACCURACY, START, GAIN, TRAIN_LOSS),
        scales=scales(CENTRALIZED, (0,), smoke=SMOKE_CENTRAL),
        paper_note=CENTRAL_NOTE + " Sparse phases of 79, 119 and 159 rounds from the same head phase. One seed.",
    ),
    PaperExperiment(
        id="talos/fig7-sparsity-iid",
        title="Fig. 7: FL + TaLoS by sparsity ρ*, IID",
        shows="FL + TaLoS at ρ* = 0.5, 0.8, 0.9, 0.95, 0.99: in the IID setting, training more entries (a lower "
              "ρ*) gains more.",
        columns=(ACCURACY, START, GAIN, HALFWAY),
        scales=scales(SPARSITY, (0,), paper_overrides=SPARSITY_PAPER),
        paper_note=SPARSITY_NOTE,
    ),
    settings_experiment(
        (Setting(classes_per_client=5),),
        id="talos/fig7-sparsity-nc5",
        title="Fig. 7: FL + TaLoS by sparsity ρ*, N_c = 5",
        shows="the same sweep when every client holds 5 classes, where the paper finds a lower ρ* unstable.",
        columns=(ACCURACY, START, GAIN, HALFWAY),
        scales=scales(SPARSITY, (0,), paper_overrides=SPARSITY_PAPER),
        paper_note=SPARSITY_NOTE + SPLIT_NOTE,
    ),
    settings_experiment(
        split_settings(("IID", "N_c=1"), ("head-only",), J_VALUES),
        id="talos/fig8-9-j-rounds-constant",
        title="Figs. 8-9: FL head-only at a constant J × rounds, IID and N_c = 1",
        shows="the server's accuracy (Fig. 8) and the clients' training fit (Fig. 9) for J = 4, 8, 16: IID "
              "depends on the total steps only, while at N_c = 1 more local steps fit the clients better and the "
              "global model worse (client drift).",
        columns=(Column("at 1/2 of the rounds %", accuracy_at_share(0.5)), ACCURACY, TRAIN_LOSS),
        scales=scales(PROTOCOL, (0,), paper_overrides=PAPER_HEAD),
        paper_numbers=j_numbers(("IID", "N_c=1")),
        paper_note=J_NOTE + " Fig. 9's client training accuracy is not logged; the clients' training loss stands "
                   "for it." + SPLIT_NOTE + " One seed.",
    ),
    PaperExperiment(
        id="talos/fig12-partition-participation",
        title="Fig. 12: the partition variant by participation C (IID)",
        shows="the partition variant after 50 sparse rounds with 10, 25 and 50 % of the clients per round: each "
              "sampled client moves only its own subset, so more clients per round move more of the kept entries.",
        columns=(ACCURACY, START, GAIN, UPLOAD),
        scales=scales(PARTICIPATION, (0,), smoke=(*SMOKE, paper_methods(
            "{name: talos-partition, head_rounds: 3, calibration_rounds: 5}")), paper_overrides=(
            paper_methods("{name: talos-partition, head_rounds: 300}"), "rounds=351",
            "sweep={participation: [0.1, 0.25, 0.5]}")),
        paper_numbers={f"talos-partition participation={c}": {ACCURACY.name: value}
                       for c, value in ((0.1, 45.77), (0.25, 46.51), (0.5, 47.29))},
        paper_note="The paper: the partition variant on DINO ViT-S/16, CIFAR-100 (IID), test accuracy after 50 "
                   "rounds from the FL head-only model. Here: configs/talos/scene_objects_partition_participation"
                   ".yaml, 120 head-only rounds, the calibration (R = 5), 50 sparse rounds. One seed.",
    ),
)

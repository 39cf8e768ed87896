"""FedDEA's experiments ("Towards Unified Modeling in Federated Multi-Task Learning via Subspace Decoupling"):
Tables 1-6 and Figs. 2 and 4-8; Table 3 and two tables at the paper's step size with the server-step control the
results page's verdict rests on (each host with its server step scaled by DEA's logged norm inflation); the test of
the likeliest cause of the PCGrad gap; three analyses of the hosts × plug-ins grid on six digits tasks
(docs/hosts_and_plugins.md). The two runners they need are in `feddea_runners.py`, the paper's tables in
`published/feddea_*.tsv`.

The paper never states the ρ of its tables (its Fig. 4 sweeps 10-100 % and shows an interior optimum, in a picture
only); every FedDEA config here runs ρ = 0.5, DEA's default (`methods/plugins/dea.py`), except the digits grid
(0.3)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

from manytask.experiments.feddea_runners import INFLATION, STATEFUL, overlap_at
from manytask.experiments.measures import accuracy, fit_mean, upload_per_round
from manytask.experiments.published import published
from manytask.experiments.spec import TWO_ROUNDS, Column, Measure, PaperExperiment, Scale, Value, paper, register
from manytask.report.runs import RunRecord

paper("feddea", "FedDEA: decoupled aggregation as a plug-in for eight hosts",
      "FedDEA's claim: each client keeping the top ρ of its update's entries, rescaled by 1/ρ, improves every one "
      "of eight host optimizers on NYUD-v2 and PASCAL-Context (Δ% +1.5 to +21 with Swin-T), where PCGrad and "
      "FedHEAL mostly hurt, and builds one model for all the clients' tasks.")

HOSTS = ("fedavg", "fedprox", "fednova", "feddyn", "moon", "fedbn", "fedga", "fedacg")

# --- measures ---------------------------------------------------------------------------------------------------


def task_metric(task: str, metric: str, scale: float = 1.0) -> Measure:
    """A task's final metric from the member's summary, times `scale` (100 for the paper's mIoU / odsF / maxF %)."""

    def measure(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
        value = ((record.summary.get("tasks") or {}).get(task) or {}).get(metric)
        return None if value is None else scale * float(value)

    return measure


def host_of(record: RunRecord) -> str:
    """The label of the member's host run: its method's name (`fedprox+dea`, `fedprox×c` -> `fedprox`)."""
    return str(record.summary.get("method") or record.group)


def delta_against_host(record: RunRecord, runs: Mapping[str, RunRecord]) -> Value:
    """Δ% of a plug-in or control member against its host on the same seed (the paper's Δ); None for a host."""
    from manytask.report.delta import delta_percent

    host = host_of(record)
    if record.group == host or host not in runs:
        return None
    return delta_percent(record, runs[host])


def delta_against_members(bases: Mapping[str, str]) -> Measure:
    """Δ% of each member named in `bases` against the member it maps to, on the same seed; None for the others."""

    def measure(record: RunRecord, runs: Mapping[str, RunRecord]) -> Value:
        from manytask.report.delta import delta_percent

        base = bases.get(record.group)
        return None if base is None or base not in runs else delta_percent(record, runs[base])

    return measure


def server_step(record: RunRecord, runs: Mapping[str, RunRecord]) -> Value:
    """The factor by which the member's server step exceeds its host's: DEA's logged c, or a control's
    `server_lr`; None for a plain host."""
    if record.summary.get("plugin") == "dea":
        return fit_mean(INFLATION)(record, runs)
    step = float((record.summary.get("method_params") or {}).get("server_lr", 1.0))
    return None if step == 1.0 else step


def round_at(record: RunRecord, fraction: float) -> int:
    """The round at `fraction` of the member's rounds (at least 1), so a column means the same at every scale."""
    rounds = int(record.summary.get("engine_rounds") or record.summary.get("rounds") or 1)
    return max(1, math.ceil(fraction * rounds))


def _eval_at(record: RunRecord, round_index: int) -> dict[str, Any] | None:
    rows = [row for row in record.metrics if row.get("eval") and int(row["round"]) <= round_index]
    return rows[-1]["eval"] if rows else None


def metric_at(task: str, metric: str, fraction: float, scale: float = 1.0) -> Measure:
    """A task's metric at the last evaluation by `fraction` of the rounds (the convergence figures' y-axis)."""

    def measure(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
        row = _eval_at(record, round_at(record, fraction))
        value = ((row or {}).get(task) or {}).get(metric)
        return None if value is None else scale * float(value)

    return measure


def mean_delta_over_rounds(record: RunRecord, runs: Mapping[str, RunRecord]) -> Value:
    """The mean over evaluated rounds of Δ% against the host: how far ahead it runs on the way, not only at the
    end."""
    from manytask.report.delta import delta_curve

    host = host_of(record)
    if record.group == host or host not in runs:
        return None
    _, deltas = delta_curve(record, runs[host])
    return statistics.fmean(deltas) if deltas else None


# --- the paper's numbers ----------------------------------------------------------------------------------------

DELTA = "Δ%"

# The paper's tables, as published (experiments/published/feddea_*.tsv, each naming its table and setting).
TABLE1, TABLE2, TABLE4, TABLE6 = (published(f"feddea_table{n}") for n in (1, 2, 4, 6))
TABLE3_NYUD, TABLE3_PASCAL = published("feddea_table3_nyud"), published("feddea_table3_pascal")
TABLE5_NYUD, TABLE5_PASCAL = published("feddea_table5_nyud"), published("feddea_table5_pascal")


def deltas_only(rows: Mapping[str, Mapping[str, Value]]) -> dict[str, dict[str, Value]]:
    """The paper's Δ% of each row (the control tables show Δ% alone); FedDyn's and FedACG's beside both DEA rules,
    since the paper does not say which its hosts ran."""
    picked = {label: {DELTA: row[DELTA]} for label, row in rows.items() if label.endswith("+dea")}
    picked.update({f"{host}+dea-paper": picked[f"{host}+dea"] for host in STATEFUL if f"{host}+dea" in picked})
    return picked


# --- columns ----------------------------------------------------------------------------------------------------

NYUD_METRICS = (Column("semseg mIoU", task_metric("semseg", "miou", 100)),
                Column("depth RMSE", task_metric("depth", "rmse"), fmt="{:.3f}", lower_is_better=True),
                Column("normals mErr", task_metric("normals", "mean_angle"), lower_is_better=True),
                Column("edge odsF", task_metric("edge", "odsf", 100)))
PASCAL_METRICS = (Column("semseg mIoU", task_metric("semseg", "miou", 100)),
                  Column("parts mIoU", task_metric("parts", "miou", 100)),
                  Column("normals mErr", task_metric("normals", "mean_angle"), lower_is_better=True),
                  Column("saliency maxF", task_metric("saliency", "maxf", 100)),
                  Column("edge odsF", task_metric("edge", "odsf", 100)))
DELTA_COLUMN = Column(DELTA, delta_against_host, fmt="{:+.1f}")
STEP_COLUMN = Column("c (server step ×)", server_step, fmt="{:.2f}")
UPLOAD_COLUMN = Column("upload kB/round", upload_per_round(1e-3), fmt="{:.0f}")

# --- scales -----------------------------------------------------------------------------------------------------

SMOKE = (*TWO_ROUNDS, "benchmark.train_per_task=8", "benchmark.test_size=8", "benchmark.size=8",
         "train.warmup_rounds=1", "model.channels=[4,8,8]", "model.decoder.width=4")
NYUD_DATA = ("data/NYUD_MT", "checkpoints/swin-tiny")
PASCAL_DATA = ("data/PASCAL_MT", "checkpoints/swin-tiny")
RESNET_NYUD_DATA = ("data/NYUD_MT", "checkpoints/resnet18.safetensors")  # read by the RESNET overrides
RESNET_PASCAL_DATA = ("data/PASCAL_MT", "checkpoints/resnet18.safetensors")
CPU_SEEDS = (0, 1, 2)
ABLATION_PLUGINS = ("plugins=[none, {name: dea, rho: 0.5, label: dea}, {name: dea, rho: 0.5, select: smallest, "
                    "label: dea-smallest}, {name: dea, rho: 0.5, rescale: false, label: dea-no-rescale}, "
                    "{name: dea, rho: 0.5, select: random, label: dea-random}]",)
CONVERGENCE = ("method=[fedavg, fedprox, feddyn]", "plugins=[none, {name: dea, rho: 0.5}, pcgrad, fedheal]",
               "eval_every=1")
PLUGIN_MEMBERS = ("fedavg", "fedavg+dea", "fedavg+pcgrad", "fedavg+fedheal")
HOST_DEA_MEMBERS = ("fedavg", "fedavg+dea", "fedprox", "fedprox+dea", "feddyn", "feddyn+dea")


def grid_members(hosts: tuple[str, ...], plugins: tuple[str, ...] = ("dea", "pcgrad", "fedheal")) -> tuple[str, ...]:
    """The labels of `hosts` alone and under each of `plugins`."""
    return tuple(label for host in hosts for label in (host, *(f"{host}+{p}" for p in plugins)))



# --- the registry -----------------------------------------------------------------------------------------------

NYUD_SCENES = "configs/feddea/scenes_nyud_hosts_plugins.yaml"
PASCAL_SCENES = "configs/feddea/scenes_pascal_hosts_plugins.yaml"
NYUD_SWIN = "configs/feddea/nyudv2_swin.yaml"
PASCAL_SWIN = "configs/feddea/pascal_context_swin.yaml"
# the appendix's ResNet-18 encoder (ImageNet weights from a local torchvision state dict) in the Swin-T configs
RESNET = ("model={backbone: resnet18, weights: checkpoints/resnet18.safetensors, stem: imagenet, norm: batch, "
          "normalize: imagenet, decoder: {width: 128, norm: batch}}",)
RESNET_SMOKE = ("model={backbone: resnet18, width: 4, stem: small, norm: batch, decoder: {width: 4}}",)
UNIFIED = ("method=[local, {name: fedavg, plugin: {name: dea, rho: 0.5}}, {name: fedprox, plugin: {name: dea, "
           "rho: 0.5}}]", "plugins=null")


def rho_plugins(tenths: tuple[int, ...] | range) -> tuple[str]:
    """The override of no plug-in and DEA at each ρ = t/10, labelled `dea-<ρ in %>`."""
    return ("plugins=[none, " + ", ".join(f"{{name: dea, rho: {t / 10:g}, label: dea-{10 * t}}}" for t in tenths)
            + "]",)


RHO_SWEEP = rho_plugins(range(1, 11))
RESNET_TABLE_NOTE = ("The paper: ResNet-18 (ImageNet weights) with one FCN decoder per task, otherwise Table 3's "
                     "setting. No CPU stand-in: the smoke scale runs a ResNet-18 of width 4 on tiny `scenes`.")
GRID_SHOWS = ("each host alone, with each plug-in, with its server step scaled by the norm inflation c that DEA "
              "logged on the same host and seed (host × c) and, for FedDyn and FedACG, with DEA applied by the "
              "paper's eq. 6 instead of their stateful rules; every task's metric, Δ% against the host and c.")
SETTING = ("The paper: Swin-T (ImageNet weights) with one FCN decoder per task, one client per task on disjoint "
           "images, 100 rounds, AdamW lr 1e-4.")
SCENES = ("Here: the offline `scenes` stand-in (32×32 ray-cast images, one style per client), a 3-block CNN encoder "
          "with one FCN decoder per task, 16 rounds of one local epoch at AdamW lr 2e-3, ρ = 0.5.")


def grid(key: str, title: str, shows: str, columns: tuple[Column, ...], scenes: str, paper_config: str,
         data: tuple[str, ...], numbers: Mapping[str, Mapping[str, Value]], note: str, resnet: bool = False
         ) -> PaperExperiment:
    """A hosts × plug-ins experiment: the scenes stand-in at cpu scale, the paper's data at paper scale. A Swin-T
    one (Table 3) runs with the server-step control (its smoke: FedDyn's corner of the grid); a ResNet-18 one has
    no cpu stand-in and runs a ResNet-18 of width 4 at smoke (FedAvg's corner)."""
    if resnet:
        return PaperExperiment(
            id=key, title=title, shows=shows, columns=columns, paper_numbers=numbers, paper_note=note,
            scales={"smoke": Scale(scenes, (*SMOKE, *RESNET_SMOKE), members=grid_members(("fedavg",))),
                    "paper": Scale(paper_config, RESNET, needs=data)})
    return PaperExperiment(
        id=key, title=title, shows=shows, columns=(*columns, STEP_COLUMN), paper_note=note,
        paper_numbers={**numbers, **{k: v for k, v in deltas_only(numbers).items() if k.endswith("-paper")}},
        runner="server-step-control",
        scales={"smoke": Scale(scenes, SMOKE, members=grid_members(("feddyn",))),
                "cpu": Scale(scenes, seeds=CPU_SEEDS), "paper": Scale(paper_config, needs=data)})


def control(key: str, title: str, config: str, numbers: Mapping[str, Mapping[str, Value]], note: str
            ) -> PaperExperiment:
    """A server-step control table at the paper's step size: each host alone, with DEA, with DEA by eq. 6 (FedDyn,
    FedACG) and with its server step scaled by DEA's own c."""
    return PaperExperiment(
        id=key, title=title, columns=(DELTA_COLUMN, STEP_COLUMN), paper_numbers=deltas_only(numbers),
        runner="server-step-control", paper_note=note,
        scales={"smoke": Scale(config, SMOKE, members=grid_members(("feddyn",), ("dea",))),
                "cpu": Scale(config, seeds=CPU_SEEDS)},
        shows="DEA's Δ% against each host beside the host with its server step scaled by the norm inflation c that "
              "DEA logged on the same host and seed (host × c), and, for FedDyn and FedACG, DEA applied by the "
              "paper's eq. 6 instead of their stateful rules: whether DEA's gain is more than a larger server step.")


register(
    PaperExperiment(
        id="feddea/table1-nyud-unified", title="Table 1: one unified model against per-task models, NYUD-v2",
        shows="each task's metric of FedAvg + DEA and FedProx + DEA (one model for all four tasks) beside local "
              "training and the personalized and multi-task methods that keep one model per task.",
        columns=NYUD_METRICS, paper_numbers=TABLE1, waiting_for=("fedamp", "fedmtl", "fedhca2"),
        scales={"smoke": Scale(NYUD_SCENES, (*SMOKE, *UNIFIED)),
                "cpu": Scale(NYUD_SCENES, UNIFIED, seeds=CPU_SEEDS),
                "paper": Scale(NYUD_SWIN, UNIFIED, needs=NYUD_DATA)},
        paper_note=f"{SETTING} Each of the paper's per-task rows (Local(Semseg), …) is one column of our `local` "
                   f"row. {SCENES}"),
    PaperExperiment(
        id="feddea/table2-pascal-unified", title="Table 2: one unified model against per-task models, PASCAL-Context",
        shows="each task's metric of FedAvg + DEA and FedProx + DEA (one model for all five tasks) beside local "
              "training and the personalized and multi-task methods that keep one model per task.",
        columns=PASCAL_METRICS, paper_numbers=TABLE2, waiting_for=("fedamp", "fedmtl", "fedhca2"),
        scales={"smoke": Scale(PASCAL_SCENES, (*SMOKE, *UNIFIED)),
                "cpu": Scale(PASCAL_SCENES, UNIFIED, seeds=CPU_SEEDS),
                "paper": Scale(PASCAL_SWIN, UNIFIED, needs=PASCAL_DATA)},
        paper_note=f"{SETTING} Each of the paper's per-task rows is one column of our `local` row. Here: the "
                   "pascal-like `scenes` stand-in, five clients, otherwise as the nyud-like one."),
    grid("feddea/table3-nyud", "Table 3: DEA, PCGrad and FedHEAL on eight hosts, with the server-step control, NYUD-v2",
         GRID_SHOWS,
         (*NYUD_METRICS, DELTA_COLUMN), NYUD_SCENES, NYUD_SWIN, NYUD_DATA, TABLE3_NYUD,
         f"{SETTING} 5 local epochs. {SCENES} Our depth RMSE is in the scenes' camera units."),
    grid("feddea/table3-pascal",
         "Table 3: DEA, PCGrad and FedHEAL on eight hosts, with the server-step control, PASCAL-Context",
         GRID_SHOWS,
         (*PASCAL_METRICS, DELTA_COLUMN), PASCAL_SCENES, PASCAL_SWIN, PASCAL_DATA, TABLE3_PASCAL,
         f"{SETTING} 2 local epochs. Here: the pascal-like `scenes` stand-in (semseg, parts, normals, saliency, "
         "edge), five clients, otherwise as the nyud-like one."),
    control("feddea/table3-control-nyud-paper-lr", "Table 3's DEA rows against the server-step control, nyud-like, "
            "the paper's step size", "configs/feddea/scenes_nyud_paper_lr.yaml", TABLE3_NYUD,
            f"{SETTING} Here: the nyud-like `scenes` stand-in at the paper's AdamW lr 1e-4 and 5 local epochs, 8 "
            "rounds (one of warmup), ρ = 0.5."),
    control("feddea/table3-control-pascal-paper-lr", "Table 3's DEA rows against the server-step control, "
            "pascal-like, the paper's step size", "configs/feddea/scenes_pascal_paper_lr.yaml", TABLE3_PASCAL,
            f"{SETTING} Here: the pascal-like `scenes` stand-in at the paper's AdamW lr 1e-4 and 2 local epochs, 8 "
            "rounds (two of warmup), ρ = 0.5."),
    PaperExperiment(
        id="feddea/table3-pcgrad-gap", title="Table 3's PCGrad rows: why PCGrad is neutral here and −38 % there",
        shows="FedAvg + PCGrad as applied here (on the server, over the clients' updates, at their weighted mean), "
              "with its projected updates summed as PCGrad's Algorithm 1 does (the server step × K = 4), FedAvg × 4 "
              "alone, and PCGrad at the paper's step size; Δ% against FedAvg at the same step size, against the "
              "same server step without PCGrad, and how many of the 6 client pairs conflict per round.",
        columns=(Column("Δ% vs FedAvg", delta_against_members({
                     "fedavg+pcgrad": "fedavg", "fedavg×4": "fedavg", "fedavg+pcgrad-sum": "fedavg",
                     "fedavg+pcgrad@paper-lr": "fedavg@paper-lr"}), fmt="{:+.1f}"),
                 Column("Δ% vs same step", delta_against_members({
                     "fedavg+pcgrad": "fedavg", "fedavg+pcgrad-sum": "fedavg×4",
                     "fedavg+pcgrad@paper-lr": "fedavg@paper-lr"}), fmt="{:+.1f}"),
                 Column("conflicting pairs per round", fit_mean("pcgrad/conflicts"), fmt="{:.1f}")),
        scales={"smoke": Scale("configs/feddea/scenes_nyud_pcgrad_gap.yaml", SMOKE),
                "cpu": Scale("configs/feddea/scenes_nyud_pcgrad_gap.yaml", seeds=CPU_SEEDS)},
        paper_numbers={"fedavg+pcgrad": {"Δ% vs FedAvg": -38.37}},
        paper_note=f"{SETTING} Its PCGrad rows lose 24-70 % on every host but FedACG, mostly by a depth RMSE "
                   "twice the host's. Here: the nyud-like `scenes` stand-in with FedAvg; `fedavg@paper-lr` and "
                   "`fedavg+pcgrad@paper-lr` train at AdamW lr 1e-4 with 5 local epochs."),
    PaperExperiment(
        id="feddea/table4-ablation", title="Table 4: DEA's ablation, NYUD-v2",
        shows="FedAvg with full DEA (top ρ by |Δ|, ×1/ρ), the smallest entries, no rescale and a random mask of "
              "the same size; each task's metric and Δ% against FedAvg.",
        columns=(*NYUD_METRICS, DELTA_COLUMN), paper_numbers=TABLE4,
        scales={"smoke": Scale("configs/feddea/scenes_nyud_dea_ablation.yaml", SMOKE),
                "cpu": Scale("configs/feddea/scenes_nyud_dea_ablation.yaml", seeds=CPU_SEEDS),
                "paper": Scale(NYUD_SWIN, ("method=[fedavg]", *ABLATION_PLUGINS), needs=NYUD_DATA)},
        paper_note=f"{SETTING} {SCENES}"),
    PaperExperiment(
        id="feddea/table6-ablation-resnet18", title="Table 6: DEA's ablation with ResNet-18, NYUD-v2",
        shows="Table 4's ablation with a ResNet-18 encoder.",
        columns=(*NYUD_METRICS, DELTA_COLUMN), paper_numbers=TABLE6,
        scales={"smoke": Scale("configs/feddea/scenes_nyud_dea_ablation.yaml", (*SMOKE, *RESNET_SMOKE)),
                "paper": Scale(NYUD_SWIN, (*RESNET, "method=[fedavg]", *ABLATION_PLUGINS), needs=RESNET_NYUD_DATA)},
        paper_note="The paper: ResNet-18 (ImageNet weights) with one FCN decoder per task, otherwise Table 4's "
                   "setting. No CPU stand-in: the smoke scale runs a ResNet-18 of width 4 on tiny `scenes`."),
    grid("feddea/table5-resnet18-nyud", "Table 5: DEA, PCGrad and FedHEAL on eight hosts with ResNet-18, NYUD-v2",
         "Table 3 with a ResNet-18 encoder.", (*NYUD_METRICS, DELTA_COLUMN), NYUD_SCENES, NYUD_SWIN,
         RESNET_NYUD_DATA, TABLE5_NYUD,
         resnet=True, note=RESNET_TABLE_NOTE),
    grid("feddea/table5-resnet18-pascal", "Table 5: DEA, PCGrad and FedHEAL on eight hosts with ResNet-18, "
         "PASCAL-Context", "Table 3 with a ResNet-18 encoder.", (*PASCAL_METRICS, DELTA_COLUMN), PASCAL_SCENES,
         PASCAL_SWIN, RESNET_PASCAL_DATA, TABLE5_PASCAL,
         resnet=True, note=RESNET_TABLE_NOTE),
)

CONVERGENCE_CONFIG = "configs/feddea/scenes_nyud_convergence.yaml"
CURVE = tuple(Column(f"semseg mIoU at {name}", metric_at("semseg", "miou", fraction, 100))
              for name, fraction in (("¼ of the rounds", 0.25), ("½", 0.5), ("¾", 0.75), ("the end", 1.0)))
CURVE_COLUMNS = (*CURVE, Column("mean Δ% over rounds", mean_delta_over_rounds, fmt="{:+.1f}"), DELTA_COLUMN)
RESNET_NOTE = ("The paper: ResNet-18 (ImageNet weights) on NYUD-v2, otherwise Fig. 5's setting; the curves are "
               "pictures without numbers. No CPU stand-in: the smoke scale runs a ResNet-18 of width 4 on tiny "
               "`scenes`.")


def convergence(key: str, title: str, shows: str, members: tuple[str, ...], resnet: bool) -> PaperExperiment:
    """A convergence figure: semseg mIoU along the rounds and Δ% against each host, evaluated every round."""
    smoke = Scale(CONVERGENCE_CONFIG, (*SMOKE, "eval_every=1", *(RESNET_SMOKE if resnet else ())),
                  members=members[:4] if resnet else members)
    scales = {"smoke": smoke, "paper": Scale(NYUD_SWIN, (*(RESNET if resnet else ()), *CONVERGENCE),
                                             needs=RESNET_NYUD_DATA if resnet else NYUD_DATA, members=members)}
    if not resnet:
        scales["cpu"] = Scale(CONVERGENCE_CONFIG, seeds=CPU_SEEDS, members=members)
    note = RESNET_NOTE if resnet else (f"{SETTING} Its curves are pictures without numbers (semseg on NYUD-v2). "
                                       f"{SCENES} Evaluated every round.")
    return PaperExperiment(id=key, title=title, shows=shows, columns=CURVE_COLUMNS, scales=scales, paper_note=note)


register(
    PaperExperiment(
        id="feddea/fig2-update-subspaces", title="Fig. 2: where each task's top-10 % update entries lie",
        shows="how much the four clients' top-10 % update entries over the shared encoder overlap (mean pairwise "
              "Jaccard index) and what share of a client's entries no other client's top 10 % holds, in the first "
              "round and the last, under FedAvg.",
        columns=(Column("overlap, round 1 (Jaccard %)", overlap_at("jaccard", 0)),
                 Column("overlap, last round (Jaccard %)", overlap_at("jaccard", -1)),
                 Column("exclusive share, round 1 %", overlap_at("exclusive", 0)),
                 Column("exclusive share, last round %", overlap_at("exclusive", -1))),
        runner="update-overlap",
        scales={"smoke": Scale(NYUD_SCENES, SMOKE, members=("fedavg",)),
                "cpu": Scale(NYUD_SCENES, seeds=CPU_SEEDS, members=("fedavg",)),
                "paper": Scale(NYUD_SWIN, needs=NYUD_DATA, members=("fedavg",))},
        paper_numbers={"fedavg": {"exclusive share, round 1 %": "mutually exclusive (picture)",
                                  "exclusive share, last round %": "mutually exclusive (picture)"}},
        paper_note="The paper: four Swin-T clients, one NYUD-v2 task each, drawn at rounds 1 and 100; the text "
                   "calls the tasks' top-10 % dimensions mutually exclusive. Independent random 10 % sets would "
                   f"give a Jaccard index of 5.3 % and an exclusive share of 72.9 % (0.9³). {SCENES}"),
    PaperExperiment(
        id="feddea/fig4-rho-sweep", title="Fig. 4: DEA's selection ratio ρ from 10 % to 100 %",
        shows="Δ% of FedAvg + DEA against FedAvg at ρ = 10 %, 20 %, …, 100 % (100 % is FedAvg itself), with DEA's "
              "norm inflation c and the upload.",
        columns=(DELTA_COLUMN, STEP_COLUMN, UPLOAD_COLUMN),
        scales={"smoke": Scale("configs/feddea/scenes_nyud_rho_sweep.yaml", SMOKE, members=(
                    "fedavg", "fedavg+dea-10", "fedavg+dea-30", "fedavg+dea-50", "fedavg+dea-100")),
                "cpu": Scale("configs/feddea/scenes_nyud_rho_sweep.yaml", seeds=CPU_SEEDS),
                "paper": Scale(NYUD_SWIN, ("method=[fedavg, fedprox]", *RHO_SWEEP), needs=NYUD_DATA)},
        paper_note=f"{SETTING} Fig. 4 (FedAvg and FedProx) is a picture without numbers: Δ rises, then falls with "
                   f"ρ. {SCENES.replace(', ρ = 0.5', '')} FedAvg only."),
    convergence("feddea/fig5-convergence-plugins", "Fig. 5: convergence of FedAvg with each plug-in",
                "FedAvg alone and with DEA, PCGrad and FedHEAL: semseg mIoU along the rounds and Δ% against FedAvg.",
                PLUGIN_MEMBERS, resnet=False),
    convergence("feddea/fig6-convergence-hosts", "Fig. 6: convergence of FedAvg, FedProx and FedDyn with DEA",
                "three hosts alone and with DEA: semseg mIoU along the rounds and Δ% against each host.",
                HOST_DEA_MEMBERS, resnet=False),
    convergence("feddea/fig7-convergence-plugins-resnet18", "Fig. 7: Fig. 5 with ResNet-18",
                "FedAvg alone and with each plug-in on a ResNet-18 encoder, along the rounds.",
                PLUGIN_MEMBERS, resnet=True),
    convergence("feddea/fig8-convergence-hosts-resnet18", "Fig. 8: Fig. 6 with ResNet-18",
                "FedAvg, FedProx and FedDyn alone and with DEA on a ResNet-18 encoder, along the rounds.",
                HOST_DEA_MEMBERS, resnet=True),
)

# --- the digits analyses (docs/hosts_and_plugins.md) ------------------------------------------------------------


def peak_accuracy(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    """The best average over tasks (in %) of any evaluated round: where a member that collapses stood before."""
    from manytask.report.runs import accuracy_curve

    _, values = accuracy_curve(record)
    return 100 * max(values) if values else None


DIGITS_GRID = "configs/feddea/digits_hosts_plugins.yaml"
DIGITS_HOSTS = ("method=[fedavg, feddyn, fedacg]",)
DIGITS_NOTE = ("Not one of the paper's tables: its Table 3 grid on an offline stand-in with one task per client, the "
               "paper's setting. Six `digits-tasks` tasks (digit, parity, rotated, inverted, mod3, permuted), one "
               "client each with all its training data, every client every round, 30 rounds of one local epoch of "
               "SGD (lr 0.05, momentum 0.9, batch 32), an MLP [64] with BatchNorm; DEA at ρ = 0.3.")
DIGITS_VARIANTS = ("plugins=[none, {name: dea, rho: 0.3, label: dea}, {name: dea, rho: 0.3, rescale: false, label: "
                   "dea-no-rescale}, {name: dea, rho: 0.3, select: random, label: dea-random}, {name: dea, rho: 0.3, "
                   "select: smallest, label: dea-smallest}, {name: dea, rho: 0.1, label: dea-10}, {name: dea, rho: "
                   "0.6, label: dea-60}]",)
DIGITS_RHO = rho_plugins((5, 6, 8))
ACCURACY_COLUMN = Column("accuracy %", accuracy)
PEAK_COLUMN = Column("peak accuracy %", peak_accuracy)
CONFLICTS_COLUMN = Column("conflicting pairs per round", fit_mean("pcgrad/conflicts"))

register(
    PaperExperiment(
        id="feddea/analysis-digits-grid", title="Analysis: eight hosts × DEA, PCGrad and FedHEAL on six digits tasks",
        shows="each of the eight hosts alone and with DEA (ρ = 0.3), PCGrad and FedHEAL, one client per task: the "
              "final and the best evaluated average accuracy, Δ% against the host, DEA's norm inflation c, the "
              "upload per round and how many of the 15 client pairs PCGrad finds in conflict per round.",
        columns=(ACCURACY_COLUMN, PEAK_COLUMN, DELTA_COLUMN, STEP_COLUMN, UPLOAD_COLUMN, CONFLICTS_COLUMN),
        scales={"smoke": Scale(DIGITS_GRID, TWO_ROUNDS, members=grid_members(("feddyn",))),
                "cpu": Scale(DIGITS_GRID, seeds=CPU_SEEDS)},
        paper_note=DIGITS_NOTE),
    PaperExperiment(
        id="feddea/analysis-digits-dea-variants",
        title="Analysis: which part of DEA breaks FedDyn and FedACG on six digits tasks",
        shows="FedAvg, FedDyn and FedACG with DEA at ρ = 0.3, without its 1/ρ rescale, with a random mask or the "
              "smallest entries instead of the largest, and at ρ = 0.1 and 0.6: Δ% against the host and DEA's norm "
              "inflation c.",
        columns=(DELTA_COLUMN, STEP_COLUMN),
        scales={"smoke": Scale(DIGITS_GRID, (*TWO_ROUNDS, *DIGITS_HOSTS, *DIGITS_VARIANTS),
                               members=("feddyn", "feddyn+dea", "feddyn+dea-no-rescale", "feddyn+dea-smallest")),
                "cpu": Scale(DIGITS_GRID, (*DIGITS_HOSTS, *DIGITS_VARIANTS))},  # seed 0: 3 seeds ~24 min
        paper_note=DIGITS_NOTE),
    PaperExperiment(
        id="feddea/analysis-digits-rho", title="Analysis: DEA at ρ = 0.5, 0.6 and 0.8 on six digits tasks",
        shows="FedAvg, FedDyn and FedACG alone and with DEA at ρ = 0.5, 0.6 and 0.8: Δ% against the host, DEA's "
              "norm inflation c and the upload per round.",
        columns=(DELTA_COLUMN, STEP_COLUMN, UPLOAD_COLUMN),
        scales={"smoke": Scale(DIGITS_GRID, (*TWO_ROUNDS, *DIGITS_HOSTS, *DIGITS_RHO),
                               members=("feddyn", "feddyn+dea-50", "feddyn+dea-80")),
                "cpu": Scale(DIGITS_GRID, (*DIGITS_HOSTS, *DIGITS_RHO), seeds=CPU_SEEDS)},
        paper_note=DIGITS_NOTE),
)

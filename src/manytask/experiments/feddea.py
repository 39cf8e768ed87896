"""FedDEA's experiments ("Towards Unified Modeling in Federated Multi-Task Learning via Subspace Decoupling"):
Tables 1-6 and Figs. 2 and 4-8; Table 3 and two tables at the paper's step size with the server-step control the
results page's verdict rests on (each host with its server step scaled by DEA's logged norm inflation); the test of
the likeliest cause of the PCGrad gap; and the two runners they need (`server-step-control`, `update-overlap`).

The paper never states the ρ of its tables (its Fig. 4 sweeps 10-100 % and shows an interior optimum, in a picture
only); every FedDEA config here runs ρ = 0.5, DEA's default (`methods/plugins/dea.py`), except the digits grid
(0.3)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import statistics
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from manytask.experiments.measures import fit_mean
from manytask.experiments.runner import (
    RUNNERS,
    Unit,
    Workers,
    estimate,
    pending,
    run_with_estimate,
    units,
)
from manytask.experiments.spec import Column, Measure, PaperExperiment, Scale, Value, paper, register
from manytask.report.runs import RunRecord, load_run

if TYPE_CHECKING:
    from torch import Tensor

    from manytask.config import RunConfig

paper("feddea", "FedDEA: decoupled aggregation as a plug-in for eight hosts",
      "FedDEA's claim: each client keeping the top ρ of its update's entries, rescaled by 1/ρ, improves every one "
      "of eight host optimizers on NYUD-v2 and PASCAL-Context (Δ% +1.5 to +21 with Swin-T), where PCGrad and "
      "FedHEAL mostly hurt, and builds one model for all the clients' tasks.")

INFLATION = "dea/inflation"  # DEA's logged c = ‖Δ̃‖ / ‖Δ‖, the round's mean over clients
STATEFUL = ("feddyn", "fedacg")  # hosts whose server rule keeps state fed by the updates
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


def upload_kb(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    """Kilobytes every client together uploads per round."""
    rounds = record.summary.get("engine_rounds") or record.summary.get("rounds")
    sent = record.summary.get("bytes_up")
    return None if not rounds or sent is None else float(sent) / float(rounds) / 1000


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

NYUD = ("semseg mIoU", "depth RMSE", "normals mErr", "edge odsF")
PASCAL = ("semseg mIoU", "parts mIoU", "normals mErr", "saliency maxF", "edge odsF")
DELTA = "Δ%"


def paper_rows(text: str, columns: tuple[str, ...]) -> dict[str, dict[str, Value]]:
    """The paper's table rows, one a line: a label, then a figure per column (`-`: none given)."""
    rows: dict[str, dict[str, Value]] = {}
    for line in text.strip().splitlines():
        label, *values = line.split()
        if len(values) != len(columns):
            raise ValueError(f"paper row '{label}' has {len(values)} figures for {len(columns)} columns")
        rows[label] = {c: float(v) for c, v in zip(columns, values, strict=True) if v != "-"}
    return rows


# Table 3 (Swin-T), NYUD-v2: mIoU, RMSE, mErr, odsF, Δ%.
TABLE3_NYUD = paper_rows("""
fedavg 23.05 0.7213 26.52 75.19 -
fedavg+pcgrad 16.48 1.5323 29.64 74.59 -38.37
fedavg+fedheal 23.37 0.7628 26.65 74.50 -1.44
fedavg+dea 30.78 0.7052 24.62 74.77 10.60
fedprox 22.57 0.7104 26.97 75.16 -
fedprox+pcgrad 16.45 1.5227 29.05 74.16 -37.62
fedprox+fedheal 21.57 0.7545 25.48 74.25 -1.58
fedprox+dea 32.36 0.7229 24.61 75.31 12.65
fednova 24.78 0.7195 26.35 75.20 -
fednova+pcgrad 5.56 0.7411 30.20 74.29 -24.10
fednova+fedheal 23.16 0.7044 26.58 74.28 -1.63
fednova+dea 30.37 0.7160 24.75 74.50 7.05
feddyn 22.81 0.7234 26.68 75.28 -
feddyn+pcgrad 14.12 1.5366 29.48 74.29 -40.56
feddyn+fedheal 21.92 0.7119 26.84 74.25 -1.06
feddyn+dea 31.11 0.7232 24.66 74.50 10.75
moon 13.66 0.7192 26.06 75.19 -
moon+pcgrad 18.85 1.7297 30.31 74.10 -30.06
moon+fedheal 13.70 0.7018 26.49 74.26 -0.04
moon+dea 26.15 0.7738 25.66 74.25 21.03
fedbn 24.42 0.7174 26.90 75.06 -
fedbn+pcgrad 19.26 1.4769 29.64 74.26 -34.56
fedbn+fedheal 23.57 0.7158 26.65 74.65 -0.71
fedbn+dea 30.32 0.7179 24.53 74.68 8.10
fedga 26.49 0.7419 55.30 75.46 -
fedga+pcgrad 4.71 1.8604 80.22 74.29 -69.90
fedga+fedheal 22.87 0.7274 48.20 75.16 0.18
fedga+dea 28.07 0.7331 55.91 75.44 1.50
fedacg 31.54 0.7526 25.76 75.19 -
fedacg+pcgrad 31.35 0.7134 25.46 74.25 1.13
fedacg+fedheal 31.84 0.7057 25.78 74.28 1.47
fedacg+dea 32.51 0.7234 25.19 74.93 2.20
""", (*NYUD, DELTA))

# Table 3 (Swin-T), PASCAL-Context: semseg mIoU, parts mIoU, mErr, maxF, odsF, Δ%.
TABLE3_PASCAL = paper_rows("""
fedavg 47.22 44.55 17.45 79.09 69.66 -
fedavg+pcgrad 26.01 41.53 22.35 77.94 68.85 -16.48
fedavg+fedheal 46.22 37.46 17.30 78.69 69.47 -3.59
fedavg+dea 55.23 51.18 16.69 79.24 69.25 7.16
fedprox 38.40 43.79 17.49 79.76 69.58 -
fedprox+pcgrad 29.41 39.45 21.44 77.98 69.26 -11.72
fedprox+fedheal 36.95 42.68 17.37 79.44 69.40 -1.26
fedprox+dea 54.73 51.40 16.64 79.73 69.42 12.89
fednova 41.83 46.77 17.67 78.77 69.67 -
fednova+pcgrad 7.29 29.66 20.94 78.13 69.69 -27.68
fednova+fedheal 47.49 48.14 17.39 78.76 68.70 3.33
fednova+dea 49.01 46.46 17.09 79.08 69.72 4.05
feddyn 45.21 43.34 17.53 78.90 69.76 -
feddyn+pcgrad 23.36 39.12 21.87 77.14 68.40 -17.41
feddyn+fedheal 44.55 40.42 17.52 78.72 69.59 -1.73
feddyn+dea 56.20 50.35 16.50 79.27 69.01 9.15
moon 22.18 36.90 17.98 78.83 68.40 -
moon+pcgrad 40.84 40.01 17.53 79.51 68.72 -2.80
moon+fedheal 42.18 41.90 17.27 78.83 68.40 -1.30
moon+dea 46.76 45.22 16.99 79.57 68.43 2.84
fedbn 43.18 44.04 17.69 78.55 69.84 -
fedbn+pcgrad 42.15 44.22 17.66 78.54 69.59 -0.44
fedbn+fedheal 42.48 41.02 17.37 78.99 69.56 -1.30
fedbn+dea 52.48 47.03 17.26 78.45 69.82 6.12
fedga 53.80 43.49 87.75 78.47 70.46 -
fedga+pcgrad 8.91 20.27 93.03 43.09 68.56 -38.13
fedga+fedheal 44.55 40.42 88.31 78.72 69.76 -5.12
fedga+dea 56.38 45.46 86.03 78.56 70.04 2.16
fedacg 54.61 50.33 17.27 78.82 70.42 -
fedacg+pcgrad 54.73 50.12 16.79 79.85 70.02 0.67
fedacg+fedheal 55.65 50.01 17.11 78.68 69.83 0.24
fedacg+dea 56.86 51.39 16.94 78.95 70.04 1.55
""", (*PASCAL, DELTA))

# Table 5 (appendix, ResNet-18), NYUD-v2.
TABLE5_NYUD = paper_rows("""
fedavg 7.29 0.8349 28.08 72.78 -
fedavg+pcgrad 4.76 2.0593 38.97 68.02 -56.67
fedavg+fedheal 7.32 0.8540 28.17 72.54 -0.62
fedavg+dea 11.98 0.8494 27.84 72.74 15.88
fedprox 6.22 0.8412 28.34 72.64 -
fedprox+pcgrad 5.54 2.1193 35.61 66.92 -49.11
fedprox+fedheal 6.87 0.8388 28.07 64.52 0.14
fedprox+dea 10.22 0.8526 27.98 72.37 15.96
fednova 6.38 0.8450 28.11 72.28 -
fednova+pcgrad 2.39 0.9023 29.03 72.15 -18.20
fednova+fedheal 9.15 0.8418 28.03 72.60 6.16
fednova+dea 14.08 0.8420 27.68 72.56 23.39
feddyn 6.20 0.8429 27.99 72.38 -
feddyn+pcgrad 4.60 2.1045 37.97 65.57 -55.17
feddyn+fedheal 7.74 0.8525 27.84 72.32 6.01
feddyn+dea 11.70 0.8475 27.91 72.51 22.11
moon 5.50 0.8784 28.15 72.43 -
moon+pcgrad 1.83 2.3325 42.72 61.76 -74.68
moon+fedheal 6.29 0.8482 28.44 72.32 4.14
moon+dea 10.55 0.8491 27.74 72.51 24.20
fedbn 5.52 1.1024 32.25 69.37 -
fedbn+pcgrad 2.68 1.3254 34.89 66.38 -21.05
fedbn+fedheal 5.14 1.0356 34.36 68.43 -2.18
fedbn+dea 6.78 1.0736 33.90 68.48 4.75
fedga 8.95 0.8351 47.75 72.92 -
fedga+pcgrad 1.92 2.2631 48.81 67.29 -64.88
fedga+fedheal 7.07 0.8461 48.29 72.51 -6.03
fedga+dea 9.52 0.8433 47.21 72.56 1.49
fedacg 14.00 0.8495 28.10 72.21 -
fedacg+pcgrad 13.46 0.8278 28.20 72.79 -0.21
fedacg+fedheal 15.52 0.8461 28.10 72.87 3.06
fedacg+dea 16.02 0.8406 28.05 72.75 4.11
""", (*NYUD, DELTA))

# Table 5 (appendix, ResNet-18), PASCAL-Context.
TABLE5_PASCAL = paper_rows("""
fedavg 13.93 34.10 18.51 75.40 67.15 -
fedavg+pcgrad 9.41 27.20 70.63 70.08 59.95 -70.40
fedavg+fedheal 14.50 30.26 18.58 75.51 67.51 -1.37
fedavg+dea 23.54 42.72 18.54 75.49 67.07 18.82
fedprox 11.45 33.74 18.60 75.55 67.20 -
fedprox+pcgrad 7.03 26.70 77.41 69.88 60.89 -78.53
fedprox+fedheal 10.84 30.66 18.70 75.73 67.23 -2.95
fedprox+dea 21.07 42.24 18.45 75.56 67.38 22.06
fednova 14.48 35.79 18.62 75.51 67.11 -
fednova+pcgrad 4.06 21.99 20.48 75.17 65.75 -24.60
fednova+fedheal 11.54 39.01 18.69 75.52 66.78 -2.44
fednova+dea 29.47 43.51 18.14 75.43 67.33 25.56
feddyn 15.36 35.63 18.87 74.87 67.37 -
feddyn+pcgrad 8.49 26.10 70.67 69.13 59.32 -73.12
feddyn+fedheal 14.39 30.29 18.87 75.62 66.87 -4.21
feddyn+dea 27.05 42.27 18.37 75.34 67.98 19.78
moon 7.95 24.79 21.77 74.73 66.66 -
moon+pcgrad 0.45 4.62 89.81 41.36 19.09 -120.85
moon+fedheal 12.12 33.05 18.75 75.63 63.19 19.13
moon+dea 25.38 42.63 18.33 75.45 67.66 61.91
fedbn 11.39 21.26 41.41 70.10 57.07 -
fedbn+pcgrad 1.71 2.69 87.15 21.19 15.26 -85.17
fedbn+fedheal 9.86 19.72 41.05 69.31 59.51 -3.33
fedbn+dea 13.55 23.48 35.80 66.43 59.13 8.27
fedga 18.31 34.50 18.57 75.84 67.17 -
fedga+pcgrad 5.77 4.89 111.12 54.76 60.70 -138.00
fedga+fedheal 16.65 31.36 18.39 75.76 67.01 -3.51
fedga+dea 22.55 39.48 18.48 75.30 67.33 7.52
fedacg 29.99 43.71 18.04 75.26 66.87 -
fedacg+pcgrad 27.89 46.40 17.78 75.51 67.21 0.29
fedacg+fedheal 28.51 43.59 18.13 75.42 67.22 -0.99
fedacg+dea 33.97 44.37 17.90 75.46 67.87 3.47
""", (*PASCAL, DELTA))

# Tables 4 (Swin-T) and 6 (ResNet-18): DEA's ablation on NYUD-v2, FedAvg host; (a) smallest, (b) no rescale,
# (c) random mask.
TABLE4 = paper_rows("""
fedavg 23.05 0.7213 26.52 75.19 -
fedavg+dea-smallest 1.22 2.1058 52.40 57.44 -101.96
fedavg+dea-no-rescale 11.49 0.7351 27.74 75.17 -14.17
fedavg+dea-random 24.41 0.7352 26.90 75.18 0.64
fedavg+dea 30.78 0.7052 24.62 74.77 10.60
""", (*NYUD, DELTA))
TABLE6 = paper_rows("""
fedavg 7.29 0.8349 28.08 72.78 -
fedavg+dea-smallest 2.92 1.2037 34.55 69.68 -32.84
fedavg+dea-no-rescale 6.73 0.8428 27.98 72.41 -2.17
fedavg+dea-random 7.62 0.8567 28.12 72.90 0.50
fedavg+dea 11.98 0.8494 27.84 72.74 15.88
""", (*NYUD, DELTA))

# Tables 1-2: one model per task for Local, FedAMP, FedMTL and FedHCA² (the paper's rows X(Semseg), X(Depth), ...
# joined: each of our members evaluates every client on its own task), and FedDEA's one model for all tasks.
TABLE1 = paper_rows("""
local 31.15 0.7087 24.59 73.86
fedamp 33.86 0.7500 23.64 75.19
fedmtl 32.47 0.7674 23.58 75.28
fedhca2 32.93 0.7227 23.67 75.17
fedavg+dea 30.78 0.7052 24.62 74.77
fedprox+dea 31.46 0.6958 24.42 74.83
""", NYUD)
TABLE2 = paper_rows("""
local 50.48 49.86 16.23 78.20 68.20
fedamp 60.05 51.93 16.23 79.49 70.21
fedmtl 59.89 51.35 15.77 79.55 69.85
fedhca2 58.25 52.33 15.73 79.43 70.25
fedavg+dea 55.23 51.18 16.69 79.24 69.25
fedprox+dea 54.73 51.40 16.64 79.73 69.42
""", PASCAL)


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
UPLOAD_COLUMN = Column("upload kB/round", upload_kb, fmt="{:.0f}")

# --- scales -----------------------------------------------------------------------------------------------------

SMOKE = ("rounds=2", "eval_every=2", "benchmark.train_per_task=8", "benchmark.test_size=8", "benchmark.size=8",
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


# --- the server-step control: host, host + DEA, host + DEA by eq. 6, then host × c ---------------------------------


def _method(config: dict[str, Any]) -> dict[str, Any]:
    method = config["method"]
    return {"name": method} if isinstance(method, str) else dict(method)


def _with_method(unit: Unit, label: str, method: dict[str, Any]) -> Unit:
    """`unit`'s run with another method entry, labelled `label`, in its seed's folder."""
    config = yaml.safe_load(unit.config)
    config["method"] = {**method, "label": label}
    text = yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
    return Unit(unit.seed, label, text, unit.out.parent / label)


def paper_rule_units(todo: list[Unit]) -> list[Unit]:
    """For each `+dea` run of a stateful host, the same run with DEA's `rule: paper` (eq. 6 in place of the
    host's rule), labelled `<host>+dea-paper`."""
    made = []
    for unit in todo:
        host = unit.label.removesuffix("+dea")
        if unit.label.endswith("+dea") and host in STATEFUL:
            method = _method(yaml.safe_load(unit.config))
            method.pop("label", None)
            made.append(_with_method(unit, f"{host}+dea-paper", {**method, "plugin": {**method["plugin"],
                                                                                     "rule": "paper"}}))
    return made


def host_units(todo: list[Unit]) -> list[tuple[Unit, Unit]]:
    """(host run, its `+dea` run) for every host of `todo` that has both on the same seed."""
    by_key = {(unit.seed, unit.label): unit for unit in todo}
    return [(unit, by_key[unit.seed, f"{unit.label}+dea"]) for unit in todo
            if (unit.seed, f"{unit.label}+dea") in by_key]


def inflation(run: Path) -> float:
    """The mean over rounds of the norm inflation c a finished DEA run logged."""
    from manytask.errors import ManytaskError

    record = load_run(run)
    value = fit_mean(INFLATION)(record, {})
    if not isinstance(value, float):
        raise ManytaskError(f"'{run}' logged no {INFLATION}: the control needs DEA below ρ = 1.")
    return value


def scaled_units(pairs: list[tuple[Unit, Unit]]) -> list[Unit]:
    """Each host alone with its server step scaled by the c its DEA run logged on the same seed (`<host>×c`)."""
    made = []
    for host, dea in pairs:
        method = _method(yaml.safe_load(host.config))
        method.pop("label", None)
        made.append(_with_method(host, f"{host.label}×c", {**method, "server_lr": inflation(dea.out)}))
    return made


def control_order(todo: list[Unit]) -> list[Unit]:
    """Seed by seed and host by host: the host, its DEA run, its × c run, its eq. 6 run, then its other plug-ins'
    runs in the config's order, so the table reads by host."""
    rank = ("", "+dea", "×c", "+dea-paper")
    hosts = list(dict.fromkeys(host_of_label(u.label) for u in todo))

    def key(unit: Unit) -> tuple[int, int, int]:
        suffix = unit.label.removeprefix(host_of_label(unit.label))
        return unit.seed, hosts.index(host_of_label(unit.label)), rank.index(suffix) if suffix in rank else len(rank)

    return sorted(todo, key=key)


def host_of_label(label: str) -> str:
    """The host of a grid's or the control's member label (`fedavg+dea-paper`, `fedavg×c` -> `fedavg`)."""
    return label.removesuffix("×c").split("+", 1)[0]


def minutes(seconds: float) -> str:
    """An estimate as the runner words it: whole minutes (at least one), hours from 90 minutes on."""
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{max(1, math.ceil(seconds / 60))} min"


def server_step_control(experiment: PaperExperiment, scale: Scale, config: RunConfig, out: Path, workers: Workers,
                        probe: bool) -> list[Unit]:
    """The results page's control: stage 1 runs every host alone and with DEA (the scale's members) and each
    stateful host with DEA's eq. 6; stage 2 runs each host with `server_lr` = the mean c its DEA run logged on the
    same seed. The estimate counts a stage-2 run as its host's."""
    first = units(config, out, scale.members)
    first += paper_rule_units(first)
    pairs = host_units(first)
    if probe and pending(first):
        stand_ins = [replace(host, out=out / f"seed{host.seed}" / f"{host.label}×c") for host, _ in pairs]
        todo = pending(first) + pending(stand_ins)
        workers.log(f"{len(todo)} runs to go in two stages, {workers.jobs} at a time: about "
                    f"{minutes(estimate(todo, workers.jobs))} (from a one-round probe of each member)")
    run_with_estimate(first, workers, probe=False)
    second = scaled_units(pairs)
    run_with_estimate(second, workers, probe=False)
    return control_order(first + second)


# --- Fig. 2: where each task's top-10 % update entries lie -----------------------------------------------------

OVERLAP_FILE = "update_overlap.json"
TOP_FRACTION = 0.1  # Fig. 2 shows the top 10 % of each task's update


def top_masks(flat_updates: list[Tensor], fraction: float = TOP_FRACTION) -> list[Tensor]:
    """Each update's ⌊fraction·d⌋ entries of largest magnitude, as a boolean mask."""
    import torch

    masks = []
    for flat in flat_updates:
        mask = torch.zeros(flat.numel(), dtype=torch.bool)
        mask[torch.topk(flat.abs(), max(1, math.floor(fraction * flat.numel()))).indices] = True
        masks.append(mask)
    return masks


def overlap(masks: list[Tensor]) -> dict[str, float]:
    """Mean pairwise Jaccard index of the masks, and the mean share of a mask's entries that no other mask holds
    (both 0 and 1 where the tasks' entries are mutually exclusive, as the paper's Fig. 2 shows them)."""
    import torch

    pairs = [(a, b) for i, a in enumerate(masks) for b in masks[:i]]
    jaccard = statistics.fmean(float((a & b).sum() / (a | b).sum()) for a, b in pairs) if pairs else 0.0
    holders = torch.stack(masks).sum(dim=0)
    exclusive = statistics.fmean(float((m & (holders == 1)).sum() / m.sum()) for m in masks)
    return {"jaccard": jaccard, "exclusive": exclusive}


def shared_overlap(updates: list[Any]) -> dict[str, float]:
    """`overlap` of the clients' top-10 % sets over the parameters every client trained (the shared encoder: each
    decoder is one task's alone, so its entries would be exclusive by construction)."""
    import torch

    deltas = [u.deltas() for u in updates]
    shared = [k for k in deltas[0] if all(k in d for d in deltas[1:])]
    flats = [torch.cat([d[k].reshape(-1).double() for k in shared]) for d in deltas]
    return overlap(top_masks(flats))


def _run_recording_overlap(unit: Unit) -> tuple[Unit, float]:
    """One run from scratch with the server recording, every round, where the clients' top-10 % update entries
    lie (`update_overlap.json` in the run's folder); a finished run with that file is kept."""
    from manytask.config import validate
    from manytask.launch import run_config
    from manytask.methods.hosts.server import HostServer
    from manytask.rundir import RunDir

    began = time.perf_counter()
    if RunDir(unit.out).is_finished() and (unit.out / OVERLAP_FILE).is_file():
        return unit, 0.0
    shutil.rmtree(unit.out, ignore_errors=True)  # the rounds before a stop were not recorded: start again
    rounds: list[dict[str, float]] = []
    original = HostServer.read_updates

    def recording(server: HostServer, replies: Mapping[int, Any]) -> list[Any]:
        updates = original(server, replies)
        rounds.append(shared_overlap(updates))
        return updates

    HostServer.read_updates = recording  # type: ignore[method-assign]  # this worker's process only, undone below
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            run_config(validate(yaml.safe_load(unit.config)), unit.out)
    finally:
        HostServer.read_updates = original  # type: ignore[method-assign]
    (unit.out / OVERLAP_FILE).write_text(json.dumps({"fraction": TOP_FRACTION, "rounds": rounds}, indent=1) + "\n")
    return unit, time.perf_counter() - began


def update_overlap_runner(experiment: PaperExperiment, scale: Scale, config: RunConfig, out: Path, workers: Workers,
                          probe: bool) -> list[Unit]:
    """Fig. 2's runner: each member once per seed, recording where its clients' top-10 % update entries lie."""
    todo = units(config, out, scale.members)
    left = [u for u in todo if not (u.out / OVERLAP_FILE).is_file()]
    if probe and left:
        workers.log(f"{len(left)} runs to go, {workers.jobs} at a time: about {minutes(estimate(left, workers.jobs))} "
                    "(from a one-round probe)")
    for done, future in enumerate([workers.pool.submit(_run_recording_overlap, u) for u in left], 1):
        unit, seconds = future.result()
        workers.log(f"[{done}/{len(left)}] seed {unit.seed} {unit.label}: {seconds:.0f} s")
    return todo


def overlap_at(key: str, which: int) -> Measure:
    """A figure of `update_overlap.json` (`jaccard` or `exclusive`, in %) at round `which` (0: the first, -1: the
    last)."""

    def measure(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
        path = record.path / OVERLAP_FILE
        if not path.is_file():
            return None
        rounds = json.loads(path.read_text())["rounds"]
        return 100 * float(rounds[which][key]) if rounds else None

    return measure


RUNNERS["server-step-control"] = server_step_control
RUNNERS["update-overlap"] = update_overlap_runner


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
RHO_SWEEP = ("plugins=[none, " + ", ".join(f"{{name: dea, rho: {r / 10:g}, label: dea-{10 * r}}}" for r in range(1, 11))
             + "]",)
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

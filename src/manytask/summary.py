"""`summary.json` from an experiment and its metrics rows, and normalization against a reference run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from manytask.energy import energy_totals
from manytask.experiment import Experiment
from manytask.method_entry import plugin_label, split_plugin
from manytask.provenance import provenance


def average_main_metric(metrics: Mapping[str, Mapping[str, float]], main: Mapping[str, str]) -> float:
    """Mean of each task's main metric (accuracy for classification)."""
    return sum(metrics[t][main[t]] for t in metrics) / len(metrics)


def bits_per_task_per_round(rows: list[dict[str, Any]], holdings: Mapping[int, Mapping[str, int]]) -> float:
    """Upload bits per (client, task) upload: Σ upload bits / Σ_rounds Σ_{uploading clients} |tasks held|."""
    bits = sum(8 * b for row in rows for b in row["bytes_up"].values())
    uploads = sum(len(holdings[int(c)]) for row in rows for c in row["bytes_up"])
    return bits / uploads if uploads else 0.0


def total_test_loss(tasks: Mapping[str, Mapping[str, float]]) -> float | None:
    """Σ over tasks of the final test `loss` (the figure of merit of a many-task run); None if a task lacks it."""
    losses = [metrics.get("loss") for metrics in tasks.values()]
    if not losses or any(loss is None for loss in losses):
        return None
    return float(sum(losses))


def build_summary(
    experiment: Experiment, rows: list[dict[str, Any]], wall_seconds: float,
    evaluation: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's summary from its metric rows; the results are those of `evaluation` when given (a run stopped
    before its last round), else of the last row that evaluated."""
    config = experiment.config
    specs = experiment.setup.specs
    last_eval = evaluation or next(r for r in reversed(rows) if "eval" in r)
    main = {t: specs[t].main_metric for t in specs}
    return {
        "method": experiment.method_name,
        "label": experiment.label,
        "method_params": experiment.method_params.model_dump(mode="json"),
        "plugin": None if experiment.plugin_params is None else split_plugin(config.method)[0],
        "plugin_label": plugin_label(config.method),
        "plugin_params": None if experiment.plugin_params is None else experiment.plugin_params.model_dump(mode="json"),
        "benchmark": config.benchmark["name"],
        "seed": config.seed,
        "rounds": config.rounds,
        "engine_rounds": experiment.total_rounds,
        "num_clients": experiment.federation.num_clients,
        "data_fingerprint": experiment.data_fingerprint,  # every client's training data and the test sets
        "backbone": describe_backbone(experiment),
        "optimizer": config.train.describe(),  # the clients' effective optimizer (momentum included)
        "pretraining": experiment.pretraining,
        "adapter": experiment.setup.adapter,
        "task_groups": experiment.benchmark.metadata.get("groups"),  # true latent groups, where a benchmark has them
        "tasks": last_eval["eval"],
        "main_metric": main,
        "higher_is_better": {t: specs[t].higher_is_better for t in specs},
        "task_kinds": {t: specs[t].kind.value for t in specs},
        "chance": {t: specs[t].chance for t in specs},
        "average": last_eval["average"],
        "fairness": last_eval.get("fairness"),  # across clients: mean, worst 10 %, worst 20 %, std
        # "server": the clients' scores are the server's per-task models on the tasks each holds (clients holding
        # the same tasks score the same); "clients": each client's own model
        "clients_scored_by": last_eval.get("clients_scored_by"),
        "normalized_average": None,
        "reference": None,
        "bytes_up": sum(b for r in rows for b in r["bytes_up"].values()),
        "bytes_down": sum(b for r in rows for b in r["bytes_down"].values()),
        "bits_per_task_per_round": bits_per_task_per_round(rows, experiment.setup.holdings),
        "wall_seconds": wall_seconds,
        "client_compute_seconds": sum(s for r in rows for s in r["client_seconds"].values()),
        "total_test_loss": total_test_loss(last_eval["eval"]),
        "power_watts": config.power_watts,  # the stated power behind an energy estimate
        **energy_totals(rows, config.power_watts),  # energy_joules, energy_estimated, energy_source
        "failed_clients": failed_clients(rows),
        "privacy": privacy(rows, experiment.plugin_params),
        "adversaries": None if config.adversaries is None else {
            **config.adversaries.model_dump(mode="json", exclude_none=True),
            "attackers": sorted(experiment.adversary_clients)},
        "provenance": provenance(config.device),  # of the process that finished the run
    }


def privacy(rows: list[dict[str, Any]], plugin_params: Any) -> dict[str, Any] | None:
    """The (ε, δ) a run with the `dp` plug-in had spent after its last aggregated round, and its mechanism; None
    without it."""
    spent = [row for row in rows if "dp/epsilon" in row.get("fit", {})]
    if not spent:
        return None
    last = spent[-1]
    return {"epsilon": last["fit"]["dp/epsilon"], "delta": plugin_params.delta, "after_round": last["round"],
            "where": plugin_params.where, "noise_multiplier": plugin_params.noise_multiplier,
            "clip": last["fit"].get("dp/clip", plugin_params.clip), "adaptive": plugin_params.adaptive}


def failed_clients(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every client that failed a round (lost, dropped, or its reply refused): in how many rounds, the last of them,
    and the reason it gave most often (the latest among equals)."""
    failed: dict[str, dict[str, Any]] = {}
    for row in rows:
        for client, reason in row.get("failures", {}).items():
            entry = failed.setdefault(client, {"rounds": 0, "last_round": 0, "reasons": {}})
            entry["rounds"] += 1
            entry["last_round"] = row["round"]
            entry["reasons"][reason] = entry["reasons"].get(reason, 0) + 1
    for entry in failed.values():
        reasons = entry.pop("reasons")
        entry["reason"] = max(reversed(list(reasons)), key=reasons.get)
    return dict(sorted(failed.items(), key=lambda item: int(item[0])))


def describe_backbone(experiment: Experiment) -> str:
    params = ", ".join(f"{k}={v}" for k, v in experiment.setup.backbone_params.items())
    return f"{experiment.setup.backbone}({params})"


def normalize(summary: dict[str, Any], reference: Mapping[str, Any], reference_label: str) -> None:
    """Add the normalized average: mean over tasks of metric / reference metric (classification tasks)."""
    ratios = []
    for task, metrics in summary["tasks"].items():
        ref = reference["tasks"].get(task)
        main = summary["main_metric"][task]
        if ref and main == "accuracy" and ref[main] > 0:
            ratios.append(metrics[main] / ref[main])
    if ratios:
        summary["normalized_average"] = sum(ratios) / len(ratios)
        summary["reference"] = reference_label


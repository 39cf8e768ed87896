"""Runs of several seeds (`seeds:`): each member's mean ± standard deviation over its seeds, the per-seed values,
and whether its difference from the best member is within noise.

The standard deviation is the sample one (n − 1 in the denominator; 0 for a single seed). A member is marked within
noise of the best when |mean − best mean| ≤ the larger of the two standard deviations: the difference is then not
told apart from seed-to-seed variation, whatever the ranking says."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.ticker import MaxNLocator

from manytask.report.delta import delta_percent
from manytask.report.graph import community_summary
from manytask.report.plots import finish_legend, new_axes, run_color, save_figure
from manytask.report.runs import RunRecord, accuracy_curve, all_accuracy, has_dense_tasks, main_metric, read_oracle
from manytask.report.tables import MISSING, human_bits, task_columns

WITHIN_NOISE = "≈ best"
NOISE_NOTE = (f"mean ± sample standard deviation over seeds (n − 1); {WITHIN_NOISE}: the difference from the best "
              "mean is within one standard deviation (the larger of the two), so it is not told apart from noise.")

Getter = Callable[[RunRecord], float | None]


@dataclass
class SeedGroup:
    """One member's runs, one per seed, in seed order."""

    label: str
    records: list[RunRecord]

    @property
    def seeds(self) -> list[int]:
        return [int(r.summary.get("seed", 0)) for r in self.records]

    def values(self, get: Getter) -> list[float]:
        """`get` of every seed's run that has it."""
        return [float(v) for r in self.records if (v := get(r)) is not None]


def seed_groups(records: Sequence[RunRecord]) -> list[SeedGroup] | None:
    """The runs grouped by member (first-seen order), when any of them is one seed of several; else None."""
    if not any(r.seeded for r in records):
        return None
    groups: dict[str, list[RunRecord]] = {}
    for record in records:
        groups.setdefault(record.group, []).append(record)
    return [SeedGroup(label, sorted(runs, key=lambda r: int(r.summary.get("seed", 0))))
            for label, runs in groups.items()]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n − 1; 0 for one value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def within_noise(values: Sequence[float], best: Sequence[float]) -> bool:
    """|mean − best mean| ≤ max(std, best std)."""
    (mean, std), (top, top_std) = mean_std(values), mean_std(best)
    return abs(mean - top) <= max(std, top_std)


def average_direction(records: Sequence[RunRecord]) -> int | None:
    """+1 when a higher average is better (every task's main metric is accuracy), −1 when lower is (all mse), None
    when averages do not compare (dense tasks, or metrics of both kinds)."""
    if any(has_dense_tasks(r) for r in records):
        return None
    if all_accuracy(records):
        return 1
    metrics = {main_metric(r, task) for r in records for task in r.tasks}
    return -1 if metrics == {"mse"} else None


def _average(record: RunRecord) -> float | None:
    return record.summary.get("average")


def _spread(values: Sequence[float], percent: bool) -> str:
    if not values:
        return MISSING
    mean, std = mean_std(values)
    return f"{100 * mean:.1f} ± {100 * std:.1f}%" if percent else f"{mean:.4f} ± {std:.4f}"


def _each(values: Sequence[float], percent: bool) -> str:
    return " / ".join(f"{100 * v:.1f}" if percent else f"{v:.4f}" for v in values) or MISSING


def best_group(groups: Sequence[SeedGroup], direction: int | None) -> SeedGroup | None:
    """The member with the best mean average, or None when averages do not compare."""
    scored = [(mean_std(vals)[0], g) for g in groups if direction is not None and (vals := g.values(_average))]
    if not scored:
        return None
    return max(scored, key=lambda pair: direction * pair[0])[1]


def _versus_best(group: SeedGroup, best: SeedGroup | None, percent: bool) -> str:
    values = group.values(_average)
    if best is None or not values:
        return MISSING
    if group is best:
        return "best"
    if within_noise(values, best.values(_average)):
        return WITHIN_NOISE
    gap = mean_std(values)[0] - mean_std(best.values(_average))[0]
    return f"{100 * gap:+.1f} pts" if percent else f"{gap:+.4f}"


def _seed_delta(group: SeedGroup, base: SeedGroup | None) -> str:
    """Δ% against the base member, seed by seed (each run against the base's run of the same seed)."""
    if base is None:
        return MISSING
    by_seed = dict(zip(base.seeds, base.records, strict=True))
    gains = [d for r in group.records if (b := by_seed.get(int(r.summary.get("seed", 0)))) is not None
             and (d := delta_percent(r, b)) is not None]
    if not gains:
        return MISSING
    mean, std = mean_std(gains)
    return f"{mean:+.2f} ± {std:.2f}"


def _task_getter(task: str, metric: str) -> Getter:
    return lambda r: ((r.summary.get("tasks") or {}).get(task) or {}).get(metric)


def _mean_ari(record: RunRecord) -> float | None:
    found = community_summary(record)
    return None if found is None or not found.ari_rounds else found.mean_ari


def _true_modularity(record: RunRecord) -> float | None:
    found = community_summary(record)
    return None if found is None else found.true_modularity


def _oracle_ari(record: RunRecord) -> float | None:
    found = read_oracle(record.path)
    return None if found is None else found["ari"]


def _worst_10(record: RunRecord) -> float | None:
    return (record.summary.get("fairness") or {}).get("worst_10")


def _normalized(record: RunRecord) -> float | None:
    return record.summary.get("normalized_average")


def _bits(record: RunRecord) -> float | None:
    return record.summary.get("bits_per_task_per_round")


def seed_table(records: Sequence[RunRecord], base: str | None = None,
               max_task_columns: int | None = None) -> tuple[list[str], list[list[str]]] | None:
    """One row per member over its seeds: the seeds, the average (mean ± std and each seed's value), how it stands
    against the best member, Δ% against `base` (seed by seed), the normalized average, each task's main metric
    (up to `max_task_columns` tasks), bits per task per round, and where recorded the community ARI averaged over
    rounds and the worst 10 % of clients. None when no run is one seed of several."""
    groups = seed_groups(records)
    if groups is None:
        return None
    direction = average_direction(records)
    percent = direction == 1
    best = best_group(groups, direction)
    base_group = next((g for g in groups if g.label == base), None)
    tasks = task_columns(records)
    if max_task_columns is not None and len(tasks) > max_task_columns:
        tasks = []
    optional = [(name, get, pct) for name, get, pct in (
        ("community ARI, mean over rounds", _mean_ari, False),
        ("true clusters' modularity on its graph", _true_modularity, False),
        ("cross-evaluation oracle ARI", _oracle_ari, False),
        ("worst 10 % of clients", _worst_10, percent),
    ) if any(get(r) is not None for r in records)]
    headers = ["run", "seeds", "average", "per seed", "vs best",
               *([f"Δ% vs {base_group.label}"] if base_group else []), "normalized",
               *(f"{task} ({'acc' if metric == 'accuracy' else metric})" for task, metric in tasks),
               "bits/task/round", *(name for name, _, _ in optional)]
    rows = []
    for group in groups:
        averages = group.values(_average)
        bits = group.values(_bits)
        rows.append([
            group.label, ", ".join(str(s) for s in group.seeds), _spread(averages, percent), _each(averages, percent),
            _versus_best(group, best, percent), *([_seed_delta(group, base_group)] if base_group else []),
            _spread(group.values(_normalized), True),
            *(_spread(group.values(_task_getter(t, m)), m == "accuracy") for t, m in tasks),
            human_bits(mean_std(bits)[0]) if bits else MISSING,
            *(_spread(group.values(get), pct) for _, get, pct in optional),
        ])
    return headers, rows


def plot_seed_bands(records: Sequence[RunRecord], path: str | Path) -> Path | None:
    """Average by round, one line per member: the mean over its seeds, with a band of ± one standard deviation
    (over the rounds every seed evaluated). None when no run is one seed of several."""
    groups = seed_groups(records)
    if groups is None:
        return None
    direction = average_direction(records)
    scale = 100.0 if direction == 1 else 1.0
    figure, axes = new_axes("Average by round, mean ± std over seeds")
    skipped = []
    for index, group in enumerate(groups):
        curves = [dict(zip(*accuracy_curve(r), strict=True)) for r in group.records]
        rounds = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        if not rounds:
            skipped.append(f"{group.label}: no round evaluated by every seed")
            continue
        stats = [mean_std([scale * c[r] for c in curves]) for r in rounds]
        mean = [m for m, _ in stats]
        color = run_color(index, len(groups))
        axes.plot(rounds, mean, color=color, marker="o", markersize=3,
                  label=f"{group.label} ({len(group.records)} seeds)")
        axes.fill_between(rounds, [m - s for m, s in stats], [m + s for m, s in stats], color=color, alpha=0.2)
    axes.set(xlabel="round", ylabel="average accuracy (%)" if direction == 1 else "average main metric")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    finish_legend(axes, skipped)
    return save_figure(figure, path)

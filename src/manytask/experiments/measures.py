"""The measures a column of an experiment's table is built from: each takes a member's finished run and the runs
of the same seed by label, and gives a number (or a short text), or None where the run does not have it."""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from manytask.experiments.spec import Measure, Value
from manytask.report.runs import RunRecord, eval_rows


def accuracy(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    """The average over tasks of the final main metric, in % (accuracy for classification tasks)."""
    value = record.summary.get("average")
    return None if value is None else 100 * float(value)


def summary_key(key: str, scale: float = 1.0) -> Measure:
    """A number of the member's summary.json (`total_test_loss`, `bits_per_task_per_round`, ...), times `scale`."""

    def measure(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
        value = record.summary.get(key)
        return None if value is None else scale * float(value)

    return measure


def fairness(key: str) -> Measure:
    """A figure of the final evaluation's fairness across clients (`mean`, `worst_10`, `worst_20`, `std`), in %."""

    def measure(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
        value = (record.summary.get("fairness") or {}).get(key)
        return None if value is None else 100 * float(value)

    return measure


def delta_against(base: str) -> Measure:
    """Δ% of the member against the member labelled `base` on the same seed (FedDEA's multi-task gain); None for
    the base itself."""

    def measure(record: RunRecord, runs: Mapping[str, RunRecord]) -> Value:
        from manytask.report.delta import delta_percent

        if record.group == base or base not in runs:
            return None
        return delta_percent(record, runs[base])

    return measure


def fit_mean(key: str) -> Measure:
    """The mean over rounds of a number the member logged in its rounds' `fit` (DEA's `dea/inflation`, say)."""

    def measure(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
        values = [row["fit"][key] for row in record.metrics if key in (row.get("fit") or {})]
        return statistics.fmean(values) if values else None

    return measure


def accuracy_at_phase_end(phase: int) -> Measure:
    """The last average evaluated (in %) in the rounds of `fit.phase` == `phase`: where a staged method's next
    phase starts (TaLoS's start: the end of its head-only phase); None for a run without that phase."""

    def measure(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
        rounds = [row["round"] for row in record.metrics if (row.get("fit") or {}).get("phase") == phase]
        if not rounds:
            return None
        rows = [row for row in eval_rows(record) if row["round"] <= max(rounds) and row.get("average") is not None]
        return 100 * float(rows[-1]["average"]) if rows else None

    return measure


def gain_over_phase_end(phase: int) -> Measure:
    """The final accuracy minus the one at the end of phase `phase` (points)."""
    start = accuracy_at_phase_end(phase)

    def measure(record: RunRecord, runs: Mapping[str, RunRecord]) -> Value:
        before, after = start(record, runs), accuracy(record, runs)
        return None if before is None or after is None else float(after) - float(before)

    return measure


def minus_member(measure: Measure, other: str) -> Measure:
    """`measure` of the member minus the same of member `other` on the same seed; None for `other` itself."""

    def difference(record: RunRecord, runs: Mapping[str, RunRecord]) -> Value:
        if record.group == other or other not in runs:
            return None
        mine, theirs = measure(record, runs), measure(runs[other], runs)
        if not isinstance(mine, float | int) or not isinstance(theirs, float | int):
            return None
        return float(mine) - float(theirs)

    return difference


def engine_rounds(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    return float(record.summary.get("engine_rounds") or record.summary.get("rounds") or 0)


def upload_per_round(scale: float) -> Measure:
    """Bytes every participant together uploads per engine round, times `scale` (1e-3 for kB, 8e-6 for Mbit)."""

    def measure(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
        rounds = record.summary.get("engine_rounds") or record.summary.get("rounds")
        sent = record.summary.get("bytes_up")
        return None if not rounds or sent is None else scale * float(sent) / float(rounds)

    return measure

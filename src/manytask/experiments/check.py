"""`manytask reproduce check`: run every experiment's smoke scale on this tree and compare its fingerprint with
the one each committed result file recorded. A table whose fingerprint moved is stale: `--mark` records the commit
that first found it in `results/stale.json`, and the rendered page says "stale since <commit>". A table measured
on an earlier tree stands as long as its fingerprint holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from manytask.experiments.catalogue import select
from manytask.experiments.reproduce import measured_scales, missing_needs, smoke_fingerprint, stale_marks
from manytask.experiments.results import holds, load_result, result_path
from manytask.experiments.runner import Log, Workers
from manytask.experiments.spec import PaperExperiment


@dataclass(frozen=True)
class Checked:
    """One experiment's check: its smoke fingerprint on this tree (None where the smoke run failed, with the
    error), and each measured scale's verdict: `holds` or `stale`."""

    id: str
    fingerprint: dict[str, Any] | None
    scales: dict[str, str]
    error: str = ""
    skipped: bool = False


def _check_one(experiment: PaperExperiment, workers: Workers) -> Checked:
    missing = missing_needs(experiment.scale("smoke"))
    if missing:  # an optional dataset this machine lacks (Fashion-MNIST's Debian package): said, not failed
        return Checked(experiment.id, None, {}, f"skipped: needs {', '.join(missing)}", skipped=True)
    try:
        found = smoke_fingerprint(experiment, workers)
    except Exception as err:  # one failing experiment must not hide the others' verdicts
        return Checked(experiment.id, None, {}, f"{type(err).__name__}: {err}")
    verdicts = {scale: "holds" if holds(load_result(result_path(experiment.id, scale))["fingerprint"], found)
                else "stale" for scale in measured_scales(experiment.id)}
    return Checked(experiment.id, found, verdicts)


def check(ids: list[str], jobs: int, log: Log) -> list[Checked]:
    """Every selected experiment's smoke run (those waiting for methods skipped), its runs `jobs` at a time."""
    chosen = [e for e in select(ids) if not e.waiting_for]
    checked = []
    # One experiment at a time (its runs `jobs` at a time): some runners count FLOPs or draw figures in this
    # process, under redirected output and torch's thread setting, which are global and must not interleave.
    with Workers(jobs, lambda _: None) as workers:
        for experiment in chosen:
            checked.append(_check_one(experiment, workers))
            log(line(checked[-1]))
    return checked


def line(checked: Checked) -> str:
    if checked.skipped:
        return f"SKIPPED {checked.id}: {checked.error}"
    if checked.fingerprint is None:
        return f"FAILED  {checked.id}: {checked.error}"
    verdicts = ", ".join(f"{scale} {verdict}" for scale, verdict in checked.scales.items()) or "no result file"
    word = "STALE  " if "stale" in checked.scales.values() else "ok     "
    return f"{word} {checked.id}: smoke {checked.fingerprint['sha256']}; {verdicts}"


def new_marks(checked: list[Checked], commit: str) -> tuple[dict[str, dict[str, str]], list[str]]:
    """The marks after this check (a stale table keeps the commit that first found it; a table that holds loses
    its mark) and the tables found stale that were not marked before."""
    marks = stale_marks()
    fresh = []
    for item in checked:
        for scale, verdict in item.scales.items():
            key = f"{item.id}/{scale}"
            if verdict == "holds":
                marks.pop(key, None)
            elif key not in marks:
                fresh.append(key)
                marks[key] = {"since": commit, "fingerprint": item.fingerprint["sha256"] if item.fingerprint else ""}
    return marks, fresh

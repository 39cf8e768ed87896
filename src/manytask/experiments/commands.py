"""The bodies of `manytask reproduce ID | render | check`: what each prints, and whether `check` passed."""

from __future__ import annotations

from pathlib import Path

from manytask.experiments.catalogue import experiment_by_id
from manytask.experiments.runner import Log


def reproduce_one(experiment_id: str, scale: str, seeds: tuple[int, ...] | None, jobs: int, out: Path | None,
                  say: Log) -> None:
    from manytask.experiments.reproduce import describe, reproduce

    experiment = experiment_by_id(experiment_id)
    result, path = reproduce(experiment_id, scale, seeds, jobs, out, say)
    say(describe(experiment, result))
    if path is not None:
        say(f"result: {path}  (manytask reproduce render puts it on the page)")


def render_pages(say: Log) -> None:
    from manytask.experiments.render import render

    written = render()
    say("rendered: " + (", ".join(str(p) for p in written) if written else "every page was up to date"))


def check_tables(ids: list[str], jobs: int, mark: bool, say: Log) -> bool:
    """Check the tables; True where every smoke run ran and no table went stale without a mark."""
    from manytask.experiments.check import check, new_marks
    from manytask.experiments.reproduce import write_marks
    from manytask.provenance import code_state

    checked = check(ids, jobs, say)
    commit = code_state()["git_commit"] or "unknown"
    marks, fresh = new_marks(checked, commit)
    failed = [item.id for item in checked if item.fingerprint is None and not item.skipped]
    skipped = [item.id for item in checked if item.skipped]
    stale = sorted(key for key in marks if any(key.startswith(f"{item.id}/") for item in checked))
    say(f"{len(checked)} smoke experiments: {len(checked) - len(failed) - len(skipped)} ran, {len(failed)} failed, "
        f"{len(skipped)} skipped; "
        f"{len(stale)} stale table(s){': ' + ', '.join(stale) if stale else ''}")
    if mark:
        write_marks(marks)
        say("marks written to results/stale.json; run manytask reproduce render")
        return not failed
    if fresh:
        say(f"newly stale (not marked yet): {', '.join(fresh)}; measure them again, or mark them with --mark")
    return not failed and not fresh

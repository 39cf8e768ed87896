"""`manytask reproduce`: run one experiment at a scale, measure its table, write its result file with the smoke
fingerprint of this tree, and give the table with the paper beside us; and the marks of stale tables
(`results/stale.json`) that `check` keeps and the page shows."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from manytask.errors import ManytaskError
from manytask.experiments.catalogue import experiment_by_id
from manytask.experiments.results import (
    fingerprint,
    measure,
    provenance,
    result_path,
    results_dir,
    table_lines,
    write_result,
)
from manytask.experiments.runner import Log, Unit, Workers, records_by_seed, repository_root, runner, scale_config
from manytask.experiments.spec import PaperExperiment, Scale


def missing_needs(scale: Scale) -> list[str]:
    """The files or folders a scale needs that are not on this machine."""
    return [need for need in scale.needs if not Path(need).expanduser().exists()]


def refuse_unrunnable(experiment: PaperExperiment, scale: str) -> None:
    """One sentence where the experiment cannot run: methods the library lacks, files a paper scale needs."""
    if experiment.waiting_for:
        raise ManytaskError(f"'{experiment.id}' waits for methods the library does not have yet: "
                            f"{', '.join(experiment.waiting_for)}.")
    missing = missing_needs(experiment.scale(scale))
    if missing:
        raise ManytaskError(f"'{experiment.id}' at {scale} scale needs {', '.join(missing)}, which "
                            f"{'is' if len(missing) == 1 else 'are'} not on this machine.")


def run_scale(experiment: PaperExperiment, scale: str, seeds: tuple[int, ...] | None, out: Path,
              workers: Workers, probe: bool) -> tuple[list[Unit], dict[int, dict[str, Any]]]:
    """Run the experiment's members at `scale` into `out`; its units and finished runs by seed."""
    refuse_unrunnable(experiment, scale)
    chosen = experiment.scale(scale)
    config = scale_config(chosen, seeds)
    if scale == "paper":  # missing files or weights: one sentence before anything runs
        from manytask.launch import plan

        plan(config.per_seed()[0])
    todo = runner(experiment.runner)(experiment, chosen, config, out, workers, probe)
    return todo, {seed: dict(runs) for seed, runs in records_by_seed(todo).items()}


def smoke_fingerprint(experiment: PaperExperiment, workers: Workers) -> dict[str, Any]:
    """The fingerprint of the experiment's smoke run on this tree, run in a throwaway folder."""
    with tempfile.TemporaryDirectory(prefix="manytask-smoke-") as folder:
        _, runs = run_scale(experiment, "smoke", None, Path(folder), workers, probe=False)
        return fingerprint(runs)


def reproduce(experiment_id: str, scale: str = "cpu", seeds: tuple[int, ...] | None = None, jobs: int = 1,
              out: Path | None = None, log: Log = print) -> tuple[dict[str, Any], Path | None]:
    """Run one experiment; its result (and the file it was written to; none for `smoke`, whose result is the
    fingerprint itself and is not kept)."""
    experiment = experiment_by_id(experiment_id)
    target = out or repository_root() / "runs" / "reproduce" / experiment.id / scale
    began = time.perf_counter()
    with Workers(jobs, log) as workers:
        todo, runs = run_scale(experiment, scale, seeds, target, workers, probe=scale != "smoke")
        wall = time.perf_counter() - began
        cells = measure(experiment, runs)
        smoke = fingerprint(runs) if scale == "smoke" else smoke_fingerprint(experiment, workers)
    source = provenance(todo, wall)
    result = {"id": experiment.id, "scale": scale, "seeds": sorted(runs), "columns":
              [c.name for c in experiment.columns], "values": cells, "paper": experiment.paper_numbers,
              "fingerprint": smoke, "provenance": source}
    if scale == "smoke":
        return result, None
    path = write_result(experiment, scale, sorted(runs), cells, smoke, source)
    unmark(f"{experiment.id}/{scale}")
    return result, path


def describe(experiment: PaperExperiment, result: dict[str, Any]) -> str:
    """The printed result: the table, the paper beside us, and where the numbers came from."""
    source = result["provenance"]
    dirty = " (with uncommitted changes)" if source.get("dirty") else ""
    lines = [f"{experiment.id} ({result['scale']}, seeds {', '.join(map(str, result['seeds']))}): {experiment.title}",
             "", *table_lines(experiment, result), "",
             f"tree {str(source.get('tree'))[:7]}{dirty}, {source.get('machine')}, torch {source.get('torch')}, "
             f"{source.get('wall_seconds', 0):.0f} s; smoke fingerprint {result['fingerprint']['sha256']}"]
    return "\n".join(lines)


STALE_FILE = "stale.json"


def stale_marks() -> dict[str, dict[str, str]]:
    """`ID/SCALE` -> {since: the commit whose check first found its fingerprint moved, fingerprint: the one found}."""
    path = results_dir() / STALE_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def write_marks(marks: dict[str, dict[str, str]]) -> None:
    path = results_dir() / STALE_FILE
    if marks:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dict(sorted(marks.items())), indent=1) + "\n")
    elif path.is_file():
        path.unlink()


def unmark(key: str) -> None:
    marks = stale_marks()
    if marks.pop(key, None) is not None:
        write_marks(marks)


def measured_scales(experiment_id: str) -> list[str]:
    """The scales with a committed result file for the experiment, in order."""
    return [scale for scale in ("cpu", "paper") if result_path(experiment_id, scale).is_file()]

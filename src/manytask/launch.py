"""Run one config (one method, or several compared) into a run directory, fresh or resumed.

All validation and data building happens before the first file is written, so bad input leaves nothing behind.
A comparison writes one sub-directory per method plus a combined summary.json with normalized accuracies."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from manytask.config import RunConfig, to_yaml, validate
from manytask.config_sources import load_yaml
from manytask.engine.local import local_engine
from manytask.engine.loop import RoundFailed, RoundObserver
from manytask.errors import ManytaskError
from manytask.experiment import Experiment, make_benchmark
from manytask.extras import require
from manytask.input_limits import shown_path
from manytask.method_entry import method_label
from manytask.report import write_report
from manytask.rundir import RunDir
from manytask.summary import normalize
from manytask.trackers import tracking
from manytask.trackers.session import check_loggers

Summaries = dict[str, dict[str, Any]]


def plan(config: RunConfig) -> list[Experiment]:
    """Build every member experiment (validating all of them) without touching the disk: each method entry, once
    per seed when the config has `seeds` (seed by seed, so every method's first seed finishes early)."""
    if config.engine in FLOWER_ENGINES:
        require("flwr", f"engine {config.engine}")
    check_loggers(config.loggers)
    labels = [method_label(m) for m in config.methods]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise ManytaskError(f"method label '{duplicates[0]}' appears twice; give each entry a distinct 'label'.")
    experiments = []
    for seeded in config.per_seed():
        benchmark = make_benchmark(seeded)  # a benchmark's splits are drawn from the seed too
        experiments += [Experiment.build(seeded.for_method(m), benchmark) for m in seeded.methods]
    return experiments


SEED_MARK = "@seed"


def member_name(config: RunConfig, exp: Experiment) -> str:
    """A member's directory name inside a comparison and its key in the comparison's summary: its label, plus
    `@seed<k>` when the config runs several seeds."""
    return exp.label if config.seeds is None else f"{exp.label}{SEED_MARK}{exp.config.seed}"


def run_config(
    config: RunConfig, out: Path, observer: RoundObserver | None = None, stop_after: int | None = None
) -> Summaries | None:
    """Start a new run in `out`; returns the summaries by label, or None when stopped at `stop_after`."""
    experiments = plan(config)
    if config.is_comparison:
        root = RunDir(out)
        root.create()
        root.write_text(root.config, to_yaml(config))
    for exp in experiments:
        member_dir(config, out, exp).start(to_yaml(exp.config), exp.federation.to_json())
    return _tracked(config, experiments, out, observer, stop_after)


def resume(out: Path, observer: RoundObserver | None = None, stop_after: int | None = None) -> Summaries | None:
    """Continue a stopped run from its checkpoints; finished members are kept as they are."""
    root = RunDir(out)
    if not root.config.is_file():
        killed = root.path.is_dir() and not root.holds_more_than_temporaries()
        hint = (f"; it was stopped before its config was written: start it again with manytask run CONFIG --out "
                f"{shown_path(out)}" if killed else "")
        raise ManytaskError(f"'{shown_path(out)}' is not a manytask run directory (it has no config.yaml){hint}.")
    config = validate(load_yaml(root.config))
    experiments = plan(config)
    for exp in experiments:  # a comparison killed while it created its members' directories
        member = member_dir(config, out, exp)
        if not member.config.is_file():  # `start` clears a temporary left alone there; others wait for the loop
            member.start(to_yaml(exp.config), exp.federation.to_json())
        elif not member.federation.is_file():
            member.write_federation(exp.federation.to_json())
    return _tracked(config, experiments, out, observer, stop_after)


def stopped_runs(out: Path) -> list[Path]:
    """The run directories under `out` (itself, or a comparison's members) whose summary is that of a failed round."""
    try:
        candidates = [out, *sorted(p for p in out.iterdir() if p.is_dir())] if out.is_dir() else []
    except OSError:  # an --out that cannot be a directory (a name too long, say): nothing ran there
        return []
    return [p for p in candidates if RunDir(p).summary.is_file() and "stopped" in _load_summary(RunDir(p))]


def member_dir(config: RunConfig, out: Path, exp: Experiment) -> RunDir:
    return RunDir(out / member_name(config, exp)) if config.is_comparison else RunDir(out)


def _tracked(
    config: RunConfig, experiments: list[Experiment], out: Path, observer: RoundObserver | None,
    stop_after: int | None,
) -> Summaries | None:
    """`_execute` with the config's trackers (`loggers`) told of every round and, at the end, of the summaries and
    the report; a run that stops leaves its tracker runs to be continued by a resume."""
    members = [(member_name(config, exp), member_dir(config, out, exp).path, exp.config) for exp in experiments]
    trackers = tracking(config, out, members)
    if trackers is None:
        return _execute(config, experiments, out, observer, stop_after)
    try:
        summaries = _execute(config, experiments, out, trackers.observer(observer), stop_after)
    except BaseException:
        trackers.close(finished=False)
        raise
    trackers.finish(summaries, None if summaries is None else write_report(out))
    return summaries


def _execute(
    config: RunConfig, experiments: list[Experiment], out: Path, observer: RoundObserver | None,
    stop_after: int | None,
) -> Summaries | None:
    """Run every member not finished yet. A member whose round fails does not stop a comparison: its summary is that
    of its completed rounds (written by the loop), the others run, and the failures are raised together at the end."""
    summaries: Summaries = {}
    failures: list[str] = []
    for exp in experiments:
        name = member_name(config, exp)
        run_dir = member_dir(config, out, exp)
        shown = None if observer is None or name == exp.label else NamedObserver(name, observer)
        try:
            summary = _load_summary(run_dir) if run_dir.is_finished() else engine_for(exp, run_dir, shown or observer)(
                stop_after)
        except RoundFailed as failure:
            if not config.is_comparison:
                raise
            failures.append(f"{name}: {failure}")
            summary = _load_summary(run_dir)
        if summary is None:
            return None
        summaries[name] = summary
    if config.is_comparison:
        _write_comparison(config, experiments, summaries, out)
    if failures:
        raise RoundFailed(" ".join(failures))
    return summaries


class NamedObserver:
    """Passes a member's progress on under its name in the comparison (`fedavg@seed1`), not its method label."""

    def __init__(self, name: str, inner: RoundObserver) -> None:
        self.name, self.inner = name, inner

    def started(self, label: str, total_rounds: int, done_rounds: int) -> None:
        self.inner.started(self.name, total_rounds, done_rounds)

    def finished_round(self, row: dict[str, Any]) -> None:
        self.inner.finished_round(row)


FLOWER_ENGINES = ("flower-sim", "flower")


def engine_for(exp: Experiment, run_dir: RunDir, observer: RoundObserver | None) -> Callable[[int | None], Any]:
    """The `run(stop_after)` of the engine the config names (Flower is imported only when asked for)."""
    if exp.config.engine == "flower-sim":
        from manytask.engine.flower.simulation import run_flower_simulation

        return lambda stop_after: run_flower_simulation(exp, run_dir, observer, stop_after)
    if exp.config.engine == "flower":
        from manytask.engine.flower.deployment import run_on_superlink

        return lambda stop_after: run_on_superlink(exp, run_dir, observer, stop_after)
    if exp.config.workers > 1:
        from manytask.engine.pool import run_with_workers

        return lambda stop_after: run_with_workers(exp, run_dir, observer, stop_after)
    return local_engine(exp, run_dir, observer).run


def _load_summary(run_dir: RunDir) -> dict[str, Any]:
    return json.loads(run_dir.summary.read_text())


def _write_comparison(config: RunConfig, experiments: list[Experiment], summaries: Summaries, out: Path) -> None:
    """Normalize every member by the reference run of its seed, and write the comparison's summary.json."""
    labels = [exp.label for exp in experiments]
    reference = config.reference if config.reference in labels else None
    if reference is not None:
        references = {exp.config.seed: summaries[member_name(config, exp)] for exp in experiments
                      if exp.label == reference}
        for exp in experiments:
            name = member_name(config, exp)
            normalize(summaries[name], references[exp.config.seed], reference)
            member = member_dir(config, out, exp)
            member.write_json(member.summary, summaries[name])
    root = RunDir(out)
    root.write_json(root.summary, {"runs": summaries, "reference": reference, "order": list(summaries),
                                   "seeds": config.seeds})

"""Run one config (one method, or several compared) into a run directory, fresh or resumed.

All validation and data building happens before the first file is written, so bad input leaves nothing behind.
A comparison writes one sub-directory per method plus a combined summary.json with normalized accuracies."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from manytask.benchmarks import Benchmark
from manytask.config import RunConfig, to_yaml, validate
from manytask.config_sources import apply_overrides, load_yaml
from manytask.devices import resolve_device
from manytask.engine.checkpoint import PLACEMENT_FIELDS
from manytask.engine.local import local_engine
from manytask.engine.loop import RoundFailed, RoundObserver
from manytask.engine.warmup import warm_up
from manytask.errors import ManytaskError, clipped
from manytask.experiment import Experiment, make_benchmark
from manytask.extras import require
from manytask.input_limits import shown_path
from manytask.method_entry import method_label, swept_label
from manytask.report import write_report
from manytask.rundir import RunDir
from manytask.summary import normalize
from manytask.trackers import tracking
from manytask.trackers.session import check_loggers

Summaries = dict[str, dict[str, Any]]


def plan(config: RunConfig) -> list[Experiment]:
    """Build every member experiment (validating all of them) without touching the disk: each method entry, once
    per point of the sweep, once per seed when the config has `seeds` (seed by seed, so every method's first seed
    finishes early)."""
    if config.engine in FLOWER_ENGINES:
        require("flwr", f"engine {config.engine}")
    else:
        resolve_device(config.device)  # a GPU that is not there: one sentence before any file, not after
    check_loggers(config.loggers)
    members = [(point, entry) for seeded in config.per_seed() for point in seeded.points() for entry in point.methods]
    labels = [(method_label(entry), point.seed) for point, entry in members]
    duplicates = sorted({label for label, seed in labels if labels.count((label, seed)) > 1})
    if duplicates:
        raise ManytaskError(f"method label '{duplicates[0]}' appears twice; give each entry a distinct 'label'.")
    benchmarks: dict[str, Benchmark] = {}
    experiments = [Experiment.build(point.for_method(entry), _benchmark(point, benchmarks)) for point, entry in members]
    _check_programs(experiments)
    return experiments


def _check_programs(experiments: list[Experiment]) -> None:
    """Build each member's server program once (a member's seeds share its settings): a method's own checks (a
    model without the layers it needs, phases that do not fit the rounds) refuse before any file is written."""
    checked: set[tuple[str, str]] = set()
    for exp in experiments:
        if (exp.label, exp.config.point) not in checked:
            checked.add((exp.label, exp.config.point))
            exp.server_program()


def _benchmark(config: RunConfig, built: dict[str, Benchmark]) -> Benchmark:
    """The config's benchmark, built once for every member naming the same one with the same seed (a benchmark's
    splits are drawn from the seed too; a sweep may vary the benchmark's own keys)."""
    key = json.dumps([config.benchmark, config.seed], sort_keys=True)
    if key not in built:
        built[key] = make_benchmark(config)
    return built[key]


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
        member_dir(config, out, exp).start(to_yaml(exp.config), exp.federation_record())
    return _tracked(config, experiments, out, observer, stop_after)


def resume(out: Path, observer: RoundObserver | None = None, stop_after: int | None = None,
           placement: list[str] | tuple[str, ...] = ()) -> Summaries | None:
    """Continue a stopped run from its checkpoints; finished members are kept as they are. `placement` overrides
    (`device=cpu`, `workers=2`) move it elsewhere: they change where clients train, not the numbers."""
    root = RunDir(out)
    if not root.config.is_file():
        killed = root.path.is_dir() and not root.holds_more_than_temporaries()
        hint = (f"; it was stopped before its config was written: start it again with manytask run CONFIG --out "
                f"{shown_path(out)}" if killed else "")
        raise ManytaskError(f"'{shown_path(out)}' is not a manytask run directory (it has no config.yaml){hint}.")
    config = validate(apply_overrides(load_yaml(root.config), _placement_only(placement)))
    experiments = plan(config)
    if placement:  # the next --resume goes on where this one runs
        root.write_text(root.config, to_yaml(config))
    for exp in experiments:  # a comparison killed while it created its members' directories
        member = member_dir(config, out, exp)
        if not member.config.is_file():  # `start` clears a temporary left alone there; others wait for the loop
            member.start(to_yaml(exp.config), exp.federation_record())
        elif not member.federation.is_file():
            member.write_federation(exp.federation_record())
    return _tracked(config, experiments, out, observer, stop_after)


def _placement_only(overrides: list[str] | tuple[str, ...]) -> list[str]:
    """The overrides a resumed run takes: placement keys alone (any other key would make it another run)."""
    other = [item for item in overrides if item.partition("=")[0].split(".")[0] not in PLACEMENT_FIELDS]
    if other:
        raise ManytaskError(f"--resume takes only keys that say where clients train ({', '.join(PLACEMENT_FIELDS)}), "
                            f"not '{clipped(other[0])}': the run's config.yaml is reused as it is.")
    return list(overrides)


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
    pending = [exp for exp in experiments if not member_dir(config, out, exp).is_finished()]
    warmup = warm_up(pending[0]) if _warms_up(config, pending) else None
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
        _write_comparison(config, experiments, summaries, out, warmup)
    if failures:
        raise RoundFailed(" ".join(failures))
    return summaries


def _warms_up(config: RunConfig, pending: list[Experiment]) -> bool:
    """A comparison of several members still to run in this process warms it up first, so that no member's costs
    carry the process's first-use costs (`engine/warmup.py`); Flower's engines and worker processes start anew for
    every member."""
    return len(pending) > 1 and config.engine == "local" and config.workers == 1


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


def _is_reference(config: RunConfig, exp: Experiment) -> bool:
    """Whether `exp` is the config's `reference` run (at its sweep point: `centralized lr=0.01`)."""
    return config.reference is not None and exp.label == swept_label(config.reference, exp.config.point)


def _load_summary(run_dir: RunDir) -> dict[str, Any]:
    return json.loads(run_dir.summary.read_text())


def _write_comparison(config: RunConfig, experiments: list[Experiment], summaries: Summaries, out: Path,
                      warmup: float | None = None) -> None:
    """Normalize every member by the reference run of its seed and sweep point, and write the comparison's
    summary.json (with the seconds this process spent warming up, in no member's costs)."""
    references = {(exp.config.seed, exp.config.point): exp for exp in experiments if _is_reference(config, exp)}
    for exp in experiments:
        found = references.get((exp.config.seed, exp.config.point))
        if found is not None:
            name = member_name(config, exp)
            normalize(summaries[name], summaries[member_name(config, found)], found.label)
            member = member_dir(config, out, exp)
            member.write_json(member.summary, summaries[name])
    reference = config.reference if references else None
    root = RunDir(out)
    root.write_json(root.summary, {"runs": summaries, "reference": reference, "order": list(summaries),
                                   "seeds": config.seeds, "warmup_seconds": warmup})

"""Running an experiment at a scale: its members once per seed, each a single run in `OUT/seed<s>/<label>`, `jobs`
at a time in worker processes of one torch thread each (so a number does not depend on `--jobs`). A finished run is
kept and a stopped one resumed, so running again only does what is missing. Before a long run a one-round probe of
each member gives an estimate of the time."""

from __future__ import annotations

import contextlib
import io
import math
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import yaml

from manytask.config import RunConfig, resolve, to_yaml
from manytask.errors import ManytaskError
from manytask.experiments.spec import PaperExperiment, Scale
from manytask.method_entry import method_label

Log = Callable[[str], None]


@dataclass(frozen=True)
class Unit:
    """One single run of an experiment: a member on a seed, its config as YAML text, and where it goes."""

    seed: int
    label: str
    config: str
    out: Path


def repository_root() -> Path:
    """The folder whose `configs/` the registry's paths are relative to: the current one where it has `configs/`,
    else the repository the package runs from."""
    here = Path.cwd()
    if (here / "configs").is_dir():
        return here
    from manytask.provenance import PACKAGE_DIR

    return PACKAGE_DIR.parents[1]


def scale_config(scale: Scale, seeds: tuple[int, ...] | None = None) -> RunConfig:
    """The scale's config with its overrides, on `seeds` (default: the scale's)."""
    path = repository_root() / scale.config
    if not path.is_file():
        raise ManytaskError(f"config '{scale.config}' is not in {repository_root()}; run from the repository's root.")
    chosen = seeds if seeds is not None else scale.seeds
    return resolve(str(path), [*scale.overrides, f"seeds=[{','.join(str(s) for s in chosen)}]"])


def units(config: RunConfig, out: Path, members: tuple[str, ...] = ()) -> list[Unit]:
    """Every member on every seed of `config` (only the labels in `members` when given), seed by seed."""
    found = [
        Unit(seeded.seed, method_label(entry), to_yaml(point.for_method(entry).model_copy(update={"seeds": None})),
             out / f"seed{seeded.seed}" / method_label(entry))
        for seeded in config.per_seed() for point in seeded.points() for entry in point.methods
    ]
    labels = {unit.label for unit in found}
    missing = [label for label in members if label not in labels]
    if missing:
        raise ManytaskError(f"the config has no member '{missing[0]}'; its members: {', '.join(sorted(labels))}.")
    return [unit for unit in found if not members or unit.label in members]


def _run_unit(unit: Unit) -> tuple[Unit, float, str]:
    """One single run in a worker (resumed where it was interrupted, kept where it ended); its seconds, and the
    reason where a round failed (a diverged member): such a run ends there, its summary says so, and its row
    of the table says where it stopped."""
    from manytask.config import validate
    from manytask.engine.loop import RoundFailed
    from manytask.launch import resume, run_config

    began = time.perf_counter()
    failed = ""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            if (unit.out / "config.yaml").is_file():
                resume(unit.out)
            else:
                run_config(validate(yaml.safe_load(unit.config)), unit.out)
    except RoundFailed as err:
        failed = str(err)
    return unit, time.perf_counter() - began, failed


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


class Workers:
    """Worker processes (spawned, one torch thread each) that run units `jobs` at a time; one pool serves every
    experiment of a `check`, from several threads at once."""

    def __init__(self, jobs: int, log: Log) -> None:
        self.jobs, self.log = max(1, jobs), log
        self.pool = ProcessPoolExecutor(self.jobs, mp_context=get_context("spawn"), initializer=_one_thread)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *_: object) -> None:
        self.pool.shutdown(cancel_futures=True)

    def run(self, todo: list[Unit]) -> None:
        """Run the units of `todo` not finished yet; one line of progress per finished run."""
        left = pending(todo)
        began = time.perf_counter()
        futures = [self.pool.submit(_run_unit, unit) for unit in left]
        for done, future in enumerate(as_completed(futures), 1):
            unit, seconds, failed = future.result()
            self.log(f"[{done}/{len(left)}] seed {unit.seed} {unit.label}: {seconds:.0f} s "
                     f"({time.perf_counter() - began:.0f} s in all){'; stopped: ' + failed if failed else ''}")


def probe_seconds(unit: Unit) -> float:
    """The estimated seconds of one run from a probe: building it plus one round on the local engine, the round's
    seconds counted once per round the run has."""
    import torch

    from manytask.config import validate
    from manytask.engine.warmup import warm_up
    from manytask.experiment import Experiment

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        began = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            experiment = Experiment.build(validate(yaml.safe_load(unit.config)))
        built = time.perf_counter() - began
        round_seconds = warm_up(experiment)
        return built + round_seconds * experiment.total_rounds
    finally:
        torch.set_num_threads(threads)


def estimate(todo: list[Unit], jobs: int) -> float:
    """Seconds `todo` will take `jobs` at a time, from one probe per member (its first seed's run)."""
    by_label: dict[str, float] = {}
    for unit in todo:
        if unit.label not in by_label:
            by_label[unit.label] = probe_seconds(unit)
    total = sum(by_label[unit.label] for unit in todo)
    return total / max(1, min(jobs, len(todo)))


def same_config(first: str, second: str) -> bool:
    """Whether two single-run configs (YAML texts) are the same run: their validated configs' hashes agree."""
    from manytask.config import validate
    from manytask.engine.checkpoint import config_hash

    return config_hash(validate(yaml.safe_load(first))) == config_hash(validate(yaml.safe_load(second)))


def pending(todo: list[Unit]) -> list[Unit]:
    """The units without a summary yet (a run stopped by a failed round has one: it fails the same way again). A
    kept run directory must hold the unit's own config: one made with other settings (an edited config or
    override) is refused in one sentence rather than measured as this one."""
    for unit in todo:
        kept = unit.out / "config.yaml"
        if kept.is_file() and not same_config(kept.read_text(), unit.config):
            raise ManytaskError(f"'{unit.out}' holds a run of other settings than this experiment's {unit.label} on "
                                f"seed {unit.seed} now has; remove it (or give another --out) to run it again.")
    return [unit for unit in todo if not (unit.out / "summary.json").is_file()]


def members_runner(experiment: PaperExperiment, scale: Scale, config: RunConfig, out: Path, workers: Workers,
                   probe: bool) -> list[Unit]:
    """The plain runner: every member of the scale's config, once per seed."""
    todo = units(config, out, scale.members)
    run_with_estimate(todo, workers, probe)
    return todo


def run_with_estimate(todo: list[Unit], workers: Workers, probe: bool) -> None:
    """Run `todo` on `workers`, first printing an estimate of the time from a probe where `probe`."""
    left = pending(todo)
    if probe and left:
        seconds = estimate(left, workers.jobs)
        workers.log(f"{len(left)} runs to go, {workers.jobs} at a time: about {_duration(seconds)} (from a one-round "
                    f"probe of each member)")
    workers.run(left)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{math.ceil(seconds)} s"
    if seconds < 5400:
        return f"{math.ceil(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


Runner = Callable[[PaperExperiment, Scale, RunConfig, Path, Workers, bool], list[Unit]]
RUNNERS: dict[str, Runner] = {"members": members_runner}


def runner(name: str) -> Runner:
    if name not in RUNNERS:
        raise ManytaskError(f"no experiment runner '{name}'; runners: {', '.join(sorted(RUNNERS))}.")
    return RUNNERS[name]


def stderr_log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def records_by_seed(todo: list[Unit]) -> Mapping[int, Mapping[str, Any]]:
    """The finished runs of `todo`: seed -> label -> RunRecord, in the units' order."""
    from manytask.report.runs import load_run

    found: dict[int, dict[str, Any]] = {}
    for unit in todo:
        found.setdefault(unit.seed, {})[unit.label] = load_run(unit.out)
    return found

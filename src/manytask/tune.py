"""`manytask tune CONFIG --trials N`: an Optuna study per member of a config, the same number of trials each, over
the search spaces its method (and plug-in) declares, scored on a validation split carved from every task's training
data. The test set is never read. With `tune.repeats: r` a trial is scored over r seeds, each with its own
validation split (repeated hold-out), so one lucky split does not pick the values: by their mean, or with
`tune.score: worst` by the worst of them, so values that collapse a task on one seed lose.

The studies live in one SQLite file in the tuning directory (`study.db`, one study per member label), so a tuning
killed at any point goes on where it stopped and the file opens with Optuna's own tools (`optuna-dashboard`,
`optuna.load_study`). A trial's suggestions depend only on the seed, the member and the trials finished before it
(each trial gets a TPE sampler seeded by their count), so a resumed study draws what an uninterrupted one draws: a
trial cut off by a crash is marked failed and drawn again. Failed trials do not count against the budget; pruned
ones do.

The result is `tuned.yaml`: the config with every member's best values, its `seeds`, and a `tuned` record of the
budget, the spaces and the best values, which the report of `manytask run tuned.yaml` shows."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from manytask.benchmarks.base import Benchmark
from manytask.config import RunConfig, TuneConfig, to_yaml, validate
from manytask.engine.loop import RoundFailed, RoundObserver
from manytask.errors import ManytaskError
from manytask.experiment import Experiment, make_benchmark
from manytask.extras import require
from manytask.method_entry import method_label, split_method, split_plugin
from manytask.methods.registry import METHODS, PLUGINS
from manytask.rundir import RunDir
from manytask.search_space import TRAIN_PREFIX, Dimension, Space, parse_dimension, train_space
from manytask.seeding import derive_seed, torch_generator

if TYPE_CHECKING:
    import optuna

STUDY = "study.db"
TUNED = "tuned.yaml"
RESULT = "tuning.json"
PLUGIN_PREFIX = "plugin."
TRIALS = "trials"

Progress = Callable[[str], None]


def member_space(config: RunConfig, entry: dict[str, Any]) -> Space:
    """The dimensions tuned for one member: the local learning rate around its own, its method's and its plug-in's
    declared spaces (the plug-in's prefixed `plugin.`), then the config's `tune.space.<label>` (null drops one)."""
    name, _ = split_method(entry)
    own_lr = config.for_method(entry).train.lr
    space: Space = {**train_space(own_lr), **getattr(METHODS.get(name).params, "SEARCH_SPACE", {})}
    plugin = split_plugin(entry)
    if plugin is not None:
        declared = getattr(PLUGINS.get(plugin[0]).params, "SEARCH_SPACE", {})
        space.update({f"{PLUGIN_PREFIX}{key}": dim for key, dim in declared.items()})
    label = method_label(entry)
    for key, raw in (config.tune or TuneConfig()).space.get(label, {}).items():
        if raw is None:
            space.pop(key, None)
        else:
            space[key] = parse_dimension(raw, f"{label}.{key}")
    return space


def with_values(entry: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """The method entry with tuned values: `train.x` into its train overrides, `plugin.x` into its plug-in, the rest
    as the method's own parameters."""
    tuned = copy.deepcopy(entry)
    for key, value in values.items():
        if key.startswith(TRAIN_PREFIX):
            tuned.setdefault("train", {})[key.removeprefix(TRAIN_PREFIX)] = value
        elif key.startswith(PLUGIN_PREFIX):
            plugin = tuned["plugin"]
            tuned["plugin"] = {**({"name": plugin} if isinstance(plugin, str) else plugin),
                               key.removeprefix(PLUGIN_PREFIX): value}
        else:
            tuned[key] = value
    return tuned


def validation_benchmark(benchmark: Benchmark, fraction: float, seed: int) -> Benchmark:
    """The benchmark with every task's test set replaced by a random `fraction` of its training set, held out of
    training: trials are scored on the clients' own kind of data and never on the test set."""
    tasks = {}
    for name, task in benchmark.tasks.items():
        count = len(task.y_train)
        held = max(1, round(fraction * count))
        if held >= count:
            raise ManytaskError(f"task '{name}' has {count} training samples: too few to hold out a validation share "
                                f"of {fraction:g}.")
        order = torch.randperm(count, generator=torch_generator(seed, "validation", name))
        keep, check = order[held:].sort().values, order[:held].sort().values
        tasks[name] = dataclasses.replace(task, x_train=task.x_train[keep], y_train=task.y_train[keep],
                                          x_test=task.x_train[check], y_test=task.y_train[check])
    return dataclasses.replace(benchmark, tasks=tasks)


def _direction(benchmark: Benchmark) -> str:
    """Maximize the average accuracy; minimize the average error where every task is a regression."""
    kinds = {task.spec.kind.value for task in benchmark.tasks.values()}
    if kinds == {"classification"}:
        return "maximize"
    if kinds == {"regression"}:
        return "minimize"
    raise ManytaskError(f"manytask tune scores the average main metric, which task kinds {sorted(kinds)} do not "
                        "share; tune classification or regression task sets.")


class PruningObserver:
    """Reports each evaluated round's validation average to the trial and prunes it when Optuna's pruner says so;
    passes every round on to `inner` (a test's crash hook, say)."""

    def __init__(self, trial: optuna.Trial, inner: RoundObserver | None) -> None:
        self.trial, self.inner = trial, inner

    def started(self, label: str, total_rounds: int, done_rounds: int) -> None:
        if self.inner is not None:
            self.inner.started(label, total_rounds, done_rounds)

    def finished_round(self, row: dict[str, Any]) -> None:
        import optuna

        if self.inner is not None:
            self.inner.finished_round(row)
        if row.get("average") is not None:
            self.trial.report(float(row["average"]), int(row["round"]))
            if self.trial.should_prune():
                raise optuna.TrialPruned(f"validation average {row['average']:.4f} at round {row['round']}")


def _suggest(trial: optuna.Trial, key: str, dim: Dimension) -> Any:
    if dim.choices is not None:
        return trial.suggest_categorical(key, list(dim.choices))
    if dim.integer:
        return trial.suggest_int(key, int(dim.low), int(dim.high), log=dim.log)  # type: ignore[arg-type]
    return trial.suggest_float(key, float(dim.low), float(dim.high), log=dim.log)  # type: ignore[arg-type]


def _finished(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    from optuna.trial import TrialState

    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))


def _fail_interrupted(study: optuna.Study) -> int:
    """Mark trials left running by a killed process as failed (they are drawn again); how many there were."""
    from optuna.trial import TrialState

    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for trial in stale:
        study.tell(trial.number, state=TrialState.FAIL)
    return len(stale)


def repeat_score(scores: list[float], how: str, direction: str) -> float:
    """A trial's score over its repeats: the mean, or the worst (the lowest when higher is better, else the
    highest)."""
    if how == "mean":
        return sum(scores) / len(scores)
    return min(scores) if direction == "maximize" else max(scores)


class Tuner:
    """Runs the studies of a config's members in `out`, one trial at a time."""

    def __init__(self, config: RunConfig, out: Path, observer: RoundObserver | None = None,
                 progress: Progress = print) -> None:
        self.config, self.out, self.observer, self.say = config, Path(out), observer, progress
        self.settings = config.tune or TuneConfig()
        # one validation split per repeat (seed, seed + 1, ...): repeated hold-out, built once for every trial
        self.benchmarks = [self._validation(config.seed + repeat) for repeat in range(self.settings.repeats)]
        self.direction = _direction(self.benchmarks[0])

    def _validation(self, seed: int) -> Benchmark:
        benchmark = make_benchmark(self.config.model_copy(update={"seed": seed}))
        return validation_benchmark(benchmark, self.settings.validation, seed)

    def run(self) -> Path:
        """Tune every member to the budget (resuming studies found in `out`); write and return tuned.yaml."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = f"sqlite:///{(self.out / STUDY).resolve()}"
        members = {}
        for entry in self.config.methods:
            label = method_label(entry)
            space = member_space(self.config, entry)
            study = optuna.create_study(storage=storage, study_name=label, direction=self.direction,
                                        load_if_exists=True, pruner=self._pruner())
            if (stale := _fail_interrupted(study)):
                self.say(f"{label}: {stale} trial(s) cut off by an interruption are drawn again.")
            while len(_finished(study)) < self.settings.trials:
                study.sampler = optuna.samplers.TPESampler(
                    seed=derive_seed(self.config.seed, "tune", label, len(_finished(study))) % 2**32,
                    n_startup_trials=self.settings.startup_trials)
                study.optimize(lambda trial, e=entry, s=space: self._objective(trial, e, s), n_trials=1)
                self._report_trial(label, study)
            members[label] = self._member_record(study, space)
        return self._write(members)

    def _pruner(self) -> optuna.pruners.BasePruner:
        import optuna

        if not self.settings.pruning:
            return optuna.pruners.NopPruner()
        return optuna.pruners.MedianPruner(n_startup_trials=self.settings.startup_trials,
                                           n_warmup_steps=max(1, self.config.rounds // 4))

    def _objective(self, trial: optuna.Trial, entry: dict[str, Any], space: Space) -> float:
        import optuna

        from manytask.launch import engine_for

        values = {key: _suggest(trial, key, dim) for key, dim in space.items()}
        member = self.config.model_copy(update={"seeds": None}).for_method(with_values(entry, values))
        scores = []
        for repeat in range(self.settings.repeats):  # pruning watches the first repeat's curve
            seeded = member.model_copy(update={"seed": member.seed + repeat})
            experiment = Experiment.build(validate(seeded.model_dump(mode="json")), self.benchmarks[repeat])
            run_dir = RunDir(self.out / TRIALS / f"{method_label(entry)}-{trial.number:04d}-{repeat}")
            shutil.rmtree(run_dir.path, ignore_errors=True)
            run_dir.start(to_yaml(experiment.config), experiment.federation_record())
            watcher = PruningObserver(trial, self.observer) if repeat == 0 else self.observer
            try:
                scores.append(float(engine_for(experiment, run_dir, watcher)(None)["average"]))
            except RoundFailed as failure:  # diverged: it used its share of the budget and scores nothing
                raise optuna.TrialPruned(f"a round failed: {failure}") from None
            finally:
                shutil.rmtree(run_dir.path, ignore_errors=True)  # checkpoints of every trial would fill the disk
        return repeat_score(scores, self.settings.score, self.direction)

    def _report_trial(self, label: str, study: optuna.Study) -> None:
        from optuna.trial import TrialState

        trial = study.trials[-1]
        values = ", ".join(f"{k}={_shown(v)}" for k, v in trial.params.items())
        score = f"{trial.value:.4f}" if trial.state == TrialState.COMPLETE else trial.state.name.lower()
        best = "" if not _any_complete(study) else f" (best {study.best_value:.4f})"
        self.say(f"{label}: trial {len(_finished(study))}/{self.settings.trials} {values} → {score}{best}")

    def _member_record(self, study: optuna.Study, space: Space) -> dict[str, Any]:
        from optuna.trial import TrialState

        states = [t.state for t in study.trials]
        if not _any_complete(study):
            raise ManytaskError(f"every trial of '{study.study_name}' was pruned or failed; widen its search space "
                                "or turn pruning off (tune.pruning=false).")
        best = study.best_trial
        return {"space": {k: d.describe() for k, d in space.items()}, "best": best.params,
                "best_trial": best.number, "validation_score": best.value,
                "trials": {"complete": states.count(TrialState.COMPLETE), "pruned": states.count(TrialState.PRUNED),
                           "failed": states.count(TrialState.FAIL)}}

    def _write(self, members: dict[str, dict[str, Any]]) -> Path:
        tuned_entries = [with_values(entry, members[method_label(entry)]["best"]) for entry in self.config.methods]
        record = {"trials": self.settings.trials, "repeats": self.settings.repeats, "score": self.settings.score,
                  "validation": self.settings.validation,
                  "direction": self.direction, "study": STUDY, "members": members}
        data = self.config.model_dump(mode="json", exclude_none=True)
        data.pop("plugins", None)  # the tuned entries carry their plug-ins
        data.update({"method": tuned_entries, "tuned": record})
        tuned = validate(data)
        (self.out / RESULT).write_text(json.dumps(record, indent=2))
        with contextlib.suppress(OSError):
            (self.out / TRIALS).rmdir()  # emptied trial by trial
        path = self.out / TUNED
        path.write_text(to_yaml(tuned))
        return path


def _any_complete(study: optuna.Study) -> bool:
    from optuna.trial import TrialState

    return any(t.state == TrialState.COMPLETE for t in study.trials)


def _shown(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def tune(config: RunConfig, out: Path, observer: RoundObserver | None = None, progress: Progress = print) -> Path:
    """Tune `config`'s members into the directory `out` (created, or resumed when it holds this config's study)."""
    require("optuna", "manytask tune")  # before anything is written
    out = Path(out)
    saved = out / "config.yaml"
    if saved.is_file():
        if saved.read_text() != to_yaml(config):
            raise ManytaskError(f"'{out}' holds the tuning of another config; give a new --out, or resume it with "
                                f"manytask tune --resume {out}.")
    else:
        RunDir(out).create()
        RunDir(out).write_text(saved, to_yaml(config))
    return Tuner(config, out, observer, progress).run()

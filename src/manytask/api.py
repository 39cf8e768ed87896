"""The Python API: what the CLI does, from a notebook or a script.

    import manytask
    result = manytask.run("configs/fedprox_synthetic.yaml", rounds=5, train={"lr": 0.1})
    result.summaries["fedprox"]["average_accuracy"]; result.metrics("fedprox")[-1]
    again = manytask.load(result.path)                         # a finished run, from its directory
    rows = manytask.compare(result.path, "runs/other")  # the comparison table's numbers, a dict per run
    frame = manytask.api.compare_frame(result.path)    # the same as a pandas DataFrame

A config is a YAML path, a mapping, or a validated `RunConfig`; top-level keyword values are merged into it
(mappings key by key, anything else replaced) and `overrides` takes the CLI's `a.b=value` strings."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manytask.config import RunConfig, resolve, validate
from manytask.config_sources import apply_overrides, default_config, load_yaml
from manytask.engine.loop import RoundObserver
from manytask.errors import ManytaskError
from manytask.report import load_runs, write_report
from manytask.report.runs import METRICS, read_summary
from manytask.report.tables import comparison_values
from manytask.rundir import RunDir

if TYPE_CHECKING:
    import pandas


@dataclass(frozen=True)
class RunResult:
    """A finished run: its directory, config, each member's summary by name (one entry for a single method),
    and the report written into the directory."""

    path: Path
    config: RunConfig
    summaries: dict[str, dict[str, Any]]
    report: Path
    members: dict[str, Path] = field(default_factory=dict)  # member name -> its run directory

    def metrics(self, member: str | None = None) -> list[dict[str, Any]]:
        """The member's metrics.jsonl rows, one per round (`member` may be left out for a single-method run)."""
        if member is None:
            if len(self.members) != 1:
                raise ManytaskError(f"this run has {len(self.members)} members ({', '.join(self.members)}); name one.")
            (member,) = self.members
        if member not in self.members:
            raise ManytaskError(f"no member '{member}' in {self.path}; members: {', '.join(self.members)}.")
        lines = (self.members[member] / METRICS).read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]


def run(config: str | Path | Mapping[str, Any] | RunConfig | None = None, out: str | Path | None = None, *,
        overrides: list[str] | tuple[str, ...] = (), observer: RoundObserver | None = None,
        **values: Any) -> RunResult:
    """Run a config (the built-in default job when None) into `out` (default `runs/NAME-TIME`) and write its report."""
    from manytask.launch import run_config

    resolved = _resolve(config, list(overrides), values)
    target = Path(out) if out is not None else Path("runs") / f"{resolved.name}-{datetime.now():%Y%m%d-%H%M%S}"
    run_config(resolved, target, observer)
    return load(target)


def resume(run_dir: str | Path, observer: RoundObserver | None = None) -> RunResult:
    """Continue a stopped run from its checkpoints (its config.yaml as it is) and write its report."""
    from manytask.launch import resume as resume_run

    resume_run(Path(run_dir), observer)
    return load(run_dir)


def load(run_dir: str | Path) -> RunResult:
    """A finished run from its directory (single or comparison); writes its report if it has none."""
    root = RunDir(Path(run_dir))
    if not root.config.is_file():
        raise ManytaskError(f"'{run_dir}' is not a manytask run directory (it has no config.yaml).")
    config = validate(load_yaml(root.config))  # imports the config's `imports`, as a resume would
    if not root.summary.is_file():
        raise ManytaskError(f"'{run_dir}' has not finished (no summary.json); continue it with manytask.resume.")
    summary = read_summary(root.path)
    if "stopped" in summary:
        raise ManytaskError(f"'{run_dir}' stopped at a failed round; continue it with manytask.resume.")
    if "runs" in summary:
        summaries = summary["runs"]
        members = {name: root.path / name for name in summaries}
    else:
        name = str(summary.get("label") or summary.get("method"))
        summaries, members = {name: summary}, {name: root.path}
    report = root.path / "report.md"
    if not report.is_file():
        report = write_report(root.path)
    return RunResult(root.path, config, summaries, report, members)


def compare(*run_dirs: str | Path | RunResult) -> list[dict[str, Any]]:
    """The comparison table of finished runs (comparison directories expand into their members), every column of
    `manytask compare` as numbers: one mapping per run from column header to value (`run`: its label; accuracies as
    fractions, bytes, seconds, joules; None where missing)."""
    if not run_dirs:
        raise ManytaskError("compare needs at least one run directory.")
    paths = [r.path if isinstance(r, RunResult) else Path(r) for r in run_dirs]
    return comparison_values(load_runs(paths))


def compare_frame(*run_dirs: str | Path | RunResult) -> pandas.DataFrame:
    """`compare`'s rows as a pandas DataFrame, one row per run (needs pandas)."""
    try:
        import pandas
    except ModuleNotFoundError:
        raise ManytaskError("compare_frame needs pandas, which is not installed: pip install pandas.") from None
    return pandas.DataFrame(compare(*run_dirs))


def _resolve(config: str | Path | Mapping[str, Any] | RunConfig | None, overrides: list[str],
             values: dict[str, Any]) -> RunConfig:
    if isinstance(config, (str, Path)) and not values:
        return resolve(str(config), overrides)
    if isinstance(config, RunConfig):
        data = config.model_dump(mode="json")
    elif isinstance(config, Mapping):
        data = dict(config)
    elif config is None:
        data = default_config(overrides)
    elif isinstance(config, (str, Path)):
        data = resolve(str(config), []).model_dump(mode="json")  # its imports anchored at the file
    else:
        raise ManytaskError(f"a config is a YAML path, a mapping or a RunConfig, not {type(config).__name__}.")
    return validate(apply_overrides(_merged(data, values), overrides))


def _merged(data: dict[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """`data` with `values` merged in: a mapping into a mapping key by key (recursively), anything else replaced."""
    merged = dict(data)
    for key, value in values.items():
        current = merged.get(key)
        if isinstance(value, Mapping) and isinstance(current, Mapping):
            merged[key] = _merged(dict(current), value)
        else:
            merged[key] = value
    return merged

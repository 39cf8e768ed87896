"""What an experiment of the papers is, as data: its id, what it shows, the paper's numbers, the columns of its
table and the scales it runs at (`smoke`, `cpu`, `paper`).

A column measures one number (or a short text) per member and seed from the finished runs of that seed; the
paper's figure for a member sits beside ours in the printed and rendered tables."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from manytask.report.runs import RunRecord

Value = float | str | None
SCALES = ("smoke", "cpu", "paper")
TWO_ROUNDS = ("rounds=2", "eval_every=2")  # the cut every smoke scale starts from
ScaleName = Literal["smoke", "cpu", "paper"]
Measure = Callable[["RunRecord", Mapping[str, "RunRecord"]], Value]  # (the member's run, the seed's runs by label)


@dataclass(frozen=True)
class Scale:
    """One way to run an experiment: a config (a path under the repository's `configs/`) with overrides, and the
    seeds it runs by default. `needs` names the files or weights a `paper` scale reads, checked before anything
    runs; `members` keeps only the members with those labels (a config shared by several experiments)."""

    config: str
    overrides: tuple[str, ...] = ()
    seeds: tuple[int, ...] = (0,)
    needs: tuple[str, ...] = ()
    members: tuple[str, ...] = ()


@dataclass(frozen=True)
class Column:
    """One column of an experiment's table: its header, how a member's value is measured, how it is shown
    (`fmt` formats a number; texts are shown as they are), and whether a lower value is better."""

    name: str
    measure: Measure
    fmt: str = "{:.1f}"
    lower_is_better: bool = False


@dataclass(frozen=True)
class PaperExperiment:
    """A table or figure of one of the five papers, or one of our analyses around it (a control, a gap test, a
    stand-in's own table: ids `<paper>/analysis-...` and `...-gap-...`), so that every result table a page shows
    is generated.

    `paper_numbers` maps our member labels (or the paper's row names where we have no such member) to the
    paper's figure per column; `waiting_for` names methods the library does not have yet (the experiment is
    listed, and refused in one sentence until they exist); `runner` names how its runs are made (`members`:
    every member of the config, once per seed; other runners are registered in `runners.py`)."""

    id: str
    title: str
    shows: str
    columns: tuple[Column, ...]
    scales: Mapping[str, Scale]
    paper_numbers: Mapping[str, Mapping[str, Value]] = field(default_factory=dict)
    paper_note: str = ""
    runner: str = "members"
    waiting_for: tuple[str, ...] = ()

    @property
    def paper(self) -> str:
        return self.id.split("/", 1)[0]

    def scale(self, name: str) -> Scale:
        from manytask.errors import ManytaskError

        if name not in self.scales:
            have = ", ".join(s for s in SCALES if s in self.scales)
            raise ManytaskError(f"experiment '{self.id}' has no '{name}' scale; it has: {have}.")
        return self.scales[name]


@dataclass(frozen=True)
class Paper:
    """A paper's key (the first part of its experiments' ids), its title and the one-line claim the page opens
    with."""

    key: str
    title: str
    claim: str


PAPERS: dict[str, Paper] = {}
EXPERIMENTS: dict[str, PaperExperiment] = {}


def paper(key: str, title: str, claim: str) -> Paper:
    PAPERS[key] = Paper(key, title, claim)
    return PAPERS[key]


def register(*experiments: PaperExperiment) -> None:
    """Add experiments to the registry; an id used twice, or one whose paper is not declared, is a bug."""
    for experiment in experiments:
        if experiment.id in EXPERIMENTS:
            raise ValueError(f"experiment '{experiment.id}' is registered twice")
        if experiment.paper not in PAPERS:
            raise ValueError(f"experiment '{experiment.id}' names no declared paper")
        if "smoke" not in experiment.scales:
            raise ValueError(f"experiment '{experiment.id}' has no smoke scale")
        EXPERIMENTS[experiment.id] = experiment

"""The registry of the five papers' experiments, filled by one module per paper."""

from __future__ import annotations

from manytask.errors import ManytaskError, unknown_choice
from manytask.experiments.spec import EXPERIMENTS, PAPERS, Paper, PaperExperiment

PAPER_MODULES = ("matu", "feddea", "sfmtl", "talos", "mas")  # the page's order


def load() -> None:
    """Import every paper's module (each registers its experiments once)."""
    import importlib.util

    for name in PAPER_MODULES:
        if importlib.util.find_spec(f"manytask.experiments.{name}") is not None:
            importlib.import_module(f"manytask.experiments.{name}")


def all_experiments() -> list[PaperExperiment]:
    load()
    return list(EXPERIMENTS.values())


def papers() -> list[Paper]:
    load()
    return [PAPERS[key] for key in PAPER_MODULES if key in PAPERS]


def experiment_by_id(experiment_id: str) -> PaperExperiment:
    load()
    if experiment_id not in EXPERIMENTS:
        raise unknown_choice("experiment", experiment_id, list(EXPERIMENTS))
    return EXPERIMENTS[experiment_id]


def select(ids: list[str]) -> list[PaperExperiment]:
    """The experiments named (an id, or a paper's key for all of its experiments), else all of them."""
    if not ids:
        return all_experiments()
    load()
    chosen: list[PaperExperiment] = []
    for name in ids:
        found = [e for e in EXPERIMENTS.values() if e.paper == name] if name in PAPERS else [experiment_by_id(name)]
        chosen += [e for e in found if e not in chosen]
    if not chosen:
        raise ManytaskError(f"no experiment matches {', '.join(ids)}.")
    return chosen

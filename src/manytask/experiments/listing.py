"""`manytask experiments`: the registry as text, paper by paper."""

from __future__ import annotations

from manytask.experiments.catalogue import papers, select
from manytask.experiments.reproduce import measured_scales
from manytask.experiments.results import paper_text
from manytask.experiments.spec import SCALES, PaperExperiment


def paper_numbers(experiment: PaperExperiment) -> str:
    parts = []
    for row, values in experiment.paper_numbers.items():
        shown = ", ".join(f"{column} {paper_text(value)}"
                          for column, value in values.items())
        parts.append(f"{row}: {shown}")
    return "; ".join(parts) or "none stated"


def scales_text(experiment: PaperExperiment) -> str:
    parts = []
    for name in SCALES:
        if name in experiment.scales:
            scale = experiment.scales[name]
            extra = " ".join(scale.overrides)
            seeds = ",".join(str(s) for s in scale.seeds)
            parts.append(f"{name} ({scale.config}{' ' + extra if extra else ''}; seeds {seeds})")
    return "; ".join(parts)


def entry(experiment: PaperExperiment) -> list[str]:
    measured = measured_scales(experiment.id)
    status = (f"waits for {', '.join(experiment.waiting_for)}" if experiment.waiting_for
              else f"measured: {', '.join(measured)}" if measured else "not measured yet")
    return [f"  {experiment.id}  [{status}]",
            f"      {experiment.title}: {experiment.shows}",
            f"      paper: {paper_numbers(experiment)}",
            f"      scales: {scales_text(experiment)}"]


def listing(ids: list[str]) -> str:
    chosen = select(ids)
    lines = []
    for paper in papers():
        mine = [e for e in chosen if e.paper == paper.key]
        if mine:
            lines.append(f"{paper.key}: {paper.title} ({len(mine)} experiments)")
            lines += [line for experiment in mine for line in entry(experiment)] + [""]
    lines.append(f"{len(chosen)} experiments; run one with: manytask reproduce ID [--scale smoke|cpu|paper] "
                 f"[--seeds 0,1,2] [--jobs N]")
    return "\n".join(lines)

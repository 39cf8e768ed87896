"""The trackers of one run: which tracker runs exist (a comparison's root, each member's label when it runs several
seeds, each member), the observer that logs every round to them, and the end of the run (summaries, the report and
its plots). Rows a tracker already holds are never logged twice, and rows it missed (a kill between a round's
checkpoint and its log call) are logged from metrics.jsonl when the run resumes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from manytask.engine.loop import RoundObserver
from manytask.extras import require
from manytask.rundir import RunDir
from manytask.trackers.rows import row_scalars

LOGGERS = {"tensorboard": "tensorboard", "mlflow": "mlflow"}  # logger -> the module its extra installs


@dataclass(frozen=True)
class Node:
    """One tracker run: a member (it has a run directory with rounds), or a group of them (the comparison, or one
    label's seeds)."""

    name: str
    parent: str | None
    run_dir: Path
    config: dict[str, Any]
    is_member: bool


class Backend(Protocol):
    def open(self, nodes: Sequence[Node]) -> None: ...  # create the tracker runs, or continue the saved ones
    def last_step(self, node: Node) -> int: ...  # the last round this tracker holds for a member (0: none)
    def log(self, node: Node, step: int, scalars: dict[str, float]) -> None: ...
    def conclude(self, node: Node, summary: dict[str, Any]) -> None: ...  # a finished member's summary
    def attach(self, node: Node, report: Path) -> None: ...  # the run's report.md and its plots
    def close(self, finished: bool) -> None: ...  # finished, or stopped and resumable


def check_loggers(loggers: Sequence[str]) -> None:
    """Each logger's extra is installed (one sentence naming it otherwise), before anything is written."""
    for logger in loggers:
        require(LOGGERS[logger], f"loggers: [{logger}]")


def build_backend(logger: str, config: Any, out: Path) -> Backend:
    if logger == "tensorboard":
        from manytask.trackers.tensorboard import TensorBoardBackend

        return TensorBoardBackend()
    from manytask.trackers.mlflow_runs import MlflowBackend

    return MlflowBackend(config, out)


class Tracking:
    """The run's trackers: `observer` logs rounds; `finish` logs summaries and the report and closes the runs."""

    def __init__(self, nodes: list[Node], backends: list[Backend]) -> None:
        self.nodes = {node.name: node for node in nodes}
        self.backends = backends
        self.logged: dict[tuple[int, str], int] = {}

    def observer(self, inner: RoundObserver | None) -> RoundObserver:
        return TrackingObserver(self, inner)

    def started(self, name: str, done_rounds: int) -> None:
        node = self.nodes[name]
        rows = RunDir(node.run_dir).read_metrics()
        for index, backend in enumerate(self.backends):
            last = backend.last_step(node)
            for row in rows:
                if last < row["round"] <= done_rounds:
                    backend.log(node, row["round"], row_scalars(row))
            self.logged[index, name] = max(last, done_rounds)

    def finished_round(self, name: str, row: dict[str, Any]) -> None:
        for index, backend in enumerate(self.backends):
            if row["round"] > self.logged.get((index, name), 0):
                backend.log(self.nodes[name], row["round"], row_scalars(row))
                self.logged[index, name] = row["round"]

    def finish(self, summaries: dict[str, dict[str, Any]] | None, report: Path | None) -> None:
        """Log each member's summary and the report, and close the runs (as resumable when the run stopped)."""
        if summaries is not None and report is not None:
            root = next(node for node in self.nodes.values() if node.parent is None)
            for backend in self.backends:
                for name, summary in summaries.items():
                    backend.conclude(self.nodes[name], summary)
                backend.attach(root, report)
        self.close(finished=summaries is not None)

    def close(self, finished: bool) -> None:
        for backend in self.backends:
            backend.close(finished)


class TrackingObserver:
    """A `RoundObserver` that logs each round to the trackers and passes it on to `inner` (the progress bars)."""

    def __init__(self, tracking: Tracking, inner: RoundObserver | None) -> None:
        self.tracking, self.inner = tracking, inner
        self.member: str | None = None

    def started(self, label: str, total_rounds: int, done_rounds: int) -> None:
        self.member = label
        self.tracking.started(label, done_rounds)
        if self.inner is not None:
            self.inner.started(label, total_rounds, done_rounds)

    def finished_round(self, row: dict[str, Any]) -> None:
        assert self.member is not None, "a round finished before its run started"
        self.tracking.finished_round(self.member, row)
        if self.inner is not None:
            self.inner.finished_round(row)


def tracking(config: Any, out: Path, members: list[tuple[str, Path, Any]]) -> Tracking | None:
    """The trackers of a run whose members are `(name, run directory, config)`; None without `loggers`."""
    if not config.loggers:
        return None
    nodes = tracker_nodes(config, out, members)
    backends = [build_backend(logger, config, out) for logger in config.loggers]
    for backend in backends:
        backend.open(nodes)
    return Tracking(nodes, backends)


def tracker_nodes(config: Any, out: Path, members: list[tuple[str, Path, Any]]) -> list[Node]:
    """A single run is one node; a comparison a root with its members under it, and with `seeds`, each label's
    seeds under a node of that label."""
    dump = config.model_dump(mode="json")
    if not config.is_comparison:
        (name, run_dir, member), = members
        return [Node(name, None, run_dir, member.model_dump(mode="json"), True)]
    root = out.name or "run"
    nodes = [Node(root, None, out, dump, False)]
    for name, run_dir, member in members:
        parent = root
        if config.seeds is not None:
            label = name.rsplit("@seed", 1)[0]
            parent = f"{root}/{label}"
            if parent not in {node.name for node in nodes}:
                nodes.append(Node(parent, root, out, {**dump, "method": member.model_dump(mode="json")["method"]},
                                  False))
        nodes.append(Node(name, parent, run_dir, member.model_dump(mode="json"), True))
    return nodes

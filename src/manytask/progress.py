"""Progress display for long runs: a rich progress bar per run, with the latest average accuracy."""

from __future__ import annotations

import os
import signal
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from manytask.config import RunConfig
from manytask.method_entry import method_label


class RichObserver:
    """Implements `RoundObserver`; one bar per (method) run, on stderr, under an optional `header` line printed
    when the first run starts (after the config was checked: an error stays one line)."""

    def __init__(self, console: Console, header: str | None = None) -> None:
        self.header = header
        self.progress = Progress(
            TextColumn("[bold]{task.description:<14}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("rounds"), TimeElapsedColumn(), TextColumn("{task.fields[status]}"),
            console=console, transient=False,
        )
        self._bar: Any = None

    def __enter__(self) -> RichObserver:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def started(self, label: str, total_rounds: int, done_rounds: int) -> None:
        if self.header is not None:
            self.progress.console.print(self.header, highlight=False, soft_wrap=True)
            self.header = None
        self._bar = self.progress.add_task(label, total=total_rounds, completed=done_rounds, status="")

    def finished_round(self, row: dict[str, Any]) -> None:
        status = f"avg {row['average']:.3f}" if "average" in row else ""
        if row.get("dropped"):
            status += f"  dropped {row['dropped']}"
        self.progress.update(self._bar, completed=row["round"], status=status)


class SignalAfterRound:
    """Sends this process SIGINT, as a user's Ctrl-C would, right after round `round_` is finished and checkpointed;
    passes everything on to `inner`. The CLI installs it when `MANYTASK_SIGINT_AFTER_ROUND` is set, so a test can
    interrupt a real run at a round it chooses instead of racing it with a timer."""

    def __init__(self, round_: int, inner: Any = None) -> None:
        self.round = round_
        self.inner = inner

    def started(self, label: str, total_rounds: int, done_rounds: int) -> None:
        if self.inner:
            self.inner.started(label, total_rounds, done_rounds)

    def finished_round(self, row: dict[str, Any]) -> None:
        if self.inner:
            self.inner.finished_round(row)
        if row["round"] == self.round:
            os.kill(os.getpid(), signal.SIGINT)


def run_header(config: RunConfig) -> str:
    """What a run is about to do, in one line: its members, benchmark, federation and the clients' effective
    optimizer (momentum included, which other libraries leave at 0)."""
    members = ", ".join(method_label(m) for m in config.methods)
    tasks = config.federation.tasks.get("kind", "one-per-client")
    samples = config.federation.samples.get("kind", "iid")
    return (f"{config.name}: {members} on {config.benchmark['name']}; {config.federation.num_clients} clients "
            f"(tasks {tasks}, samples {samples}), {config.rounds} rounds; clients' optimizer: "
            f"{config.train.describe()}")

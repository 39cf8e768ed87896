"""Progress display for long runs: a rich progress bar per run, with the latest average accuracy."""

from __future__ import annotations

import os
import signal
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class RichObserver:
    """Implements `RoundObserver`; one bar per (method) run, on stderr."""

    def __init__(self, console: Console) -> None:
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

"""Drills: a deployed run held at chosen points of its rounds, so that something can be done to the federation
there (SuperNodes killed, restarted or joining, the SuperLink killed) at an exact point of the run, never at a time.

Two kinds of point: `after-R`, once round R's row and checkpoint are written (between rounds R and R+1), and
`mid-R`, once round R's training messages are on the SuperLink and before any reply is read (in the middle of the
round). The ServerApp learns the points from its run config (`hold-at`, comma-separated names). At a point it writes
`R.held` into the run directory's `flower/holds` folder and waits for `R.go` there. The driver (`run_on_superlink`
given a `Drill`) runs the point's action when it sees the `.held` file: an action that returns True releases the
run (`.go`); one that returns False leaves it held and stops following it (the action killed the SuperLink, say);
the run is then resumed like a stopped one.

Drills need the driver and the ServerApp to share the run directory: a SuperLink on the driver's machine, as with
`manytask flower local-cluster`."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from manytask.errors import ManytaskError

HOLD_KEY = "hold-at"  # the ServerApp's run-config key
HOLD_POLL_SECONDS = 0.05  # how often a held ServerApp looks for its release
_POINT = re.compile(r"(after|mid)-([1-9]\d*)")

Action = Callable[[], bool]


def holds_folder(run_dir: Path) -> Path:
    return run_dir / "flower" / "holds"


def parse_points(text: str) -> set[str]:
    """The hold points named in a run config's `hold-at` ("" for none); a name of another form is an error."""
    points = {name.strip() for name in text.split(",") if name.strip()}
    wrong = sorted(p for p in points if not _POINT.fullmatch(p))
    if wrong:
        raise ManytaskError(f"hold point(s) {wrong} are not of the form after-R or mid-R (R a round, from 1).")
    return points


@dataclass
class Drill:
    """The driver's side: an action per hold point (`after-R`, `mid-R`), run when the ServerApp holds there."""

    actions: Mapping[str, Action]
    done: list[str] = field(default_factory=list)  # the points whose actions ran, in order

    def __post_init__(self) -> None:
        parse_points(",".join(self.actions))

    @property
    def run_config_value(self) -> str:
        return ",".join(sorted(self.actions))

    def serve(self, folder: Path) -> bool:
        """Run the action of every point the ServerApp now holds at; False once one leaves the run held."""
        for marker in sorted(folder.glob("*.held"), key=lambda p: p.stat().st_mtime_ns):
            point = marker.stem
            if point in self.done:
                continue
            self.done.append(point)
            if not self.actions[point]():
                return False
            (folder / f"{point}.go").touch()
        return True


class ServerHolds:
    """The ServerApp's side: holds the run at its points until the driver releases it (or `timeout` passes: a
    driver that died must not leave the run waiting for ever). As the round loop's observer it holds at `after-R`;
    the transport calls `pushed` after each push, for `mid-R`."""

    def __init__(self, folder: Path, points: set[str], timeout: float) -> None:
        self.folder, self.points, self.timeout = folder, points, timeout

    def hold(self, point: str) -> None:
        if point not in self.points:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        release = self.folder / f"{point}.go"
        (self.folder / f"{point}.held").touch()
        deadline = time.monotonic() + self.timeout
        while not release.exists():
            if time.monotonic() > deadline:
                raise ManytaskError(f"the drill's driver did not release hold point {point} within "
                                    f"{self.timeout:.0f} s (no {release}).")
            time.sleep(HOLD_POLL_SECONDS)

    def pushed(self, kind: str, group: str) -> None:
        if kind == "train":
            self.hold(f"mid-{group}")

    def started(self, label: str, total_rounds: int, done_rounds: int) -> None:
        pass

    def finished_round(self, row: dict[str, Any]) -> None:
        self.hold(f"after-{row['round']}")

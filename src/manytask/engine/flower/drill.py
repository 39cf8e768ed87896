"""Drills: a deployed run held at chosen points of its rounds, so that something can be done to the federation
there (SuperNodes killed, restarted or joining, the SuperLink killed) at an exact point of the run, never at a time.

Two kinds of point: `after-R`, once round R's row and checkpoint are written (between rounds R and R+1), and
`mid-R`, once round R's training messages are on the SuperLink and before any reply is read (in the middle of the
round). The ServerApp learns the points from its run config (`hold-at`, comma-separated names). At a point it writes
`POINT.held` into the run directory's `flower/holds` folder and waits for `POINT.go` there. The driver
(`run_on_superlink` given a `Drill`) runs the point's action when it sees the `.held` file: an action that returns
True releases the run (`.go`); one that returns False leaves it held and stops following it (the action killed
the SuperLink, say); the run is then resumed like a stopped one.

Drills need the driver and the ServerApp to share the run directory: a SuperLink on the driver's machine, as with
`manytask flower local-cluster`."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from manytask.errors import ManytaskError

HOLD_KEY = "hold-at"  # the ServerApp's run-config key
HOLD_POLL_SECONDS = 0.05  # how often a held ServerApp looks for its release
HOLD_TIMEOUT = 600.0  # seconds a held ServerApp waits for its driver (an action may restart daemons) before failing
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
        """Run the action of the point the ServerApp now holds at, if any (it holds at one point at a time);
        False when the action leaves the run held."""
        for marker in folder.glob("*.held"):
            point = marker.stem
            if point in self.done:
                continue
            self.done.append(point)
            if not self.actions[point]():
                return False
            (folder / f"{point}.go").touch()
        return True


@dataclass(frozen=True)
class Churn:
    """A schedule of SuperNodes leaving and joining a run, each event after a round (`after-R`): `kills[n]` = R
    kills node n after round R; `restarts[n]` = R starts it again after round R; `joins[n]` = R starts node n, absent
    until then, after round R."""

    kills: dict[int, int]
    restarts: dict[int, int]
    joins: dict[int, int]

    def down(self, node: int, round_number: int) -> bool:
        """Whether `node` is not running during round `round_number` (from 1)."""
        if node in self.joins:
            return round_number <= self.joins[node]
        killed, restarted = self.kills.get(node), self.restarts.get(node)
        return killed is not None and killed < round_number and (restarted is None or round_number <= restarted)

    def drill(self, kill: Callable[[int], None], start: Callable[[int], None]) -> Drill:
        """The drill that carries the schedule out with these actions on a node (a kill, a start)."""
        events: dict[int, list[Callable[[], None]]] = {}
        for node, after in self.kills.items():
            events.setdefault(after, []).append(lambda node=node: kill(node))
        for node, after in [*self.restarts.items(), *self.joins.items()]:
            events.setdefault(after, []).append(lambda node=node: start(node))

        def act(actions: list[Callable[[], None]]) -> Action:
            def run_all() -> bool:
                for action in actions:
                    action()
                return True

            return run_all

        return Drill({f"after-{after}": act(actions) for after, actions in sorted(events.items())})


def churn_schedule(seed: int, nodes: int, rounds: int, kills: int = 3, restarts: int = 2, joins: int = 1) -> Churn:
    """A seeded churn schedule: `kills` nodes killed after rounds 1 to rounds-3, `restarts` of them started again
    at least one round later (by round rounds-2), and `joins` other nodes absent until a round from 1 to rounds-2."""
    if rounds < 4 or kills + joins > nodes or restarts > kills:
        raise ManytaskError(f"no churn of {kills} kills ({restarts} restarted) and {joins} late nodes fits {nodes} "
                            f"nodes and {rounds} rounds (it needs 4 rounds or more).")
    rng = random.Random(seed)
    chosen = rng.sample(range(nodes), kills + joins)
    victims, late = chosen[:kills], chosen[kills:]
    killed = {node: rng.randint(1, rounds - 3) for node in victims}
    restarted = {node: rng.randint(killed[node] + 1, rounds - 2) for node in rng.sample(victims, restarts)}
    return Churn(killed, restarted, {node: rng.randint(1, rounds - 2) for node in late})


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

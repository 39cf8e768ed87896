"""A SuperNode's saved client states (node config `state-path=DIR`): one file per round the client trained, so that
a restarted node, or a resumed run (a new Flower run, with a fresh `context.state`), continues from the state an
uninterrupted run would hold.

Layout: `DIR/<run>/client-<k>/round-<r>.mtk`, each one manytask message (the state's tensors; scalars naming the run,
the client and the round, checked on load). A file is written to a temporary name and moved into place, so a node
killed mid-write leaves the previous files whole. The server names the round to load (the last round whose reply
reached it, kept in its checkpoint) and the oldest round it may still ask for (`keep_from`, as of its last
checkpoint); older files are deleted.

Policy: a state the server names that the node does not hold (its folder lost, another run's, or a round the node
never saved) stops that client's call with one sentence saying what the node holds; the server records it as the
client's failure for the round and the run goes on without it (`min_replies`). An exact run cannot continue a client
from a state it no longer has, so the node does not start it afresh in silence."""

from __future__ import annotations

import os
import re
from pathlib import Path

from manytask.engine.client_runner import ClientState
from manytask.messages import Message, decode, encode

_ROUND_FILE = re.compile(r"round-(\d+)\.mtk")


class NodeStates:
    def __init__(self, root: Path, run: str, client: int) -> None:
        if not run:
            raise ValueError("the server named no run for the saved client states (an older manytask server?)")
        self.root, self.run, self.client = root, run, client
        self.folder = root / run / f"client-{client}"

    def rounds(self) -> list[int]:
        """The rounds whose state this node holds for this run and client, oldest first."""
        if not self.folder.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.folder.iterdir() if (m := _ROUND_FILE.fullmatch(p.name)))

    def load(self, round_number: int) -> ClientState:
        """The state after round `round_number` (0: a client that has not trained yet, an empty state)."""
        if round_number == 0:
            return {}
        path = self._path(round_number)
        if not path.exists():
            raise ValueError(self._missing(round_number))
        message = decode(path.read_bytes())
        tags = {"run": self.run, "client": self.client, "round": round_number}
        if {k: message.scalars.get(k) for k in tags} != tags:
            raise ValueError(f"{path} is tagged {dict((k, message.scalars.get(k)) for k in tags)}, not {tags}")
        return message.tensors()

    def save(self, round_number: int, state: ClientState, keep_from: int) -> None:
        """Write the state after round `round_number` atomically, then delete the files of rounds before
        `keep_from` (the oldest the server's last checkpoint may still name)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self._path(round_number)
        tmp = path.with_name(path.name + ".tmp")
        scalars = {"run": self.run, "client": self.client, "round": round_number}
        with open(tmp, "wb") as file:
            file.write(encode(Message.from_tensors(state, scalars=scalars)))
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
        for old in self.rounds():
            if old < keep_from:
                self._path(old).unlink(missing_ok=True)

    def _path(self, round_number: int) -> Path:
        return self.folder / f"round-{round_number}.mtk"

    def _missing(self, round_number: int) -> str:
        held = self.rounds()
        others = sorted(p.name for p in self.root.iterdir() if p.is_dir() and p.name != self.run) \
            if self.root.is_dir() else []
        if held:
            what = f"it holds rounds {held} of this run"
        elif others:
            what = f"it holds states of other runs only ({', '.join(others[:3])})"
        else:
            what = "it holds no saved state"
        return (f"this SuperNode has no saved state of round {round_number} for client {self.client} in "
                f"{self.root} (run {self.run}); {what}")

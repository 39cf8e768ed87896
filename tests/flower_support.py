"""Helpers for the Flower tests: run a command in a private network namespace (only loopback up)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest


def netns_available() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
    return probe.returncode == 0


needs_netns = pytest.mark.skipif(not netns_available(), reason="needs `unshare -n` (root) for a private network")


def run_in_netns(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m manytask.cli ARGS` inside a fresh network namespace where only loopback exists."""
    command = shlex.join([sys.executable, "-m", "manytask.cli", *args])
    return subprocess.run(
        ["unshare", "-n", "bash", "-c", f"ip link set lo up && {command}"],
        capture_output=True, text=True, timeout=timeout,
    )


def listeners_of(process_groups: list[int]) -> list[str]:
    """Local addresses of the TCP listening sockets owned by processes in these process groups (`ss -ltnp`)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    addresses = []
    for line in out.splitlines():
        fields = line.split()
        local = fields[3]
        for pid in (int(p) for p in re.findall(r"pid=(\d+)", line)):
            try:
                pgid = os.getpgid(pid)
            except ProcessLookupError:
                continue
            if pgid in process_groups:
                addresses.append(local)
    return addresses


class FakeGrid:
    """A stand-in for Flower's `Grid` on the ServerApp side, for the transport's logic without daemons. Each node
    (id -> partition-id) is "up" (answers at once), "dead" (still listed, never answers: a killed SuperNode
    before its heartbeats expire) or "offline" (not listed; the SuperLink answers NODE_UNAVAILABLE)."""

    def __init__(self, partitions: dict[int, int], data: dict[int, str] | None = None) -> None:
        from flwr.app import Message

        self.partition = dict(partitions)
        self.data = data or {}  # node -> the data fingerprint its handshake answers with (none: no "data" key)
        self.state = dict.fromkeys(partitions, "up")
        self.waiting: dict[str, Message] = {}
        self.pushed: list[Message] = []
        self.pulls = 0  # pull requests: a round that waits for nothing pulls once

    def get_node_ids(self) -> list[int]:
        return [node for node, state in self.state.items() if state != "offline"]

    def push_messages(self, messages):
        for message in messages:
            message.metadata.__dict__["_message_id"] = message.object_id  # as Flower's Grid does
            self.waiting[message.metadata.message_id] = message
            self.pushed.append(message)
        return [m.metadata.message_id for m in messages]

    def pull_messages(self, message_ids):
        self.pulls += 1
        replies = []
        for message_id in message_ids:
            message = self.waiting[message_id]
            state = self.state[message.metadata.dst_node_id]
            if state != "dead":
                replies.append(self._answer(message) if state == "up" else _offline(message))
                del self.waiting[message_id]
        return replies

    def sent_to(self, node: int, kind: str) -> int:
        return sum(m.metadata.dst_node_id == node and m.metadata.message_type == kind for m in self.pushed)

    def _answer(self, message):
        from flwr.app import ConfigRecord, Message, RecordDict

        from manytask.engine.flower.records import CONTROL_RECORD, METRICS_RECORD, metrics_record, request

        kind = message.metadata.message_type
        if kind == "query":
            node = message.metadata.dst_node_id
            answer = {"client": self.partition[node], **({"data": self.data[node]} if node in self.data else {})}
            return Message(RecordDict({CONTROL_RECORD: ConfigRecord(answer)}), reply_to=message)
        if kind == "train":
            return Message(request(b"reply", {"seconds": 0.0}), reply_to=message)
        return Message(RecordDict({METRICS_RECORD: metrics_record({"t": {"accuracy": 1.0}})}), reply_to=message)


def _offline(message):
    from flwr.app import Error, Message

    return Message(Error(5, "Error: Node Unavailable"), reply_to=message)

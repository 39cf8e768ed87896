"""Helpers for the Flower tests: run a command in a private network namespace (only loopback up)."""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

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


def write_test_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1/localhost, made with `cryptography`: (ca, cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def certificate(subject: str, issuer: x509.Name, key, signer, extensions) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(issuer).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1)))
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(signer, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "manytask-test-ca")])
    authority = [(x509.BasicConstraints(ca=True, path_length=None), True)]
    ca = certificate("manytask-test-ca", ca_name, ca_key, ca_key, authority)
    names = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    server = certificate("localhost", ca_name, server_key, ca_key,
                         [(names, False), (x509.BasicConstraints(ca=False, path_length=None), True)])
    directory.mkdir(parents=True, exist_ok=True)
    paths = directory / "ca.crt", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


class FakeGrid:
    """A stand-in for Flower's `Grid` on the ServerApp side, for the transport's logic without daemons. Each node
    (id -> partition-id) is "up" (answers at once), "dead" (still listed, never answers: a killed SuperNode
    before its heartbeats expire) or "offline" (not listed; the SuperLink answers NODE_UNAVAILABLE)."""

    def __init__(self, partitions: dict[int, int]) -> None:
        from flwr.app import Message

        self.partition = dict(partitions)
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
            client = self.partition[message.metadata.dst_node_id]
            return Message(RecordDict({CONTROL_RECORD: ConfigRecord({"client": client})}), reply_to=message)
        if kind == "train":
            return Message(request(b"reply", {"seconds": 0.0}), reply_to=message)
        return Message(RecordDict({METRICS_RECORD: metrics_record({"t": {"accuracy": 1.0}})}), reply_to=message)


def _offline(message):
    from flwr.app import Error, Message

    return Message(Error(5, "Error: Node Unavailable"), reply_to=message)

"""`GridTransport`: the round loop's payloads carried to SuperNodes through Flower's `Grid`.

Every wait has a deadline. Replies are matched to clients through the message ids they answer; a node that fails,
errors or misses the deadline becomes a dropout of that round, logged with its client id and the reason."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from manytask.engine.client_runner import ClientState
from manytask.engine.flower.records import CONTROL_RECORD, METRICS_RECORD, control_of, data_of, metrics_of, request
from manytask.engine.loop import FitOutcome, Payloads
from manytask.errors import ManytaskError
from manytask.methods.base import Metrics

LOG = logging.getLogger(__name__)
PULL_INTERVAL = 0.2  # seconds between polls for replies (Grid.send_and_receive sleeps 3 s in deployment)


class GridTransport:
    def __init__(
        self, grid: Grid, num_clients: int, config_text: str, round_timeout: float, connect_timeout: float
    ) -> None:
        self.grid = grid
        self.round_timeout = round_timeout
        self.unreached: dict[int, str] = {}  # client -> why no SuperNode serves it (it fails every round)
        self.nodes = self._handshake(num_clients, config_text, connect_timeout)

    def fit(self, round_index: int, payloads: Payloads, simulated_drops: set[int]) -> FitOutcome:
        contents = {
            c: request(data, {"round": round_index, "drop": c in simulated_drops}) for c, data in payloads.items()
        }
        outcome = FitOutcome()
        for client, reply in self._exchange(contents, "train", str(round_index + 1), outcome.failures).items():
            outcome.replies[client] = data_of(reply.content)
            outcome.seconds[client] = float(control_of(reply.content)["seconds"])
        return outcome

    def evaluate(self, payloads: Payloads) -> dict[int, Metrics]:
        contents = {c: request(data, {}) for c, data in payloads.items()}
        failures: dict[int, str] = {}
        replies = self._exchange(contents, "evaluate", "evaluate", failures)
        return {c: metrics_of(r.content.metric_records[METRICS_RECORD]) for c, r in replies.items()}

    def client_states(self) -> dict[int, ClientState]:
        return {}  # kept by the SuperNodes in Flower's context.state

    def restore_client_states(self, states: dict[int, ClientState]) -> None:
        if states:
            raise ManytaskError("this checkpoint holds client states, which a Flower run cannot hand to SuperNodes.")

    def _handshake(self, num_clients: int, config_text: str, timeout: float) -> dict[int, int]:
        """Wait for the nodes, send each the config, and map client id (partition-id) -> node id."""
        node_ids = self._wait_for_nodes(num_clients, timeout)
        contents = {node: RecordDict({CONTROL_RECORD: ConfigRecord({"config": config_text})}) for node in node_ids}
        failures: dict[int, str] = {}
        replies = self._send(contents, "query", "handshake", failures)
        nodes: dict[int, int] = {}
        for node, reply in replies.items():
            client = int(control_of(reply.content)["client"])
            if client in nodes:
                raise ManytaskError(f"two SuperNodes claim partition-id {client}; give each a distinct partition-id.")
            nodes[client] = node
        missing = sorted(set(range(num_clients)) - set(nodes))
        if missing and not nodes:
            reasons = "; ".join(f"node {n}: {why}" for n, why in failures.items()) or "no node has these ids"
            raise ManytaskError(f"no SuperNode answered for client(s) {missing} ({reasons}).")
        # A node that died before the handshake (a resumed run whose node is gone): its clients fail every round,
        # each logged with this reason, instead of stopping the run. `min_replies` decides whether a round counts.
        reason = "; ".join(f"node {n}: {why}" for n, why in failures.items()) or "no node has its partition-id"
        self.unreached = dict.fromkeys(missing, f"no SuperNode answered the handshake ({reason})")
        return nodes

    def _wait_for_nodes(self, count: int, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        while True:
            node_ids = sorted(self.grid.get_node_ids())
            if len(node_ids) >= count:
                return node_ids
            if time.monotonic() > deadline:
                raise ManytaskError(
                    f"only {len(node_ids)} of {count} SuperNodes connected within {timeout:.0f} s; "
                    "start the missing ones or raise flower.connect_timeout."
                )
            time.sleep(PULL_INTERVAL)

    def _exchange(
        self, contents: dict[int, RecordDict], kind: str, group: str, failures: dict[int, str]
    ) -> dict[int, Message]:
        """Send client-addressed contents; return the good replies by client, recording failures."""
        failures.update({c: self.unreached[c] for c in contents if c in self.unreached})
        by_node = {self.nodes[c]: content for c, content in contents.items() if c not in self.unreached}
        client_of = {node: client for client, node in self.nodes.items()}
        node_failures: dict[int, str] = {}
        replies = self._send(by_node, kind, group, node_failures)
        for node, why in node_failures.items():
            failures[client_of[node]] = why
            LOG.warning("%s %s: client %d dropped (%s)", kind, group, client_of[node], why)
        return {client_of[node]: reply for node, reply in replies.items()}

    def _send(
        self, contents: dict[int, RecordDict], kind: str, group: str, failures: dict[int, str]
    ) -> dict[int, Message]:
        """Push one message per node and pull replies until all arrived or the deadline passed."""
        messages = [Message(content, dst_node_id=node, message_type=kind, group_id=group) for node, content in
                    contents.items()]
        node_of = dict(zip(self.grid.push_messages(messages), contents, strict=True))
        replies: dict[int, Message] = {}
        deadline = time.monotonic() + self.round_timeout
        pending = set(node_of)
        while pending and time.monotonic() < deadline:
            for reply in _pulled(self.grid, pending):
                node = node_of[reply.metadata.reply_to_message_id]
                pending.discard(reply.metadata.reply_to_message_id)
                if reply.has_error():
                    failures[node] = f"error {reply.error.code}: {reply.error.reason}"
                else:
                    replies[node] = reply
            if pending:
                time.sleep(PULL_INTERVAL)
        for message_id in pending:
            failures[node_of[message_id]] = f"no reply within {self.round_timeout:.0f} s"
        return replies


def _pulled(grid: Grid, message_ids: Iterable[str]) -> list[Message]:
    return list(grid.pull_messages(list(message_ids)))

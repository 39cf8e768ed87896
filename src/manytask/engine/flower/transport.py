"""`GridTransport`: the round loop's payloads carried to SuperNodes through Flower's `Grid`.

Every wait has a deadline. Replies are matched to clients through the message ids they answer; a node that fails,
errors or misses the deadline becomes a dropout of that round, logged with its client id and the reason.

A node that gives no reply before the deadline (or that the SuperLink reports offline) is *lost*: its client fails
at once in later rounds, so a dead SuperNode costs one timeout, not one per round. Lost clients come back when
their node reappears: every exchange pushes a probe (the handshake query, which is idempotent) to the silent
nodes and collects the answers while waiting for the round, without waiting longer for them; and node ids the
SuperLink lists that were never handshaken (a restarted SuperNode registers with a new id) are handshaken and
take over their partition-id."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from manytask.engine.client_runner import ClientState
from manytask.engine.flower.records import CONTROL_RECORD, METRICS_RECORD, control_of, data_of, metrics_of, request
from manytask.engine.loop import FitOutcome, Payloads
from manytask.errors import ManytaskError
from manytask.messages import as_bytes
from manytask.methods.base import Metrics

LOG = logging.getLogger(__name__)
PULL_INTERVAL = 0.2  # s between polls while SuperNodes connect; the longest between polls for replies
# (Grid.send_and_receive sleeps 3 s in deployment)
SHORTEST_PULL_WAIT = 0.001  # seconds; a round's waits between polls grow with its age (`pull_wait`)
PULL_WAIT_SHARE = 0.05  # of the round's age so far: a reply is picked up at most this share of the round late
REPLIED_KEY = "flower/state_round"  # a Flower run's client entry in the checkpoint: the round of its node's state
QUERY = "query"  # the handshake's message type (client_app's `@app.query()`)


@dataclass
class Answers:
    """What came back for one batch of node-addressed messages."""

    replies: dict[int, Message] = field(default_factory=dict)  # node -> good reply
    failures: dict[int, str] = field(default_factory=dict)  # node -> why it gave no good reply
    silent: dict[int, str] = field(default_factory=dict)  # node -> how it fell silent (no reply, offline)


class GridTransport:
    def __init__(
        self, grid: Grid, num_clients: int, config_text: str, round_timeout: float, connect_timeout: float,
        run_key: str = "", on_pushed: Callable[[str, str], None] | None = None,
        client_data: Callable[[int], str] | None = None,
    ) -> None:
        self.grid = grid
        self.on_pushed = on_pushed  # told (message type, group) once a batch of messages is on the SuperLink
        self.client_data = client_data  # client -> the fingerprint of the data its node must hold (None: unchecked)
        self.run_key = run_key  # names this run's client states on the SuperNodes that keep them (`state-path`)
        # client -> the last round whose reply arrived: the state its node must load next (0: none yet); and the
        # same as of the last checkpoint, below which a node may delete its saved states
        self.replied: dict[int, int] = {}
        self.checkpointed: dict[int, int] = {}
        self.num_clients = num_clients
        self.config_text = config_text
        self.round_timeout = round_timeout
        self.stage = "the handshake"  # where the transport is, named in a lost client's reason
        self.round = 0
        self.lost: dict[int, str] = {}  # client -> why its node is no longer waited for
        self.unreached: dict[int, str] = {}  # client -> why no SuperNode serves it (none answered its handshake)
        self.seen: set[int] = set()  # every node id sent a handshake, answered or not
        self.mute: set[int] = set()  # nodes that never answered a handshake (their client is unknown): probed
        self.probes: dict[str, int] = {}  # pending probe message id -> node
        self.nodes = self._handshake(connect_timeout)

    def fit(self, round_index: int, payloads: Payloads, simulated_drops: set[int]) -> FitOutcome:
        self.round = round_index + 1
        self.stage = f"round {self.round}"
        contents = {
            c: request(None if data is None else as_bytes(data),
                       {"round": round_index, "drop": c in simulated_drops, **self._state_control(c),
                        "keep_from": self.checkpointed.get(c, 0)}) for c, data in payloads.items()
        }
        outcome = FitOutcome()
        for client, reply in self._exchange(contents, "train", str(round_index + 1), outcome.failures).items():
            outcome.replies[client] = data_of(reply.content)
            outcome.seconds[client] = float(control_of(reply.content)["seconds"])
            self.replied[client] = round_index + 1
        return outcome

    def _state_control(self, client: int) -> dict[str, int | str]:
        """What a node that saves client states needs to load the right one: the run and the state's round."""
        return {"run": self.run_key, "state_round": self.replied.get(client, 0)}

    def evaluate(self, payloads: Payloads) -> dict[int, Metrics]:
        self.stage = f"the evaluation of round {self.round}"
        contents = {c: request(None if data is None else as_bytes(data), self._state_control(c))
                    for c, data in payloads.items()}
        failures: dict[int, str] = {}
        replies = self._exchange(contents, "evaluate", "evaluate", failures)
        return {c: metrics_of(r.content.metric_records[METRICS_RECORD]) for c, r in replies.items()}

    def client_states(self) -> dict[int, ClientState]:
        """What the checkpoint keeps of the clients: the round of each one's state, not the state (its SuperNode
        keeps that). Called as the checkpoint is written: from here on, nodes may drop older states."""
        self.checkpointed = dict(self.replied)
        return {c: {REPLIED_KEY: torch.tensor(r)} for c, r in self.replied.items()}

    def restore_client_states(self, states: dict[int, ClientState]) -> None:
        if any(set(state) != {REPLIED_KEY} for state in states.values()):
            raise ManytaskError("this checkpoint holds client states, which a Flower run cannot hand to SuperNodes.")
        self.replied = {c: int(state[REPLIED_KEY]) for c, state in states.items()}
        self.checkpointed = dict(self.replied)

    def absent(self) -> dict[int, str]:
        """Clients not sent work (they fail at once), with why: lost ones and those no node answered for."""
        return {**self.unreached, **self.lost}

    # -- the handshake -------------------------------------------------------------------------------------------

    def _query(self) -> RecordDict:
        """The handshake's content: the run's config. A node stores it and answers its client id; doing so again
        changes nothing, which is why the same query serves as the probe of a silent node."""
        return RecordDict({CONTROL_RECORD: ConfigRecord({"config": self.config_text})})

    def _handshake(self, timeout: float) -> dict[int, int]:
        """Wait for the nodes, send each the config, and map client id (partition-id) -> node id."""
        answers = self._greet(self._wait_for_nodes(self.num_clients, timeout))
        nodes: dict[int, int] = {}
        for node, reply in answers.replies.items():
            client = self._checked_client(node, reply)
            if client in nodes:
                raise ManytaskError(f"two SuperNodes claim partition-id {client}; give each a distinct partition-id.")
            nodes[client] = node
        missing = sorted(set(range(self.num_clients)) - set(nodes))
        reasons = "; ".join(f"node {n}: {why}" for n, why in answers.failures.items())
        if missing and not nodes:
            raise ManytaskError(f"no SuperNode answered for client(s) {missing} ({reasons or 'no node has them'}).")
        # A node that died before the handshake (a resumed run whose node is gone): its clients fail every round,
        # each logged with this reason, instead of stopping the run. `min_replies` decides whether a round counts.
        why = f"no SuperNode answered the handshake ({reasons or 'no node has its partition-id'}); not waited for since"
        self.unreached = dict.fromkeys(missing, why)
        return nodes

    def _checked_client(self, node: int, reply: Message) -> int:
        """The client a handshake's answer names, once its node's data are found to be the client's own."""
        client = _client_of(reply)
        if self.client_data is not None and 0 <= client < self.num_clients:
            found, expected = control_of(reply.content).get("data"), self.client_data(client)
            if found != expected:
                raise ManytaskError(f"the SuperNode serving client {client} (node {node}) holds other training data "
                                    f"than the server expects (data fingerprint {found}, expected {expected}): its "
                                    "benchmark drew other data, or its files differ; give every node the same data "
                                    "(a seeded benchmark, the same files, or manytask export-partitions).")
        return client

    def _greet(self, node_ids: Iterable[int]) -> Answers:
        """Send the handshake to these nodes and wait for the answers (deadline: round_timeout). A node that does
        not answer is remembered as mute and probed from then on, never waited for again."""
        node_ids = set(node_ids)
        self.seen |= node_ids
        answers = self._send({node: self._query() for node in node_ids}, QUERY, "handshake")
        self.mute |= set(answers.silent)
        return answers

    def _wait_for_nodes(self, count: int, timeout: float) -> list[int]:
        """The nodes connected once `count` are, or at the deadline. Fewer is not fatal (a resumed run whose node
        died): the handshake leaves their clients unreached, and `min_replies` decides whether a round counts.
        None at all is."""
        deadline = time.monotonic() + timeout
        while True:
            node_ids = sorted(self.grid.get_node_ids())
            if len(node_ids) >= count:
                return node_ids
            if time.monotonic() > deadline:
                if not node_ids:
                    raise ManytaskError(f"no SuperNode connected within {timeout:.0f} s; start them or raise "
                                        "flower.connect_timeout.")
                LOG.warning("only %d of %d SuperNodes connected within %.0f s; the run goes on without the others",
                            len(node_ids), count, timeout)
                return node_ids
            time.sleep(PULL_INTERVAL)

    # -- lost clients coming back --------------------------------------------------------------------------------

    def _admit_new_nodes(self) -> None:
        """Handshake node ids never seen before (a restarted SuperNode registers with a new id, a late one joins):
        each that answers serves its partition-id from now on, also in place of a node the server has not yet
        noticed is dead (the SuperLink lists a killed node until its heartbeats expire). Waits only when such a
        node exists."""
        fresh = set(self.grid.get_node_ids()) - self.seen
        if fresh:
            for node, reply in self._greet(fresh).replies.items():
                self._take_back(self._checked_client(node, reply), node, newest=True)

    def _push_probes(self) -> None:
        """One pending probe per silent node (a lost client's, or one that never answered its handshake)."""
        targets = sorted((self.mute | {self.nodes[c] for c in self.lost}) - set(self.probes.values()))
        messages = [Message(self._query(), dst_node_id=node, message_type=QUERY, group_id="probe") for node in targets]
        for message_id, node in zip(_pushed(self.grid, messages), targets, strict=True):
            if message_id:
                self.probes[message_id] = node

    def _probe_answered(self, message_id: str, reply: Message) -> None:
        node = self.probes.pop(message_id)
        if not reply.has_error():
            self._take_back(self._checked_client(node, reply), node)

    def _take_back(self, client: int, node: int, newest: bool = False) -> None:
        """A node answered for `client`: it serves the client from the next exchange on. A probed node whose client
        another node serves now is left idle (neither probed nor sent work); a node that just registered (`newest`)
        replaces the one serving the client: the SuperNode started last is the one that is up."""
        self.mute.discard(node)
        serving = self.nodes.get(client)
        if client not in self.absent() and serving not in (None, node):
            if not newest:
                LOG.warning("node %d answered for client %d, which node %d serves; ignored", node, client, serving)
                return
            LOG.warning("node %d, new, answered for client %d: it replaces node %d", node, client, serving)
        self.nodes[client] = node
        self.lost.pop(client, None)
        self.unreached.pop(client, None)
        LOG.warning("client %d is back (node %d)", client, node)

    # -- sending and waiting -------------------------------------------------------------------------------------

    def _exchange(
        self, contents: dict[int, RecordDict], kind: str, group: str, failures: dict[int, str]
    ) -> dict[int, Message]:
        """Send client-addressed contents; return the good replies by client, recording failures. Absent clients
        fail at once; a client whose node stays silent becomes lost."""
        self._admit_new_nodes()
        absent = self.absent()
        failures.update({c: absent[c] for c in contents if c in absent})
        by_node = {self.nodes[c]: content for c, content in contents.items() if c not in absent}
        client_of = {node: client for client, node in self.nodes.items()}
        self._push_probes()
        answers = self._send(by_node, kind, group)
        for node, why in answers.failures.items():
            failures[client_of[node]] = why
            LOG.warning("%s %s: client %d dropped (%s)", kind, group, client_of[node], why)
        for node, how in answers.silent.items():
            self.lost[client_of[node]] = f"its SuperNode {how}; not waited for since"
        return {client_of[node]: reply for node, reply in answers.replies.items()}

    def _send(self, contents: dict[int, RecordDict], kind: str, group: str) -> Answers:
        """Push one message per node and pull replies until all arrived or the deadline passed; pending probes are
        collected on the way, never waited for."""
        messages = [Message(content, dst_node_id=node, message_type=kind, group_id=group) for node, content in
                    contents.items()]
        answers = Answers()
        node_of: dict[str, int] = {}
        for message_id, node in zip(_pushed(self.grid, messages), contents, strict=True):
            if message_id:
                node_of[message_id] = node
            else:
                answers.failures[node] = "the SuperLink refused the message"
        if self.on_pushed:
            self.on_pushed(kind, group)
        deadline = time.monotonic() + self.round_timeout
        pending = set(node_of)
        began = time.monotonic()
        while True:
            for reply in _pulled(self.grid, pending | set(self.probes)):
                message_id = reply.metadata.reply_to_message_id
                if message_id in self.probes:
                    self._probe_answered(message_id, reply)
                elif message_id in pending:
                    pending.discard(message_id)
                    self._record(answers, node_of[message_id], reply)
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(pull_wait(time.monotonic() - began))
        for message_id in pending:
            answers.failures[node_of[message_id]] = f"no reply within {self.round_timeout:g} s"
            answers.silent[node_of[message_id]] = f"gave no reply in {self.stage} within {self.round_timeout:g} s"
        return answers

    def _record(self, answers: Answers, node: int, reply: Message) -> None:
        """File one reply: good, an error, or the SuperLink's word that the node is offline (silent). Other errors
        (the ClientApp raised, a simulated dropout) come from a live node, which stays in the run."""
        if not reply.has_error():
            answers.replies[node] = reply
            return
        answers.failures[node] = f"error {reply.error.code}: {reply.error.reason}"
        if reply.error.code == ErrorCode.NODE_UNAVAILABLE:
            answers.silent[node] = f"went offline in {self.stage} (the SuperLink missed its heartbeats)"


def pull_wait(age: float) -> float:
    """The wait before the next poll for replies in a round `age` seconds old: `PULL_WAIT_SHARE` of its age, at least
    `SHORTEST_PULL_WAIT` and at most `PULL_INTERVAL`. Replies are then picked up at most 5 % late (or 1 ms), with
    about 70 polls in a round's first 0.2 s and one every `PULL_INTERVAL` after 4 s. A fixed 0.2 s held a 30-client
    round of the bench's workload on Flower's simulation to 0.21 or 0.41 s; doubling waits (1, 2, 4 … ms) to
    0.27 s, as replies that come at 0.17 s wait for the poll at 0.255 s."""
    return min(PULL_INTERVAL, max(SHORTEST_PULL_WAIT, PULL_WAIT_SHARE * age))


def _client_of(reply: Message) -> int:
    return int(control_of(reply.content)["client"])


def _pushed(grid: Grid, messages: list[Message]) -> list[str | None]:
    """The message ids of a push, one per message: None where the SuperLink refused one (it returns no ids at all
    when the request is too large)."""
    ids = list(grid.push_messages(messages)) if messages else []
    return ids + [None] * (len(messages) - len(ids))


def _pulled(grid: Grid, message_ids: Iterable[str]) -> list[Message]:
    ids = list(message_ids)
    return list(grid.pull_messages(ids)) if ids else []

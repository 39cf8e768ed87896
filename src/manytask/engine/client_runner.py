"""A client's side of every engine: a payload in (serialized, or in-process a message on the device), a reply out.

The local engine calls it in-process; Flower's ClientApp calls it on a SuperNode. Either way the method's
`ClientProgram` sees the same context, the same seed and the same state, so both engines give the same numbers."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from functools import cached_property

import torch
from torch import Tensor

from manytask.client.trainer import TaskData
from manytask.devices import CPU, on_device, resolve_device
from manytask.engine.adversaries import Adversary
from manytask.engine.resident import ResidentData, ResidentStates
from manytask.errors import ManytaskError
from manytask.execution.batched import run_batched
from manytask.execution.budget import batches, default_budget
from manytask.execution.plan import NothingToBatch, Unbatchable
from manytask.experiment import Experiment
from manytask.messages import Message, Sent, as_message
from manytask.methods.base import ClientContext, Metrics
from manytask.methods.client_state import StateSchema
from manytask.seeding import derive_seed, derive_seeds, seed_global_rng

ClientState = dict[str, Tensor]


class ClientRunner:
    def __init__(self, experiment: Experiment) -> None:
        self.exp = experiment
        torch.set_num_threads(experiment.config.threads)  # this may be a fresh process (a Flower ClientApp)
        self.program = experiment.client_program()
        self.notices: set[str] = set()  # why clients could not be batched, each told once
        self.device = self._device(resolve_device(experiment.config.device))
        gigabytes = experiment.config.memory_budget_gb
        self.budget = default_budget(self.device) if gigabytes is None else int(gigabytes * 2**30)
        # a quarter of the budget each for the data and the client states kept on the device between calls
        self.data = ResidentData(experiment.client_data, experiment.test_data, self.device, self.budget // 4)
        self.states = ResidentStates(self.device, self.budget // 4)
        attack = experiment.config.adversaries
        self.adversary = None if attack is None else Adversary(attack, experiment.adversary_clients,
                                                               experiment.config.seed)

    def fit(
        self, client: int, round_index: int, payload: Sent | None, state: ClientState
    ) -> tuple[Sent | None, float]:
        """Train one client for one round; returns (its reply or None, compute seconds): the reply message itself,
        or the bytes a simulated adversary sends instead (`as_bytes` gives what crosses a process either way).

        `state` is edited in place; the caller keeps it until the client's next call."""
        seed = derive_seed(self.exp.config.seed, "client", round_index, client)
        ctx = self._context(client, round_index, state, seed)
        began = time.perf_counter()
        received = _decoded(payload)
        reply = self.program.fit(ctx, received)
        seconds = time.perf_counter() - began
        self._keep(client, state)
        return self._upload(client, round_index, received, reply), seconds

    def fit_many(
        self, clients: list[int], round_index: int, payloads: Mapping[int, Sent | None],
        states: Mapping[int, ClientState],
    ) -> dict[int, tuple[Sent | None, float]]:
        """`fit` of every client in `clients`: their plans run as batched computations of at most `vector_clients`
        where the program makes plans (each client is credited an equal share of its computation's seconds), else
        one after another with a one-line notice per reason."""
        if not clients:  # every sampled client dropped: the round loop says so in one sentence
            return {}
        per = self.exp.config.vector_clients
        if len(clients) > per:
            return {c: result for start in range(0, len(clients), per)
                    for c, result in self.fit_many(clients[start : start + per], round_index, payloads, states).items()}
        seeds = derive_seeds([(self.exp.config.seed, "client", round_index, c) for c in clients])
        ctxs = [self._context(c, round_index, states[c], seed) for c, seed in zip(clients, seeds, strict=True)]
        began = time.perf_counter()
        received = _decoded_once([payloads[c] for c in clients])
        try:
            made = self.program.plan_many(ctxs, received)
            plans = [plan for entry in made for plan in (entry if isinstance(entry, list) else [entry])]
            groups = batches(plans, self.budget)
            if len(groups) > 1:
                self._notice(f"the memory budget of {self.budget / 2**30:.1f} GB holds {len(groups[0])} of its "
                             f"{len(plans)} models at once, so they train in {len(groups)} batched computations",
                             "batches")
            results = iter([result for group in groups for result in run_batched([plans[i] for i in group])])
        except Unbatchable as why:
            if self.exp.config.execution == "vectorized" and not isinstance(why, NothingToBatch):
                raise ManytaskError(f"{self.exp.label}: execution vectorized cannot batch this round's clients: {why}; "
                                    "use execution: auto to train them one after another instead.") from None
            self._notice(str(why))
            return {c: self.fit(c, round_index, payloads[c], states[c]) for c in clients}
        # each client's results as it made its plans: one result, or a list for a list of plans (one per copy)
        outcomes = [[next(results) for _ in entry] if isinstance(entry, list) else next(results) for entry in made]
        replies = self.program.conclude_many(ctxs, received, made, outcomes)
        seconds = (time.perf_counter() - began) / len(clients)
        for client in clients:
            self._keep(client, states[client])
        return {c: (self._upload(c, round_index, p, r), seconds)
                for c, p, r in zip(clients, received, replies, strict=True)}

    def _upload(self, client: int, round_index: int, payload: Message | None, reply: Message | None) -> Sent | None:
        """What the client sends: its reply, corrupted where it is a simulated adversary."""
        if reply is None or self.adversary is None:
            return reply
        return self.adversary.upload(client, round_index, payload, reply)

    def _device(self, device: torch.device) -> torch.device:
        """`device` where the program can train there; the CPU, with a notice, where it cannot yet."""
        if device == CPU:
            return CPU
        if not self.program.supports_device:
            print(f"{self.exp.label}: trains its clients on the CPU; its client program has no {device.type} "
                  "support yet", file=sys.stderr)
            return CPU
        self.program.to_device(device)
        return device

    def _notice(self, reason: str, how: str = "one after another") -> None:
        if reason not in self.notices:
            self.notices.add(reason)
            print(f"{self.exp.label}: execution {self.exp.config.execution} trains these clients {how}: {reason}",
                  file=sys.stderr)

    def evaluate(self, client: int, payload: Sent | None, state: ClientState, test: TaskData | None = None) -> Metrics:
        """The client's own model on the test sets of the tasks it holds (or on `test`, keyed by its tasks: another
        client's data, for a cross-evaluation)."""
        ctx = self._context(client, self.exp.total_rounds, state, derive_seed(self.exp.config.seed, "eval", client))
        test = self.data.test(self.exp.federation.tasks_of(client)) if test is None else on_data(test, self.device)
        metrics = self.program.evaluate(ctx, _decoded(payload), test)
        self._keep(client, state)
        return metrics

    @cached_property
    def schema(self) -> StateSchema:
        return self.program.state_schema()

    def check_states(self, states: Mapping[int, ClientState]) -> None:
        """`UnknownState` where a client's state holds a key the program does not declare (a checkpoint's)."""
        for state in states.values():
            self.schema.check(state)

    def _keep(self, client: int, state: ClientState) -> None:
        """After a call: the state checked against the program's schema and left on the device while the resident
        states fit (a checkpoint copies it to the host as it writes)."""
        self.schema.check(state)
        self.states.keep(client, state)

    def _context(self, client: int, round_index: int, state: ClientState, seed: int) -> ClientContext:
        seed_global_rng(seed)  # programs that draw from torch's global RNG stay reproducible too
        self.schema.check(state)
        state.update(on_device(state, self.device))
        return ClientContext(client, round_index, self.data.client(client), state, seed)


def on_data(data: TaskData, device: torch.device) -> TaskData:
    return {task: (x.to(device), y.to(device)) for task, (x, y) in data.items()}


def _decoded(payload: Sent | None) -> Message | None:
    return None if payload is None else as_message(payload)


def _decoded_once(payloads: list[Sent | None]) -> list[Message | None]:
    """Each payload decoded, the same bytes object once (the engine sends one object to every client of a task set;
    client programs only read what they are sent)."""
    decoded: dict[int, Message | None] = {}
    for payload in payloads:
        if id(payload) not in decoded:
            decoded[id(payload)] = _decoded(payload)
    return [decoded[id(payload)] for payload in payloads]

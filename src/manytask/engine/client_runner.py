"""A client's side of every engine: serialized payload in, serialized reply out.

The local engine calls it in-process; Flower's ClientApp calls it on a SuperNode. Either way the method's
`ClientProgram` sees the same context, the same seed and the same state, so both engines give the same numbers."""

from __future__ import annotations

import time
from collections import OrderedDict

import torch
from torch import Tensor

from manytask.client.trainer import TaskData
from manytask.experiment import Experiment
from manytask.messages import decode, encode
from manytask.methods.base import ClientContext, Metrics
from manytask.seeding import derive_seed, seed_global_rng

ClientState = dict[str, Tensor]
CACHED_CLIENTS = 1024  # clients whose training tensors stay materialized: memory is bounded, not ∝ the federation


class ClientRunner:
    def __init__(self, experiment: Experiment) -> None:
        self.exp = experiment
        torch.set_num_threads(experiment.config.threads)  # this may be a fresh process (a Flower ClientApp)
        self.program = experiment.client_program()
        self._data: OrderedDict[int, TaskData] = OrderedDict()  # the most recently asked-for clients' data

    def fit(
        self, client: int, round_index: int, payload: bytes | None, state: ClientState
    ) -> tuple[bytes | None, float]:
        """Train one client for one round; returns (serialized reply or None, compute seconds).

        `state` is edited in place; the caller keeps it until the client's next call."""
        seed = derive_seed(self.exp.config.seed, "client", round_index, client)
        ctx = self._context(client, round_index, state, seed)
        began = time.perf_counter()
        reply = self.program.fit(ctx, None if payload is None else decode(payload))
        seconds = time.perf_counter() - began
        return (None if reply is None else encode(reply)), seconds

    def evaluate(self, client: int, payload: bytes | None, state: ClientState) -> Metrics:
        """The client's own model on the test sets of the tasks it holds."""
        ctx = self._context(client, self.exp.total_rounds, state, derive_seed(self.exp.config.seed, "eval", client))
        test = self.exp.test_data(self.exp.federation.tasks_of(client))
        return self.program.evaluate(ctx, None if payload is None else decode(payload), test)

    def _context(self, client: int, round_index: int, state: ClientState, seed: int) -> ClientContext:
        seed_global_rng(seed)  # programs that draw from torch's global RNG stay reproducible too
        data = self._data.pop(client, None)
        if data is None:
            data = self.exp.client_data(client)
        self._data[client] = data  # most recent last
        if len(self._data) > CACHED_CLIENTS:
            self._data.pop(next(iter(self._data)))
        return ClientContext(client, round_index, data, state, seed)

"""Parallel clients for the local engine (`workers: N`): a round's clients trained in N worker processes.

Each worker builds the same `Experiment` from the run's config (the benchmark, federation and programs are
deterministic in it) and runs clients with the one `ClientRunner`. What crosses between processes is what crosses
the wire anyway: serialized payloads and replies, plus each client's state serialized the same way, kept by the
main process (so checkpoints and resume are the local engine's). A client's result depends only on its payload,
state, seed and round, never on which worker ran it or when, so N workers give one process's numbers.

With `execution: auto` (or `vectorized`) each worker takes a share of the round's clients, balanced by their data,
and trains it as the in-process engine does: batched where the program makes plans, in computations of at most
`vector_clients`. A client's numbers then equal its sequential ones within the batched executor's tolerance (as in
one process), not bit for bit, since a batched computation's sums depend on the clients batched with it.
Processes are spawned, not forked: a forked child of a process that has used torch's thread pools can deadlock.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from types import TracebackType
from typing import Any

from manytask.config import validate
from manytask.engine.client_runner import ClientRunner, ClientState
from manytask.engine.heap import retain_freed_memory
from manytask.engine.loop import FitOutcome, Payloads, RoundLoop, RoundObserver
from manytask.errors import ManytaskError
from manytask.experiment import Experiment
from manytask.messages import Message, Sent, as_bytes, decode, encode
from manytask.methods.base import Metrics
from manytask.rundir import RunDir

_runner: ClientRunner | None = None  # the worker process's runner, built once by `_start_worker`
_refusal: str | None = None  # why the worker must not train: its data differ from the main process's


def _start_worker(config: dict[str, Any], fingerprint: str) -> None:
    global _runner, _refusal
    retain_freed_memory()  # a worker's rounds allocate like the main process's (`engine/heap.py`)
    experiment = Experiment.build(validate(config))
    if experiment.data_fingerprint != fingerprint:  # an unseeded benchmark draws other data in every process
        _refusal = (f"a worker process built other data than the main process (data fingerprint "
                    f"{experiment.data_fingerprint}, not {fingerprint}): the benchmark is not deterministic in the "
                    "config (draw its data from the seed it is given), so run it with workers: 1.")
    _runner = ClientRunner(experiment)


def _worker() -> ClientRunner:
    assert _runner is not None, "worker used before its initializer ran"
    if _refusal is not None:
        raise ManytaskError(_refusal)
    return _runner


def _bytes(payload: Sent | None) -> bytes | None:
    """A payload as the bytes a worker process receives."""
    return None if payload is None else as_bytes(payload)


def pack_state(state: ClientState) -> bytes:
    return encode(Message.from_tensors(state))


def unpack_state(data: bytes) -> ClientState:
    return {k: v.clone() for k, v in decode(data).tensors().items()}


def _fit(client: int, round_index: int, payload: bytes | None, state: bytes) -> tuple[bytes | None, float, bytes]:
    held = unpack_state(state)
    reply, seconds = _worker().fit(client, round_index, payload, held)
    return None if reply is None else as_bytes(reply), seconds, pack_state(held)


def _fit_many(clients: list[int], round_index: int, payloads: dict[int, bytes | None], states: dict[int, bytes]
              ) -> dict[int, tuple[bytes | None, float, bytes]]:
    """A worker's share of a batched round (`ClientRunner.fit_many`)."""
    held = {c: unpack_state(states[c]) for c in clients}
    results = _worker().fit_many(clients, round_index, payloads, held)
    return {c: (None if reply is None else as_bytes(reply), seconds, pack_state(held[c]))
            for c, (reply, seconds) in results.items()}


def shares(clients: list[int], work: dict[int, int], count: int) -> list[list[int]]:
    """`clients` in `count` shares of about equal work (largest first, each to the lightest share), each sorted."""
    loads, parts = [0] * count, [[] for _ in range(count)]
    for client in sorted(clients, key=lambda c: (-work.get(c, 0), c)):
        lightest = loads.index(min(loads))
        parts[lightest].append(client)
        loads[lightest] += work.get(client, 0)
    return [sorted(part) for part in parts if part]


def _evaluate(client: int, payload: bytes | None, state: bytes) -> Metrics:
    return _worker().evaluate(client, payload, unpack_state(state))


class ProcessPoolTransport:
    """The in-process transport's contract, with clients spread over `workers` spawned processes."""

    def __init__(self, experiment: Experiment, workers: int) -> None:
        config = experiment.config.model_dump(mode="json")
        self.pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_start_worker,
                                        initargs=(config, experiment.data_fingerprint))
        self.workers = workers
        self.batched = experiment.config.execution != "sequential"  # each worker batches its share of a round
        self.states: dict[int, ClientState] = {}
        self.work = {c: sum(tasks.values()) for c, tasks in experiment.federation.sizes().items()}
        self.experiment = experiment

    def fit(self, round_index: int, payloads: Payloads, simulated_drops: set[int]) -> FitOutcome:
        outcome = FitOutcome()
        outcome.failures.update({c: "simulated dropout" for c in payloads if c in simulated_drops})
        if self.batched:
            self._fit_batched(round_index, payloads, [c for c in payloads if c not in simulated_drops], outcome)
            return outcome
        futures = {}
        # largest clients first: idle workers take the small ones last, so the round ends with the workers level
        for client in sorted((c for c in payloads if c not in simulated_drops), key=lambda c: -self.work.get(c, 0)):
            state = pack_state(self.states.get(client, {}))
            futures[client] = self.pool.submit(_fit, client, round_index, _bytes(payloads[client]), state)
        for client, future in futures.items():
            reply, seconds, state = future.result()
            outcome.replies[client], outcome.seconds[client] = reply, seconds
            self.states[client] = unpack_state(state)
        return outcome

    def _fit_batched(self, round_index: int, payloads: Payloads, clients: list[int], outcome: FitOutcome) -> None:
        """Each worker trains its share of the round's clients as batched computations."""
        futures = []
        for share in shares(clients, self.work, self.workers):
            states = {c: pack_state(self.states.get(c, {})) for c in share}
            sent = {c: _bytes(payloads[c]) for c in share}
            futures.append(self.pool.submit(_fit_many, share, round_index, sent, states))
        for future in futures:
            for client, (reply, seconds, state) in future.result().items():
                outcome.replies[client], outcome.seconds[client] = reply, seconds
                self.states[client] = unpack_state(state)

    def evaluate(self, payloads: Payloads) -> dict[int, Metrics]:
        futures = {c: self.pool.submit(_evaluate, c, _bytes(p), pack_state(self.states.get(c, {})))
                   for c, p in payloads.items()}
        return {c: future.result() for c, future in futures.items()}

    def client_states(self) -> dict[int, ClientState]:
        return self.states

    def restore_client_states(self, states: dict[int, ClientState]) -> None:
        """The checkpoint's client states, checked here against the program's schema (the workers check them too,
        at every call) so that a state of another method stops the run before any round."""
        schema = self.experiment.client_program().state_schema()
        for state in states.values():
            schema.check(state)
        self.states = states

    def __enter__(self) -> ProcessPoolTransport:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.pool.shutdown(cancel_futures=True)


def run_with_workers(
    experiment: Experiment, run_dir: RunDir, observer: RoundObserver | None, stop_after: int | None
) -> dict[str, Any] | None:
    """The local engine's round loop with clients trained in `workers` processes."""
    with ProcessPoolTransport(experiment, experiment.config.workers) as transport:
        return RoundLoop(experiment, run_dir, transport, observer).run(stop_after)

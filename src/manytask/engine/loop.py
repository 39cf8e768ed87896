"""The engine-independent round loop: sampling, dropouts, serialization, aggregation, evaluation, metrics,
checkpoints and the summary. Engines differ only in their `Transport`: how payloads reach clients."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from manytask.devices import CPU, on_device
from manytask.engine.checkpoint import Checkpoint, checkpoint_error, identity_of, load_checkpoint
from manytask.engine.checkpoint_writer import CheckpointWriter
from manytask.engine.client_runner import ClientState
from manytask.engine.heap import settled_heap
from manytask.engine.sampling import clients_per_round, sample_clients, sample_dropouts
from manytask.engine.screening import DIVERGED, screen
from manytask.errors import ManytaskError, clipped
from manytask.experiment import Experiment
from manytask.fairness import fairness
from manytask.messages import Message, Sent, encode, sent_size, snapshot
from manytask.methods.base import Metrics
from manytask.rundir import RunDir
from manytask.summary import average_main_metric, build_summary
from manytask.tasks.predictions import recording_predictions

Payloads = dict[int, Sent | None]


@dataclass
class FitOutcome:
    """What came back from one round of fitting."""

    replies: dict[int, Sent | None] = field(default_factory=dict)  # client -> reply (None: replied, sent nothing)
    seconds: dict[int, float] = field(default_factory=dict)  # client -> compute seconds
    failures: dict[int, str] = field(default_factory=dict)  # client -> why it did not reply


class Transport(Protocol):
    """How an engine reaches its clients."""

    def fit(self, round_index: int, payloads: Payloads, simulated_drops: set[int]) -> FitOutcome:
        """Deliver every payload; clients in `simulated_drops` receive theirs but fail before replying."""

    def evaluate(self, payloads: Payloads) -> dict[int, Metrics]:
        """Client-side evaluation; clients that fail are left out."""

    def client_states(self) -> dict[int, ClientState]:
        """Client states the engine can checkpoint (empty where clients keep their own)."""

    def restore_client_states(self, states: dict[int, ClientState]) -> None: ...


class RoundObserver(Protocol):
    """Progress display hook: told when a run starts and after every round."""

    def started(self, label: str, total_rounds: int, done_rounds: int) -> None: ...

    def finished_round(self, row: dict[str, Any]) -> None: ...

PREDICTION_EXAMPLES = 4  # test images per dense task kept for the report's picture grid


def _serialize(messages: Mapping[int, Message | None]) -> Payloads:
    """Each client's message as it is sent: its bytes, or, for a message whose arrays lie on the device, a snapshot
    on the device (`snapshot`). Either way a client reads what the server held when it sent, and no client write
    reaches the server's state. One message object sent to several clients is encoded (or copied) once; every
    client still gets, and is counted, its own message."""
    sent: dict[int, Sent] = {}
    payloads: Payloads = {}
    for client, message in messages.items():
        if message is None:
            payloads[client] = None
            continue
        if id(message) not in sent:
            sent[id(message)] = snapshot(message) if message.on_device() else encode(message)
        payloads[client] = sent[id(message)]
    return payloads


def _sizes(payloads: Mapping[int, Sent | None]) -> dict[str, int]:
    return {str(c): 0 if p is None else sent_size(p) for c, p in payloads.items()}


class RoundFailed(ManytaskError):
    """A round that could not complete (too few usable replies). The loop writes the summary of the rounds that did
    before raising it, so the run's results are not lost."""


class RoundLoop:
    def __init__(
        self, experiment: Experiment, run_dir: RunDir, transport: Transport, observer: RoundObserver | None = None,
        server_device: torch.device = CPU, started_at: float | None = None,
    ) -> None:
        self.exp = experiment
        # when the engine began starting (`time.perf_counter()`; Ray, a ServerApp, the handshake): the time until the
        # first round is part of the run's wall time, once
        self.started_at = started_at
        self.run_dir = run_dir
        self.transport = transport
        self.observer = observer
        torch.set_num_threads(experiment.config.threads)  # this may be a fresh process (a Flower ServerApp)
        self.server = experiment.server_program()
        # where the server's state lies and it aggregates: in-process, the clients' device where the server can
        # aggregate there (replies then stay on it); else the host, where replies are brought
        self.server_device = server_device if self.server.supports_device else CPU
        self.checkpoint_seconds = 0.0  # this process's rounds spent waiting for their checkpoints
        self._checkpoints = CheckpointWriter(experiment.config.checkpoint_background)
        self._stopped_at: tuple[int, float] | None = None  # (rounds done, wall seconds) where `run` last stopped

    def run(self, stop_after: int | None = None, *, going_on: bool = False) -> dict[str, Any] | None:
        """Run (or continue) to the configured number of rounds; return the summary, or None if stopped
        early at `stop_after` completed rounds (as a crash would). The last checkpoint is on disk when it returns,
        but with `going_on` (the caller runs this loop on, as the bench does between timed rounds): its write then
        overlaps the next round, as every other round's does."""
        try:
            with settled_heap():
                return self._run(stop_after)
        finally:
            if not going_on:
                self.wait_for_checkpoint()

    def _run(self, stop_after: int | None) -> dict[str, Any] | None:
        from manytask import energy  # the meter: looked up per run, so tests can patch energy.available_meter

        total = self.exp.total_rounds
        # a loop stopped at `stop_after` goes on from its own state; a fresh one, from the checkpoint on disk
        start, elapsed = self._stopped_at or self._restore()
        if self.started_at is not None:
            elapsed, self.started_at = elapsed + time.perf_counter() - self.started_at, None
        self._stopped_at = None
        meter = energy.available_meter()  # None without a readable meter: the summary then estimates energy
        if self.observer:
            self.observer.started(self.exp.label, total, start)
        for round_index in range(start, total):
            began = time.perf_counter()
            if meter is not None:
                meter.start()
            try:
                row = self._round(round_index)
            except RoundFailed as failure:
                self._write_stopped_summary(round_index, elapsed, str(failure))
                raise
            if round_index + 1 == total:
                row.update(self._final_evaluation())
            elif (round_index + 1) % self.exp.config.eval_every == 0:
                row.update(self._evaluate())
            row["wall_seconds"] = time.perf_counter() - began
            row.update(energy.reading(meter))  # energy_joules, energy_source: recorded only, never fed back
            elapsed += row["wall_seconds"]
            self.run_dir.append_metrics(row)
            if (round_index + 1) % self.exp.config.checkpoint_every == 0 or round_index + 1 == total:
                self._checkpoint(round_index + 1, elapsed)
            if self.observer:
                self.observer.finished_round(row)
            if stop_after is not None and round_index + 1 >= stop_after and round_index + 1 < total:
                self._stopped_at = round_index + 1, elapsed
                return None
        self.wait_for_checkpoint()  # a summary stands beside the last round's checkpoint, never before it
        summary = build_summary(self.exp, self.run_dir.read_metrics(), elapsed)
        self.run_dir.write_json(self.run_dir.summary, summary)
        return summary

    def _round(self, round_index: int) -> dict[str, Any]:
        config = self.exp.config
        num_clients = self.exp.federation.num_clients
        count = clients_per_round(num_clients, config.participation, config.clients_per_round)
        sampled = self._participants(round_index, sample_clients(config.seed, round_index, num_clients, count))
        simulated = sample_dropouts(config.seed, round_index, sampled, config.dropout)
        payloads = _serialize(self.server.configure_fit(round_index, sampled))
        outcome = self.transport.fit(round_index, payloads, simulated)
        # client order: reproducible sums
        received = {c: self._where_server_is(outcome.replies[c]) for c in sorted(outcome.replies)}
        replies, rejected = screen(received, self.server, self.exp.federation)
        replies = {c: None if r is None else r.on(self.server_device) for c, r in replies.items()}
        for client, reason in rejected.items():  # aggregated as a dropout: a bad reply must not poison the model
            del outcome.replies[client]
            outcome.failures[client] = reason
        self._check_enough(round_index, len(sampled), outcome)
        fit_metrics = self.server.aggregate_fit(round_index, replies)
        return {
            "round": round_index + 1,
            "sampled": sampled,
            "dropped": sorted(set(sampled) - set(outcome.replies)),
            "failures": {str(c): why for c, why in sorted(outcome.failures.items())},
            "bytes_up": _sizes(received),
            "bytes_down": _sizes(payloads),
            "client_seconds": {str(c): s for c, s in sorted(outcome.seconds.items())},
            "fit": fit_metrics,
        }

    def _write_stopped_summary(self, round_index: int, elapsed: float, reason: str) -> None:
        """The summary of the rounds before `round_index`, with the model as it stands evaluated now, marked as
        stopped there (`RunDir.is_finished` is then false, so the run can still be resumed)."""
        summary = build_summary(self.exp, self.run_dir.read_metrics(), elapsed, self._final_evaluation())
        summary["stopped"] = {"round": round_index + 1, "rounds_completed": round_index, "reason": reason}
        self.run_dir.metrics.touch()  # a run stopped in its first round has no rows, but is a run directory
        self.run_dir.write_json(self.run_dir.summary, summary)

    def _participants(self, round_index: int, sampled: list[int]) -> list[int]:
        """The engine's sample, or the clients the server asks for instead (sorted, each once)."""
        chosen = self.server.participants(round_index, list(sampled))
        clients = self.exp.federation.num_clients
        unknown = sorted(set(chosen) - set(range(clients)))
        if unknown:
            raise ManytaskError(f"round {round_index + 1}: the server asked for clients {unknown}, which this "
                                f"{clients}-client federation does not have.")
        if not chosen:
            raise ManytaskError(f"round {round_index + 1}: the server asked for no clients.")
        return sorted(set(chosen))

    def _check_enough(self, round_index: int, sampled: int, outcome: FitOutcome) -> None:
        needed = min(self.exp.config.min_replies, sampled)
        if len(outcome.replies) < needed:
            raise RoundFailed(f"round {round_index + 1} failed: {len(outcome.replies)} of {sampled} sampled clients "
                              f"replied, fewer than min_replies={needed} "
                              f"({_grouped(outcome.failures)}){_advice(outcome.failures)}.")

    def _evaluate(self) -> dict[str, Any]:
        """Per-task metrics (server-side, else averaged over holders), the average, and per-client scores:
        each client's mean main metric over the tasks it holds (its own model's, or the server's per task)."""
        metrics = self.server.evaluate(self.exp.test_data())
        scored_by = "server" if metrics is not None else "clients"  # whose models the per-client scores are
        if metrics is None:
            per_client = self._evaluate_on_clients()
            metrics = _average_over_holders(per_client, self.exp.benchmark.task_names)
        else:
            per_client = {c: {t: metrics[t] for t in self.exp.federation.tasks_of(c)}
                          for c in range(self.exp.federation.num_clients)}
        main = {t: self.exp.setup.specs[t].main_metric for t in metrics}
        clients = {str(c): average_main_metric(m, main) for c, m in sorted(per_client.items()) if m}
        return {"eval": metrics, "average": average_main_metric(metrics, main), "clients": clients,
                "fairness": fairness(list(clients.values())), "clients_scored_by": scored_by}

    def _final_evaluation(self) -> dict[str, Any]:
        """The last evaluation, keeping a few test predictions of each dense task for the report's picture grid."""
        with recording_predictions(PREDICTION_EXAMPLES) as recorder:
            row = self._evaluate()
        if recorder.examples:
            self.run_dir.write_tensors(self.run_dir.predictions, recorder.flat())
        return row

    def _evaluate_on_clients(self) -> dict[int, Metrics]:
        """Every client evaluates its own model on the test sets of the tasks it holds."""
        clients = list(range(self.exp.federation.num_clients))
        return self.transport.evaluate(_serialize(self.server.configure_evaluate(clients)))

    def _checkpoint(self, rounds_done: int, elapsed: float) -> None:
        began = time.perf_counter()
        checkpoint = Checkpoint(
            rounds_done, self.server.state_dict(), self.transport.client_states(), {"elapsed": elapsed},
            torch.get_rng_state(), identity_of(self.exp),
        )
        self._checkpoints.save(self.run_dir.checkpoint, checkpoint)  # written while the next round trains
        self.checkpoint_seconds += time.perf_counter() - began

    def wait_for_checkpoint(self) -> None:
        """Return once the last checkpoint is on disk (the time counts as the checkpoint's)."""
        began = time.perf_counter()
        try:
            self._checkpoints.wait()
        finally:
            self.checkpoint_seconds += time.perf_counter() - began

    def _restore(self) -> tuple[int, float]:
        """Load the checkpoint if there is one: (rounds already done, wall seconds already spent). Metric rows
        written after it (a crash between a round's row and its checkpoint), and stray temporaries, are removed.
        A checkpoint that cannot be read, is corrupt, belongs to another run or does not fit this run's method
        stops the run with one sentence (`load_checkpoint`) before anything in the run directory changes."""
        path = self.run_dir.checkpoint
        if not path.exists():
            self.run_dir.remove_temporaries()
            self.run_dir.truncate_metrics(0)
            self._place_server()
            return 0, 0.0
        checkpoint = load_checkpoint(path, identity_of(self.exp))
        try:
            self.server.load_state_dict(checkpoint.server)
            self.transport.restore_client_states(checkpoint.clients)
            if checkpoint.torch_rng is not None:
                torch.set_rng_state(checkpoint.torch_rng)
        except (KeyError, IndexError, RuntimeError, TypeError, ValueError) as err:
            raise checkpoint_error(path, f"its state does not fit method {self.exp.label}: "
                                         f"{clipped(' '.join(str(err).split()))}") from None
        self.run_dir.remove_temporaries()
        self.run_dir.truncate_metrics(checkpoint.round)
        self._place_server()
        return checkpoint.round, float(checkpoint.extra.get("elapsed", 0.0))

    def _where_server_is(self, reply: Sent | None) -> Sent | None:
        """A reply kept on the device, brought to the host for a server that aggregates there (the replies that
        pass screening are all brought where the server is: a decoded one to its device)."""
        return reply.on_host() if self.server_device == CPU and isinstance(reply, Message) else reply

    def _place_server(self) -> None:
        """The server's state (all of it is in its checkpoint) moved to `server_device`, once per run: its
        aggregation then runs there, on replies that never left it."""
        if self.server_device != CPU:
            self.server.load_state_dict(on_device(self.server.state_dict(), self.server_device))


def _grouped(failures: Mapping[int, str], shown: int = 3) -> str:
    """Failures grouped by reason, the most common first: "10 clients: reply has non-finite values (...)"."""
    by_reason: dict[str, list[int]] = {}
    for client, why in sorted(failures.items()):
        by_reason.setdefault(why, []).append(client)
    groups = sorted(by_reason.items(), key=lambda item: -len(item[1]))
    parts = [f"client {who[0]}: {why}" if len(who) == 1 else f"{len(who)} clients: {why}" for why, who in groups]
    more = f"; and {len(parts) - shown} other reasons" if len(parts) > shown else ""
    return "; ".join(parts[:shown]) + more if parts else "no reason given"


def _advice(failures: Mapping[int, str]) -> str:
    if failures and all(why == DIVERGED for why in failures.values()):
        return "; training diverged: lower train.lr"
    return ""


def _average_over_holders(per_client: Mapping[int, Metrics], tasks: list[str]) -> Metrics:
    per_task: dict[str, list[Mapping[str, float]]] = {}
    for client in sorted(per_client):
        for task, metrics in per_client[client].items():
            per_task.setdefault(task, []).append(metrics)
    return {task: _mean_metrics(per_task[task]) for task in tasks if task in per_task}


def _mean_metrics(rows: list[Mapping[str, float]]) -> dict[str, float]:
    return {key: sum(r[key] for r in rows) / len(rows) for key in rows[0]}

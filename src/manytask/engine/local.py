"""The local engine: the in-process simulation. A round's clients run in this process, as batched computations where
their methods make plans (`execution: auto`, the default; `execution/batched.py`) or one after another. Payloads are
serialized (once per distinct payload; clients read them as views of the bytes); replies reach the server as the
clients' messages themselves, counted by `encoded_size` (what the serializer would write), which nobody changes
afterwards (tests/test_received_unchanged.py). Client states are checkpointed with the server's, so a stopped run
resumes exactly."""

from __future__ import annotations

from manytask.engine.client_runner import ClientRunner, ClientState
from manytask.engine.loop import FitOutcome, Payloads, RoundLoop, RoundObserver
from manytask.experiment import Experiment
from manytask.methods.base import Metrics
from manytask.rundir import RunDir


class InProcessTransport:
    def __init__(self, runner: ClientRunner, batched: bool = False) -> None:
        self.runner = runner
        self.batched = batched  # the round's clients to the runner's batched computations, else one after another
        self.states: dict[int, ClientState] = {}

    def fit(self, round_index: int, payloads: Payloads, simulated_drops: set[int]) -> FitOutcome:
        outcome = FitOutcome()
        outcome.failures.update({c: "simulated dropout" for c in payloads if c in simulated_drops})
        clients = [c for c in payloads if c not in simulated_drops]
        states = {c: self.states.setdefault(c, {}) for c in clients}
        if self.batched:
            results = self.runner.fit_many(clients, round_index, payloads, states)
        else:
            results = {c: self.runner.fit(c, round_index, payloads[c], states[c]) for c in clients}
        for client, (reply, seconds) in results.items():
            outcome.replies[client], outcome.seconds[client] = reply, seconds
        return outcome

    def evaluate(self, payloads: Payloads) -> dict[int, Metrics]:
        return {c: self.runner.evaluate(c, p, self.states.setdefault(c, {})) for c, p in payloads.items()}

    def client_states(self) -> dict[int, ClientState]:
        return self.states

    def restore_client_states(self, states: dict[int, ClientState]) -> None:
        self.runner.check_states(states)
        self.states = states


def local_engine(experiment: Experiment, run_dir: RunDir, observer: RoundObserver | None = None) -> RoundLoop:
    """The round loop with clients run in-process."""
    config = experiment.config
    runner = ClientRunner(experiment)
    transport = InProcessTransport(runner, batched=config.execution != "sequential")
    return RoundLoop(experiment, run_dir, transport, observer, server_device=runner.device)

"""`HostServer`: the server side every host shares. It holds one `GlobalModel` (`methods/common/global_model.py`),
sends each client the shared parameters and its tasks' heads, reads the replies into `Update`s, lets a plug-in adjust
them (`aggregate_replies`), and runs the host's rule (`aggregate_updates`: FedAvg's average by default; `RuleServer`
in `rules.py` for rules over the mean update). A host differs on the server in `payload_for` (e.g. a lookahead
model), `update_weights` (aggregation weights per parameter), `aggregate_updates`, and named extra state in
`self.parts`, checkpointed with the global model."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from torch import Tensor, nn

from manytask.client.trainer import TaskData, evaluate
from manytask.messages import Message
from manytask.methods.base import Metrics, Setup
from manytask.methods.common.aggregation import fedavg_weights, scaled_step, weighted_average
from manytask.methods.common.global_model import GlobalModel, GlobalModelServer
from manytask.methods.common.personal import check_shared_head
from manytask.methods.common.updates import Update, is_parameter
from manytask.methods.common.wire import mean_train_losses
from manytask.methods.hosts.base import HostModel, HostParams
from manytask.models.multitask import ROLE_HEAD_PREFIX, is_buffer, load_state, state_keys, to_task, trainable_state

Adjust = Callable[[int, list[Update]], list[Update]]
Rule = Callable[[int, list[Update]], dict[str, float]]  # (round, updates) -> logs; moves the global model


class HostServer(HostModel, GlobalModelServer[HostParams]):
    """Keeps one global model (`GlobalModel`); sends each client the shared parameters and the heads of its tasks;
    aggregates the replies' updates with FedAvg's weights (the host's rule may differ: `aggregate_updates`)."""

    def __init__(self, setup: Setup, params: HostParams) -> None:
        super().__init__(setup, params)
        self.keeps_local = bool(self.local_keys(state_keys(self.build_model()[0])))  # then clients evaluate
        self.model = GlobalModel(setup, self.initial_state(), params.guard)
        self.parts: dict[str, dict[str, Tensor]] = {}  # named server state beyond the global model

    @property
    def sent(self) -> dict[int, dict[str, Tensor]]:
        """What each client was sent this round."""
        return self.model.sent

    @sent.setter
    def sent(self, sent: dict[int, dict[str, Tensor]]) -> None:
        self.model.sent = sent

    def initial_state(self) -> dict[str, Tensor]:
        """The global model before round 1; in role form (`Setup.common_start`) when every client shares one
        head."""
        if self.params.shared_head:
            check_shared_head(self.setup)
            return self.setup.common_start()
        state = trainable_state(self.build_model()[0])
        local = self.local_keys(list(state))
        return {k: v for k, v in state.items() if k not in local}

    def update_weights(self, client: int, keys: list[str], sizes: dict[str, int]) -> dict[str, float | Tensor]:
        """A copy's aggregation weight per parameter: FedAvg's (task size for a head, total size otherwise)."""
        return fedavg_weights(keys, sizes)

    def read_updates(self, replies: Mapping[int, Message]) -> list[Update]:
        """Every trained copy in the replies, with the host's `update_weights`."""
        return self.model.read_updates(replies, self.update_weights)

    def aggregate_fit(self, round_index: int, replies: Mapping[int, Message | None]) -> dict[str, float]:
        return self.aggregate_replies(round_index, replies)

    def aggregate_replies(
        self, round_index: int, replies: Mapping[int, Message | None], adjust: Adjust | None = None,
        rule: Rule | None = None,
    ) -> dict[str, float]:
        """Read the replies' updates, let `adjust` (a plug-in) change them, run `rule` (the host's own,
        `aggregate_updates`, unless a plug-in replaces it) and scale its step by `server_lr`; log the clients'
        training losses and whatever the rule logs."""
        received = {c: r for c, r in replies.items() if r is not None}
        if not received:
            return {}
        updates = self.read_updates(received)
        if adjust is not None:
            updates = adjust(round_index, updates)
        before = dict(self.global_state) if self.step_scale != 1 else {}
        log = (rule or self.aggregate_updates)(round_index, updates)
        if before:
            moved = {k: v for k, v in self.global_state.items() if v is not before.get(k) and is_parameter(k, v)}
            self.global_state.update(scaled_step(before, moved, self.step_scale))
        self.model.changed()
        return {**mean_train_losses(list(received.values())), **log}

    @property
    def step_scale(self) -> float:
        """η_s of the server step control (`server_lr`)."""
        return self.params.server_lr

    def aggregate_updates(self, round_index: int, updates: list[Update]) -> dict[str, float]:
        """The host's rule; here FedAvg (`average_updates`)."""
        return self.average_updates(round_index, updates)

    def average_updates(self, round_index: int, updates: list[Update]) -> dict[str, float]:
        """FedAvg (`GlobalModel.average`): θ ← Σ_n w_n θ_n / Σ_n w_n = θ + Σ_n w_n Δ_n / Σ_n w_n per parameter."""
        self.model.average(updates)
        return {}

    def average_buffers(self, updates: list[Update]) -> None:
        """Buffers (BN statistics) take FedAvg's weighted average, whatever rule a host applies to parameters."""
        buffers = [{k: v for k, v in u.trained.items() if is_buffer(k)} for u in updates]
        self.global_state.update(weighted_average(buffers, [u.weights for u in updates]))

    def evaluate(self, test: TaskData) -> Metrics | None:
        """The global model per task; None (clients evaluate their own models) when parameters stay local."""
        if self.keeps_local:
            return None
        if not any(k.startswith(ROLE_HEAD_PREFIX) for k in self.global_state):
            module = self.global_model()
            return {task: evaluate(module, self.setup.specs[task], x, y) for task, (x, y) in test.items()}
        return {task: evaluate(self.global_model(task), self.setup.specs[task], x, y) for task, (x, y) in test.items()}

    def configure_evaluate(self, clients: list[int]) -> dict[int, Message | None]:
        self.model.changed()
        return {c: self.payload_for(c) for c in clients}

    def global_model(self, task: str | None = None) -> nn.Module:
        """The global model; with a role-form state, with the shared head placed as `task`'s head."""
        model, module = self.build_model()
        load_state(model, self.global_state if task is None else to_task(self.global_state, task))
        return module


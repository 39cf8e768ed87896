"""The plug-in contract: a plug-in wraps a host's two programs, and the host's code does not change for it.

- Client side, the host trains and replies; the plug-in may rewrite the reply (`transform_reply`: DEA's sparse
  upload). It sees (reference, trained) pairs through the update convention (`common.updates`).
- Server side, the plug-in may restore each reply (`restore_reply`: DEA's sparse deltas back to dense values),
  adjust the host's `Update`s before the host's own rule runs (`adjust`: PCGrad's projections, FedHEAL's masks and
  weights), and replace that rule (`rule`: DEA's `rule: paper`). Everything else (participants, payloads,
  evaluation) is the host's.
A plug-in's own server state lives under `plugin/` in the checkpoint, next to the host's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar, Generic, TypeVar

import torch
from torch import Tensor

from manytask.client.trainer import TaskData
from manytask.errors import ManytaskError, clipped
from manytask.execution.plan import ClientPlan, PlanResult
from manytask.messages import Message
from manytask.methods.base import ClientContext, ClientProgram, Metrics, ServerProgram, Setup
from manytask.methods.client_state import StateSchema
from manytask.methods.common.updates import Update
from manytask.methods.hosts.server import HostServer, Rule
from manytask.registry import Params

PLUGIN_PREFIX = "plugin/"
P = TypeVar("P", bound=Params)


class PluginClient(ClientProgram[P], Generic[P]):
    def __init__(self, host: ClientProgram, setup: Setup, params: P) -> None:
        super().__init__(setup, params)
        self.host = host
        self.supports_device = host.supports_device

    def to_device(self, device: torch.device) -> None:
        super().to_device(device)
        self.host.to_device(device)

    def fit(self, ctx: ClientContext, payload: Message | None) -> Message | None:
        reply = self.host.fit(ctx, payload)
        return None if reply is None or payload is None else self.transform_reply(ctx, payload, reply)

    def plan(self, ctx: ClientContext, payload: Message | None) -> ClientPlan:
        return self.host.plan(ctx, payload)

    def state_schema(self) -> StateSchema:
        return self.host.state_schema()

    def plan_many(self, ctxs: Sequence[ClientContext], payloads: Sequence[Message | None]
                  ) -> list[ClientPlan | list[ClientPlan]]:
        return self.host.plan_many(ctxs, payloads)

    def conclude(self, ctx: ClientContext, payload: Message | None, plan: ClientPlan, result: PlanResult
                 ) -> Message | None:
        """The host's reply, transformed as `fit` does."""
        return self.conclude_many([ctx], [payload], [plan], [result])[0]

    def conclude_many(self, ctxs: Sequence[ClientContext], payloads: Sequence[Message | None],
                      plans: Sequence[ClientPlan | list[ClientPlan]], results: Sequence[PlanResult | list[PlanResult]]
                      ) -> list[Message | None]:
        """The host's replies, each transformed as `fit` does."""
        replies = self.host.conclude_many(ctxs, payloads, plans, results)
        return [None if reply is None or payload is None else self.transform_reply(ctx, payload, reply)
                for ctx, payload, reply in zip(ctxs, payloads, replies, strict=True)]

    def transform_reply(self, ctx: ClientContext, payload: Message, reply: Message) -> Message:
        """What is uploaded instead of the host's reply (default: the reply)."""
        return reply

    def evaluate(self, ctx: ClientContext, payload: Message | None, test: TaskData) -> Metrics:
        return self.host.evaluate(ctx, payload, test)


class PluginServer(ServerProgram[P], Generic[P]):
    # True where the plug-in's server code (restore, adjust, rule, state) runs wherever the replies lie; the wrapped
    # server then aggregates on the device when its host does
    device_ready: ClassVar[bool] = False

    def __init__(self, host: ServerProgram, setup: Setup, params: P) -> None:
        if not isinstance(host, HostServer):
            raise ManytaskError(f"a plug-in wraps host methods only, not {type(host).__name__}.")
        super().__init__(setup, params)
        self.host = host
        self.supports_device = host.supports_device and self.device_ready
        self.state: dict[str, Tensor] = {}  # the plug-in's own crash-safe state
        self.log: dict[str, float] = {}  # scalars to log for the round being aggregated
        self.restored: dict[int, tuple[Message, Message]] = {}  # this round's (reply, restored reply) by client

    def participants(self, round_index: int, sampled: list[int]) -> list[int]:
        return self.host.participants(round_index, sampled)

    def configure_fit(self, round_index: int, clients: list[int]) -> dict[int, Message | None]:
        return self.host.configure_fit(round_index, clients)

    def aggregate_fit(self, round_index: int, replies: Mapping[int, Message | None]) -> dict[str, float]:
        self.log = {}
        restored = {c: None if r is None else self.restored_reply(c, r) for c, r in replies.items()}
        self.restored = {}
        return {**self.host.aggregate_replies(round_index, restored, self.adjust, self.rule()), **self.log}

    def reply_problem(self, client: int, reply: Message) -> str | None:
        """The host's rule, on the reply as the host would get it; a reply the plug-in cannot restore is refused."""
        try:
            restored = self.restored_reply(client, reply)
        except (KeyError, ValueError, IndexError, RuntimeError) as err:  # restoring reads untrusted arrays
            return f"reply cannot be restored by the plug-in ({type(err).__name__}: {clipped(err)})"
        return self.host.reply_problem(client, restored)

    def round_problems(self, replies: Mapping[int, Message]) -> dict[int, str]:
        """The host's round rule (its divergence guard), on the replies as the host would get them."""
        return self.host.round_problems({c: self.restored_reply(c, r) for c, r in replies.items()})

    def restored_reply(self, client: int, reply: Message) -> Message:
        """`restore_reply`, done once per reply: screening and aggregation both need it."""
        cached = self.restored.get(client)
        if cached is None or cached[0] is not reply:
            cached = self.restored[client] = (reply, self.restore_reply(client, reply))
        return cached[1]

    def restore_reply(self, client: int, reply: Message) -> Message:
        """The reply as the host expects it (default: unchanged); `self.host.sent[client]` is what it was sent."""
        return reply

    def adjust(self, round_index: int, updates: list[Update]) -> list[Update]:
        """The updates the host aggregates (default: unchanged)."""
        return updates

    def rule(self) -> Rule | None:
        """The rule that moves the global model in place of the host's (default: None, the host's own)."""
        return None

    def evaluate(self, test: TaskData) -> Metrics | None:
        return self.host.evaluate(test)

    def configure_evaluate(self, clients: list[int]) -> dict[int, Message | None]:
        return self.host.configure_evaluate(clients)

    def state_dict(self) -> dict[str, Tensor]:
        return {**self.host.state_dict(), **{PLUGIN_PREFIX + k: v for k, v in self.state.items()}}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        self.host.load_state_dict({k: v for k, v in state.items() if not k.startswith(PLUGIN_PREFIX)})
        self.state = {k[len(PLUGIN_PREFIX):]: v.clone() for k, v in state.items() if k.startswith(PLUGIN_PREFIX)}

"""FedU (Dinh et al., 2021, "A New Look and Convergence Rate of Federated Multi-Task Learning with Laplacian
Regularization"), the SFMTL-Graph paper's federated multi-task baseline (spec: shared/specs/sfmtl_graph.md,
"Baselines").

Every client keeps its whole model (backbone + head) in client state, trains it locally with the run's trainer and
uploads it. The server takes one graph-Laplacian step over all participating pairs (`laplacian.laplacian_step`),
    w_k ← w_k − η_g·λ·Σ_{l ∈ S, l ≠ k} a_kl (w_k − w_l),   η_g = lr·E (local epochs), λ = 0.03,
with a FIXED similarity graph: complete, unit weights a_kl = 1 (no similarity is learned, unlike SFMTL-Graph), and
η_g per client from the epochs it trained (`common.personal.graph_steps`).
Each participant gets its updated model the next time it is sampled, and evaluates it meanwhile. Whole models are
compared across clients, so they travel in role form (`models.multitask.to_role`): one task per client, equal heads.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import ClassVar

import torch
from pydantic import Field
from torch import Tensor

from manytask.client.trainer import TrainReport
from manytask.execution.plan import ClientPlan, PlanResult
from manytask.messages import Message
from manytask.methods.base import ClientContext, ClientProgram, MethodDef, Setup
from manytask.methods.client_state import StateSchema, model_part
from manytask.methods.common.laplacian import laplacian_step
from manytask.methods.common.personal import (
    PerClientPayloadServer,
    check_shared_head,
    graph_steps,
    only_task,
    personal_model,
)
from manytask.methods.common.template import program_template
from manytask.methods.common.wire import (
    ArraySpec,
    array_specs,
    arrays_problem,
    counts_problem,
    fit_scalars,
    mean_train_losses,
)
from manytask.methods.registry import PERSONALIZED, register_method
from manytask.models.multitask import MultiTaskModel, to_role, to_task, trainable_state
from manytask.registry import Params
from manytask.search_space import Space, log_range

NAME = "fedu"


class FeduParams(Params):
    # ranges for manytask tune: a decade and more around λ 0.03
    SEARCH_SPACE: ClassVar[Space] = {"lam": log_range(1e-3, 1.0)}
    lam: float = Field(default=0.03, ge=0, description="λ: graph-Laplacian strength (the spec's value)")


def complete_graph(size: int) -> Tensor:
    """FedU's fixed similarity graph over `size` participants: a_kl = 1 for every pair k ≠ l."""
    return torch.ones(size, size) - torch.eye(size)


class FeduClient(ClientProgram):
    supports_device = True

    def __init__(self, setup: Setup, params: FeduParams) -> None:
        super().__init__(setup, params)
        self.start = setup.common_start()

    def fit(self, ctx: ClientContext, payload: Message | None) -> Message:
        task = only_task(self.setup, ctx.client_id, NAME)
        model = self.model_for_evaluation(ctx, payload)
        report = self.setup.trainer().train(model, ctx.data, ctx.seed, ctx.round_index, self.setup.rounds)
        return self.reply(ctx, task, trainable_state(model, [task]), report)

    template = program_template()

    def plan(self, ctx: ClientContext, payload: Message | None) -> ClientPlan:
        """`fit`'s training for an executor: the run's trainer from the client's own model (`own_layers`)."""
        task = only_task(self.setup, ctx.client_id, NAME)
        start = self.template.start(*self.own_layers(ctx, payload, task))
        return ClientPlan(self.template.model, self.setup.trainer(), ctx.round_index, self.setup.rounds, {},
                          dict(ctx.data), start, ctx.seed)

    def conclude(self, ctx: ClientContext, payload: Message | None, plan: ClientPlan, result: PlanResult
                 ) -> Message:
        task = only_task(self.setup, ctx.client_id, NAME)
        return self.reply(ctx, task, self.template.trained(result.params, [task]), result.report)

    def reply(self, ctx: ClientContext, task: str, trained: dict[str, Tensor], report: TrainReport) -> Message:
        """The trained model kept as the client's state and uploaded in role form, with the training losses."""
        ctx.state.clear()
        ctx.state.update(trained)
        return Message.from_tensors(to_role(trained, task), scalars=fit_scalars(ctx.data, report.mean_loss))

    def state_schema(self) -> StateSchema:
        return StateSchema(type(self).__name__, {"own model": model_part(self.setup.build_model())})

    def model_for_evaluation(self, ctx: ClientContext, payload: Message | None) -> MultiTaskModel:
        """The client's own model: the model the server last updated for it when it sent one, else its state
        (the common initial model before its first round)."""
        task = only_task(self.setup, ctx.client_id, NAME)
        return personal_model(self.setup, *self.own_layers(ctx, payload, task), device=self.device)

    def own_layers(self, ctx: ClientContext, payload: Message | None, task: str) -> list[Mapping[str, Tensor]]:
        """What the client's own model is made of, later layers winning: the common start, its state, and the model
        the server last updated for it when it sent one."""
        received = {} if payload is None else to_task(payload.tensors(), task)
        return [to_task(self.start, task), ctx.state, received]


class FeduServer(PerClientPayloadServer):
    def __init__(self, setup: Setup, params: FeduParams) -> None:
        check_shared_head(setup, NAME)
        super().__init__(setup, params)

    def reply_problem(self, client: int, reply: Message) -> str | None:
        """A FedU reply is the client's whole model in role form (the common start's arrays, shapes and dtypes) and
        its one task's count."""
        task = only_task(self.setup, client, NAME)
        return counts_problem(client, reply, [task]) or arrays_problem(reply, self.upload_specs)

    @cached_property
    def upload_specs(self) -> dict[str, ArraySpec]:
        return array_specs(self.setup.common_start())

    def aggregate_fit(self, round_index: int, replies: Mapping[int, Message | None]) -> dict[str, float]:
        received = {c: reply for c, reply in replies.items() if reply is not None}
        clients, messages = list(received), list(received.values())
        models = laplacian_step([m.tensors() for m in messages], complete_graph(len(clients)),
                                [list(range(len(clients)))], graph_steps(self.setup, round_index, clients),
                                self.params.lam)
        self.pending.update(zip(clients, models, strict=True))
        return mean_train_losses(messages)


register_method(
    NAME, MethodDef(FeduClient, FeduServer, family=PERSONALIZED), FeduParams,
    "FedU: personal whole models pulled together by a Laplacian step over a fixed complete client graph",
)

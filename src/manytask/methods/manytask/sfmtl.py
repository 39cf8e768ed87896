"""SFMTL-Graph (spec: shared/specs/sfmtl_graph.md): personalized clients that keep their backbone, share only a
head and per-class feature anchors, and collaborate inside communities of a dynamic client-similarity graph.

Client: cross-entropy + λ_a · anchor loss, anchors tracking per-class feature means with momentum m.
Server: the similarity graph over the participants, seeded Louvain communities, sample-weighted community anchors
and the graph-Laplacian head step inside communities (`sfmtl_math`); each participant gets back its updated head
and its community's anchor for the next round it takes part in.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property, partial
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from manytask.client.terms import FeatureStateTerm
from manytask.client.trainer import TrainReport
from manytask.errors import ManytaskError
from manytask.execution.plan import ClientPlan, PlanResult
from manytask.messages import Message
from manytask.methods.base import ClientContext, ClientProgram, MethodDef, Setup
from manytask.methods.client_state import StatePart, StateSchema, model_part
from manytask.methods.common.laplacian import laplacian_step
from manytask.methods.common.personal import PerClientPayloadServer, graph_steps, only_task, personal_model
from manytask.methods.common.template import program_template
from manytask.methods.common.wire import (
    LOSS_PREFIX,
    SIZE_PREFIX,
    ArraySpec,
    array_specs,
    arrays_problem,
    counts_problem,
    task_sizes,
)
from manytask.methods.manytask.sfmtl_math import (
    anchor_step,
    communities,
    community_anchors,
    random_graph,
    similarity_graph,
)
from manytask.methods.registry import MANY_TASK, register_method
from manytask.metric_names import COMMUNITIES, community_key, graph_key
from manytask.models.multitask import MultiTaskModel, head_prefix, trainable_state
from manytask.registry import Params
from manytask.search_space import Space, log_range, uniform
from manytask.seeding import derive_seed, torch_generator
from manytask.tasks.task import TaskKind

NAME = "sfmtl-graph"
ANCHORS = "anchors"
LABELS = "labels"


class SfmtlParams(Params):
    # ranges for manytask tune: a decade and more around λ 0.03 and λ_a 0.1; α over its whole span
    SEARCH_SPACE: ClassVar[Space] = {
        "lam": log_range(1e-3, 1.0),
        "anchor_weight": log_range(0.01, 1.0),
        "alpha": uniform(0.0, 1.0),
    }
    alpha: float = Field(default=0.49, ge=0, le=1, description="weight of head vs anchor similarity")
    lam: float = Field(default=0.03, ge=0, description="graph-Laplacian strength λ")
    anchor_weight: float = Field(default=0.1, ge=0, description="anchor loss weight λ_a")
    momentum: float = Field(default=0.5, ge=0, lt=1, description="anchor momentum m")
    resolution: float = Field(default=1.0, gt=0, description="Louvain resolution")
    graph: Literal["learned", "random"] = Field(
        default="learned", description="learned: the similarity graph; random: U(0, 1) edge weights (a control)"
    )


def initial_anchors(setup: Setup, task: str, width: int) -> Tensor:
    """Normalized random anchors, identical on every client (a seed shared through the run seed)."""
    classes = setup.specs[task].num_outputs
    return F.normalize(torch.randn(classes, width, generator=torch_generator(setup.seed, "anchors", task)), dim=1)


class SfmtlClient(ClientProgram):
    """Cross-entropy + λ_a · the anchor loss (`sfmtl_math.anchor_step`, a `FeatureStateTerm` whose state is the
    client's anchors); uploads its head, its anchors and the bit set of its classes. Its round is a plan the
    executor may batch with other clients'."""

    supports_device = True

    def __init__(self, setup: Setup, params: SfmtlParams) -> None:
        super().__init__(setup, params)
        self.anchor_piece = partial(anchor_step, momentum=params.momentum)  # one object: the clients' terms batch

    template = program_template()

    def fit(self, ctx: ClientContext, payload: Message | None) -> Message:
        task = only_task(self.setup, ctx.client_id, NAME)
        model = self.model_for_evaluation(ctx, payload)
        term = self.anchor_term(ctx, payload, task)
        report = self.setup.trainer().train(model, ctx.data, ctx.seed, ctx.round_index, self.setup.rounds, [term])
        return self.reply(ctx, task, trainable_state(model, [task]), term.state, report)

    def plan(self, ctx: ClientContext, payload: Message | None) -> ClientPlan:
        task = only_task(self.setup, ctx.client_id, NAME)
        start = self.template.start(*self.own_layers(ctx, payload))
        return ClientPlan(self.template.model, self.setup.trainer(), ctx.round_index, self.setup.rounds, {},
                          dict(ctx.data), start, ctx.seed, state_terms=[self.anchor_term(ctx, payload, task)])

    def conclude(self, ctx: ClientContext, payload: Message | None, plan: ClientPlan, result: PlanResult
                 ) -> Message:
        task = only_task(self.setup, ctx.client_id, NAME)
        return self.reply(ctx, task, self.template.trained(result.params, [task]), result.term_states[0],
                          result.report)

    def anchor_term(self, ctx: ClientContext, payload: Message | None, task: str) -> FeatureStateTerm:
        """The anchor loss from the anchors the server sent, else the client's own, else the initial ones."""
        received = {} if payload is None else payload.tensors()
        anchors = received.get(ANCHORS, ctx.state.get(ANCHORS))
        if anchors is None:
            anchors = initial_anchors(self.setup, task, self.template.model.backbone.out_features)
        return FeatureStateTerm(anchors.to(self.device), self.params.anchor_weight, self.anchor_piece)

    def reply(self, ctx: ClientContext, task: str, trained: dict[str, Tensor], anchors: Tensor,
              report: TrainReport) -> Message:
        """The trained model and anchors kept as the client's state; its head, anchors and label bits uploaded."""
        ctx.state.clear()
        ctx.state.update({**trained, ANCHORS: anchors})
        labels = torch.zeros(len(anchors), dtype=torch.bool, device=anchors.device)
        labels.index_fill_(0, ctx.data[task][1], True)  # the classes it saw, without reading them back
        head = {k: v for k, v in trained.items() if k.startswith(head_prefix(task))}
        scalars = {SIZE_PREFIX + task: len(ctx.data[task][1]), LOSS_PREFIX + task: report.mean_loss[task]}
        return Message.from_tensors({**head, ANCHORS: anchors, LABELS: labels}, scalars=scalars)

    def state_schema(self) -> StateSchema:
        return StateSchema(type(self).__name__, {"own model": model_part(self.setup.build_model()),
                                                 "anchors": StatePart.of([ANCHORS])})

    def model_for_evaluation(self, ctx: ClientContext, payload: Message | None) -> MultiTaskModel:
        """The client's own backbone and head (the shared initial model before its first round), with the head
        the server updated when it sent one."""
        return personal_model(self.setup, *self.own_layers(ctx, payload), device=self.device)

    def own_layers(self, ctx: ClientContext, payload: Message | None) -> list[dict[str, Tensor]]:
        """The client's own model (its state without the anchors), then the head the server sent, if any."""
        own = {k: v for k, v in ctx.state.items() if k != ANCHORS}
        received = {} if payload is None else {k: v for k, v in payload.tensors().items() if k != ANCHORS}
        return [own, received]


class SfmtlServer(PerClientPayloadServer):
    def __init__(self, setup: Setup, params: SfmtlParams) -> None:
        super().__init__(setup, params)
        for client in setup.holdings:
            only_task(setup, client, NAME)
        others = [name for name, spec in setup.specs.items() if spec.kind is not TaskKind.CLASSIFICATION]
        if others:
            raise ManytaskError(f"{NAME} keeps one feature anchor per class, so every task must be a "
                                f"classification; {', '.join(others)} {'is' if len(others) == 1 else 'are'} not.")

    def reply_problem(self, client: int, reply: Message) -> str | None:
        """An SFMTL-Graph reply holds its task's count, its head, one feature anchor per class and the bit set of
        the classes it saw, each of the model's shape."""
        task = only_task(self.setup, client, NAME)
        return counts_problem(client, reply, [task]) or arrays_problem(reply, self.upload_specs(task))

    def upload_specs(self, task: str) -> dict[str, ArraySpec]:
        """What a client holding `task` uploads: (shape, dtype) by name (once per task: the model never changes)."""
        specs = self._upload_specs.get(task)
        if specs is None:
            model = self.template
            head = {k: v for k, v in model.named_parameters() if k.startswith(head_prefix(task))}
            classes = self.setup.specs[task].num_outputs
            anchors = ((classes, model.backbone.out_features), torch.get_default_dtype())
            specs = self._upload_specs[task] = {**array_specs(head), ANCHORS: anchors,
                                                LABELS: ((classes,), torch.bool)}
        return specs

    @cached_property
    def _upload_specs(self) -> dict[str, dict[str, ArraySpec]]:
        return {}

    @cached_property
    def template(self) -> MultiTaskModel:
        """A built model, for the shapes of what clients upload."""
        return self.setup.build_model()

    def aggregate_fit(self, round_index: int, replies: Mapping[int, Message | None]) -> dict[str, float]:
        clients = [c for c, r in replies.items() if r is not None]
        if not clients:
            return {}
        tasks = [only_task(self.setup, c, NAME) for c in clients]
        messages = [replies[c] for c in clients]
        heads = [_head(m, t) for m, t in zip(messages, tasks, strict=True)]
        anchors = [m.tensor(ANCHORS) for m in messages]
        bits = torch.stack([m.tensor(LABELS) for m in messages]).tolist()  # one read for every client's classes
        labels = [[c for c, seen in enumerate(row) if seen] for row in bits]
        weights = (similarity_graph(heads, anchors, labels, self.params.alpha, self.template.head_input)
                   if self.params.graph == "learned"
                   else random_graph(len(clients), torch_generator(self.setup.seed, "random-graph", round_index)))
        groups = communities(weights, derive_seed(self.setup.seed, "louvain", round_index), self.params.resolution)
        sizes = [task_sizes(m)[t] for m, t in zip(messages, tasks, strict=True)]
        new_heads = laplacian_step([{"weight": w, "bias": b} for w, b in heads], weights, groups,
                                   graph_steps(self.setup, round_index, clients), self.params.lam)
        log: dict[str, float] = {}
        for number, group in enumerate(groups):
            anchor = community_anchors(anchors, sizes, group)
            for i in group:
                prefix = head_prefix(tasks[i])
                self.pending[clients[i]] = {prefix + k: v for k, v in new_heads[i].items()} | {ANCHORS: anchor}
                log[community_key(clients[i])] = float(number)
        log[COMMUNITIES] = float(len(groups))
        log.update(_edge_log(clients, weights))
        return log


def _edge_log(clients: list[int], weights: Tensor) -> dict[str, float]:
    """The graph's positive edges as `graph/<client>/<client>` scalars (smaller id first), for the graph plot."""
    rows = weights.tolist()  # one read, not one per pair
    return {graph_key(a, b): rows[i][j] for i, a in enumerate(clients) for j, b in enumerate(clients)
            if i < j and rows[i][j] > 0}


def _head(message: Message, task: str) -> tuple[Tensor, Tensor]:
    prefix = head_prefix(task)
    return message.tensor(prefix + "weight"), message.tensor(prefix + "bias")


register_method(
    NAME, MethodDef(SfmtlClient, SfmtlServer, family=MANY_TASK), SfmtlParams,
    "SFMTL-Graph: personal backbones; heads + feature anchors shared inside Louvain communities of a client graph",
)

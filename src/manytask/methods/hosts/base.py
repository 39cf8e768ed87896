"""What every host optimizer shares on the client, and the model both sides build: a client that trains what it was
sent with the one `Trainer` (or describes its round as a `ClientPlan` for an executor) and uploads it. The server
side is `hosts/server.py`.

A host client differs from FedAvg's in a few overridable places, never in the loop: `build_model` (e.g. a
linearized model, a projection head), `local_keys` (parameters that stay on the client, FedPer/FedBN), `hooks`,
`sparse_masks` and `combine` (its local objective), `trainer` and `schedule` (local work and lr schedule of a round,
e.g. per phase), `state_update`, `kept` and `finish` (client state after training, extra scalars), and
`state_parts` (what that state holds, declared once). Plug-ins wrap any host through the client's reply
(methods/plugins/base.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from pydantic import Field
from torch import Tensor, nn

from manytask.client.lookahead import LookaheadProbe
from manytask.client.optimizers import OptimizerFactory, sparse_sgdm
from manytask.client.terms import FeatureTerm, ParameterTerm
from manytask.client.trainer import (
    LossCombiner,
    TaskData,
    Trainer,
    TrainHook,
    TrainReport,
    evaluate,
    sum_of_task_losses,
)
from manytask.devices import on_device
from manytask.execution.plan import ClientPlan, PlanResult, StateUpdate, Unbatchable
from manytask.messages import Message
from manytask.methods.base import ClientContext, ClientProgram, Metrics, Setup
from manytask.methods.client_state import StatePart, StateSchema
from manytask.methods.common.global_model import GuardParams
from manytask.methods.common.template import ModelTemplate
from manytask.methods.common.updates import copy_key
from manytask.methods.common.wire import (
    LOSS_PREFIX,
    fit_scalars,
)
from manytask.methods.hosts.model_pool import ModelPool
from manytask.models.multitask import (
    MultiTaskModel,
    load_state,
    merged_state,
    state_keys,
    task_of_key,
    to_role,
    to_task,
    trainable_state,
)
from manytask.seeding import derive_seed


class HostParams(GuardParams):
    server_lr: float = Field(
        default=1.0, gt=0, description="server step size η_s: θ ← θ + η_s (θ' − θ) on the parameters, θ' the host "
        "rule's result (1: the rule as published; FedDEA's control, docs/hosts_and_plugins.md)",
    )
    per_task: bool = Field(default=False, description="train and upload one copy of the shared part per held task")
    shared_head: bool = Field(
        default=False, description="one-task clients over one label space share ONE head (one global model)"
    )


@dataclass
class TrainedCopy:
    """One model a client trains in a round: on all its tasks (joint), or on one task (`per_task`)."""

    name: str | None  # the task of a per-task copy; None for the joint copy
    tasks: list[str]
    model: MultiTaskModel  # holds the parameters
    module: nn.Module  # what is trained and evaluated (the model, or a wrapper of it)
    received: dict[str, Tensor]  # what the server sent, in task form
    seed: int

    @property
    def state_prefix(self) -> str:
        """Where this copy's own client state lives inside the client's state dict."""
        return "" if self.name is None else f"{self.name}/"


class HostModel:
    """How a host builds the model it trains; client and server share it so both hold the same parameters."""

    setup: Setup

    def build_model(self) -> tuple[MultiTaskModel, nn.Module]:
        """(the model that holds the parameters, the module that is trained and evaluated), before any state is
        loaded (a linearization is captured at the initial point)."""
        model = self.setup.build_model()
        return model, model

    def local_keys(self, keys: Sequence[str]) -> set[str]:
        """Of a model's state keys (`state_keys`, in model order), those that stay on the clients and never
        travel (none for FedAvg)."""
        return set()


class HostClient(HostModel, ClientProgram[HostParams]):
    """Loads the received parameters, trains, uploads the trained parameters and buffers + sizes and losses.

    Joint (default): one model trained on all held tasks at once. `per_task`: one copy per held task, each trained
    on that task alone and uploaded as `copy/<task>/<name>` (the MaTU paper's FedAvg baseline)."""

    supports_device = True

    def __init__(self, setup: Setup, params: HostParams) -> None:
        super().__init__(setup, params)
        self.models = ModelPool(self.build_on_device)

    def build_on_device(self) -> tuple[MultiTaskModel, nn.Module]:
        model, module = self.build_model()
        return model.to(self.device), module.to(self.device)

    def hooks(self, ctx: ClientContext, copy: TrainedCopy) -> list[TrainHook]:
        """Training hooks of the host's local objective (none for FedAvg)."""
        return []

    def sparse_masks(self, ctx: ClientContext, copy: TrainedCopy) -> dict[str, Tensor] | None:
        """Per parameter, the entries the local steps may move, under SGD with momentum (`SparseSGDM`, whatever the
        run's optimizer); None: the run's optimizer moves every trainable entry."""
        return None

    def optimizer(self, ctx: ClientContext, copy: TrainedCopy) -> OptimizerFactory | None:
        """The optimizer factory of `fit`: `SparseSGDM` under `sparse_masks`, or None (the run's train config)."""
        masks = self.sparse_masks(ctx, copy)
        train = self.setup.train
        return None if masks is None else sparse_sgdm(masks, train.momentum, train.weight_decay)

    def combine(self, ctx: ClientContext, copy: TrainedCopy) -> LossCombiner:
        """How a step's task losses become one loss (the sum; learned task weights such as GradNorm's here)."""
        return sum_of_task_losses

    def trainer(self, ctx: ClientContext) -> Trainer:
        """The local trainer of this round (the run's train config; a phase may change its local work)."""
        return self.setup.trainer()

    def schedule(self, ctx: ClientContext) -> tuple[int, int]:
        """(round, rounds) the lr schedule runs over: the run's by default, a phase's own for phased methods."""
        return ctx.round_index, self.setup.rounds

    def finish(self, ctx: ClientContext, copy: TrainedCopy) -> dict[str, float]:
        """After training a copy: update client state; return extra scalars to upload."""
        return {}

    def state_update(self, ctx: ClientContext, copy: TrainedCopy) -> StateUpdate | None:
        """The copy's client state after training, as one elementwise function per parameter (FedDyn's g), which
        either executor applies; None: nothing beyond `finish`."""
        return None

    def kept(self, copy: TrainedCopy, keys: Sequence[str]) -> tuple[str, list[str]]:
        """Of the trained copy's `trainable_state` keys, those kept in client state besides being uploaded, and the
        prefix they are kept under (MOON's previous model); none by default."""
        return "", []

    def state_schema(self) -> StateSchema:
        """Per copy (its `state_prefix`: none, or `<task>/` with `per_task`), its local parameters and what the
        host's objective keeps (`state_parts`)."""
        keys = state_keys(self.template[0])
        copies = tuple(f"{t}/" for t in self.setup.specs) if self.params.per_task else ("",)
        parts = {"local parameters": StatePart.of(self.local_keys(keys), copies), **self.state_parts(copies, keys)}
        return StateSchema(type(self).__name__, parts)

    def state_parts(self, copies: tuple[str, ...], keys: list[str]) -> dict[str, StatePart]:
        """What the host's objective keeps per copy besides local parameters, at the copies' prefixes `copies`,
        of a model whose `state_keys` are `keys` (nothing for FedAvg)."""
        return {}

    def keep_state(self, ctx: ClientContext, copy: TrainedCopy, update: StateUpdate, new: Mapping[str, Tensor]
                   ) -> None:
        ctx.state.update({copy.state_prefix + update.prefix + k: v for k, v in new.items()})

    def fit(self, ctx: ClientContext, payload: Message | None) -> Message:
        assert payload is not None, "host clients always receive the global model"
        received = self.received(ctx, payload)
        tensors: dict[str, Tensor] = {}
        scalars = fit_scalars(ctx.data, {})
        trainer, (round_index, rounds) = self.trainer(ctx), self.schedule(ctx)
        for copy in self.copies(ctx, received):
            report = trainer.train(
                copy.module, {t: ctx.data[t] for t in copy.tasks}, copy.seed, round_index, rounds,
                hooks=self.hooks(ctx, copy), optimizer=self.optimizer(ctx, copy), combine=self.combine(ctx, copy),
            )
            self.conclude_copy(ctx, copy, report, tensors, scalars)
        return self.reply(ctx, tensors, scalars)

    def plan(self, ctx: ClientContext, payload: Message | None) -> ClientPlan | list[ClientPlan]:
        """The client's round for an executor: what `fit` trains, read without building a model (with `per_task`,
        one plan per copy); `Unbatchable` where its training needs more than the plain loop."""
        self._check_batchable()
        return self.host_plan(ctx, payload)

    def host_plan(self, ctx: ClientContext, payload: Message | None) -> ClientPlan | list[ClientPlan]:
        """`plan` without the check that `fit` and `start` are the host's own (a subclass whose `plan` does what its
        own `fit` adds calls this)."""
        trainer, (round_index, rounds) = self.trainer(ctx), self.schedule(ctx)
        if type(trainer).train is not Trainer.train:
            raise Unbatchable(f"{type(self).__name__} trains with a trainer of its own")
        received = self.received(ctx, payload)
        values = self.plan_values(ctx)
        plans = [self._copy_plan(ctx, copy, values, trainer, round_index, rounds)
                 for copy in self.planned_copies(ctx, received)]
        return plans if self.params.per_task else plans[0]

    def plan_values(self, ctx: ClientContext) -> ModelTemplate:
        """The template this round's plans train (its trainable flags say what moves): the client's model, unless
        a phase trains another part of it."""
        return self.values

    def planned_copies(self, ctx: ClientContext, received: dict[str, Tensor]) -> list[TrainedCopy]:
        """The copies `copies` would build, on the round's template (never trained): one per held task with
        `per_task`."""
        built = self.plan_values(ctx).built
        if self.params.per_task:
            return [TrainedCopy(t, [t], *built, received, derive_seed(ctx.seed, t)) for t in ctx.data]
        return [TrainedCopy(None, list(ctx.data), *built, received, ctx.seed)]

    def _copy_plan(self, ctx: ClientContext, copy: TrainedCopy, values: ModelTemplate, trainer: Trainer,
                   round_index: int, rounds: int) -> ClientPlan:
        received = copy.received
        if copy.module is not copy.model:
            raise Unbatchable(f"{type(self).__name__} trains its model through a wrapper (a linearization)")
        if self.combine(ctx, copy) is not sum_of_task_losses:
            raise Unbatchable(f"{type(self).__name__} combines task losses its own way")
        hooks = self.hooks(ctx, copy)
        acting = [type(h).__name__ for h in hooks if not isinstance(h, ParameterTerm | FeatureTerm | LookaheadProbe)]
        if acting:
            raise Unbatchable(f"hook {acting[0]} acts inside the training step")
        start = merged_state(values.initial_values, received, self.local_state(ctx, copy))
        data = {t: ctx.data[t] for t in copy.tasks}
        return ClientPlan(copy.model, trainer, round_index, rounds, received, data, start, copy.seed,
                          [h for h in hooks if isinstance(h, ParameterTerm)], self.state_update(ctx, copy),
                          [h for h in hooks if isinstance(h, FeatureTerm)], masks=self.sparse_masks(ctx, copy),
                          probes=[h for h in hooks if isinstance(h, LookaheadProbe)])

    @cached_property
    def template(self) -> tuple[MultiTaskModel, nn.Module]:
        """A built model that gives batched training its structure; never trained, so also its initial values."""
        return self.build_on_device()

    @cached_property
    def values(self) -> ModelTemplate:
        """The template's initial values and state keys."""
        return ModelTemplate(*self.template)

    def _check_batchable(self) -> None:
        overridden = [name for name in ("fit", "start") if getattr(type(self), name) is not getattr(HostClient, name)]
        if overridden:
            raise Unbatchable(f"{type(self).__name__} has a {overridden[0]} of its own")

    def conclude(self, ctx: ClientContext, payload: Message | None, plan: ClientPlan | list[ClientPlan],
                 result: PlanResult | list[PlanResult]) -> Message:
        """`fit`'s reply from an executor's result(s), copy by copy: without a model where the host's `finish` and
        `upload` are the plain ones, else from a model holding the trained values."""
        plans = plan if isinstance(plan, list) else [plan]
        results = result if isinstance(result, list) else [result]
        tensors: dict[str, Tensor] = {}
        scalars = fit_scalars(ctx.data, {})
        plain = type(self).finish is HostClient.finish and type(self).upload is HostClient.upload
        values = self.plan_values(ctx)
        copies = self.planned_copies(ctx, plans[0].sent)
        for copy, made, trained in zip(copies, plans, results, strict=True):
            if plain:
                keys = values.keys(copy.tasks)
                scalars.update({LOSS_PREFIX + t: loss for t, loss in trained.report.mean_loss.items()})
                tensors.update(self.split_upload(ctx, copy, {k: trained.params[k] for k in keys}))
                if made.update is not None:
                    self.keep_state(ctx, copy, made.update, trained.state)
            else:
                self.conclude_copy(ctx, self.loaded_copy(ctx, copy, trained.params), trained.report, tensors, scalars)
        return self.reply(ctx, tensors, scalars)

    def loaded_copy(self, ctx: ClientContext, copy: TrainedCopy, trained: dict[str, Tensor]) -> TrainedCopy:
        """A planned copy as a built model holding an executor's trained values (the rest keeps its initial values:
        nothing frozen moves), for a `finish` or an `upload` of the host's own."""
        model, module = self.models.take(ctx, trained)
        return TrainedCopy(copy.name, copy.tasks, model, module, copy.received, copy.seed)

    def conclude_copy(
        self, ctx: ClientContext, copy: TrainedCopy, report: TrainReport, tensors: dict[str, Tensor],
        scalars: dict[str, float],
    ) -> None:
        """After a copy is trained: its losses and `finish` scalars into `scalars`, its upload into `tensors`."""
        scalars.update({LOSS_PREFIX + t: loss for t, loss in report.mean_loss.items()})
        scalars.update(self.finish(ctx, copy))
        update = self.state_update(ctx, copy)
        if update is not None:
            trained = {k: p.detach() for k, p in copy.model.named_parameters()}
            self.keep_state(ctx, copy, update, update.apply(trained))
        tensors.update(self.upload(ctx, copy))

    def reply(self, ctx: ClientContext, tensors: dict[str, Tensor], scalars: dict[str, float]) -> Message:
        return Message.from_tensors(to_role(tensors, *ctx.data) if self.params.shared_head else tensors,
                                    scalars=scalars)

    def received(self, ctx: ClientContext, payload: Message | None) -> dict[str, Tensor]:
        """What the server sent, in task form."""
        tensors = {} if payload is None else on_device(payload.tensors(), self.device)
        return to_task(tensors, *ctx.data) if self.params.shared_head else tensors

    def copies(self, ctx: ClientContext, received: dict[str, Tensor]) -> Iterator[TrainedCopy]:
        """The copies to train, built one at a time (one per held task with `per_task`)."""
        groups = [[t] for t in ctx.data] if self.params.per_task else [list(ctx.data)]
        return (self.start(ctx, received, tasks) for tasks in groups)

    def start(self, ctx: ClientContext, received: dict[str, Tensor], tasks: list[str]) -> TrainedCopy:
        """A copy built from what was sent, with the client's local parameters (if any) over it."""
        model, module = self.models.take(ctx, received)
        name = tasks[0] if self.params.per_task else None
        seed = derive_seed(ctx.seed, *tasks) if self.params.per_task else ctx.seed
        copy = TrainedCopy(name, tasks, model, module, received, seed)
        load_state(model, self.local_state(ctx, copy))
        return copy

    def local_state(self, ctx: ClientContext, copy: TrainedCopy) -> dict[str, Tensor]:
        """The copy's local parameters kept in client state (empty before its first round)."""
        if not ctx.state:  # a FedAvg client's, always: no need to list the model's keys
            return {}
        prefix = copy.state_prefix
        keys = self.local_keys(state_keys(copy.model))
        return {k: ctx.state[prefix + k] for k in keys if prefix + k in ctx.state}

    def upload(self, ctx: ClientContext, copy: TrainedCopy) -> dict[str, Tensor]:
        """The trained copy's parameters and buffers, local ones kept in client state instead."""
        return self.split_upload(ctx, copy, trainable_state(copy.model, copy.tasks))

    def split_upload(self, ctx: ClientContext, copy: TrainedCopy, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Of a trained copy's `trainable_state`, what is uploaded; its local keys go to client state (copied), and
        so do its `kept` ones (as they are: nothing changes them after training)."""
        local = self.local_keys(list(state))
        ctx.state.update({copy.state_prefix + k: state[k].clone() for k in local})
        prefix, kept = self.kept(copy, list(state))
        ctx.state.update({copy.state_prefix + prefix + k: state[k] for k in kept})
        shared = {k: v for k, v in state.items() if k not in local}
        if copy.name is None:
            return shared
        return {k if task_of_key(k) is not None else copy_key(copy.name, k): v for k, v in shared.items()}

    def evaluate(self, ctx: ClientContext, payload: Message | None, test: TaskData) -> Metrics:
        """Client-side evaluation (hosts with local parameters): each task on its copy's model."""
        received = self.received(ctx, payload)
        modules: dict[str | None, nn.Module] = {}
        metrics = {}
        for task, (x, y) in test.items():
            name = task if self.params.per_task else None
            if name not in modules:
                modules[name] = self.start(ctx, received, [task] if self.params.per_task else list(ctx.data)).module
            metrics[task] = evaluate(modules[name], self.setup.specs[task], x, y)
        return metrics

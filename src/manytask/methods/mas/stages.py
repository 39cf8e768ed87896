"""Methods that train several models one after another, one FL task at a time (shared/specs/mas.md): MAS (the
all-in-one model, then its split groups), one-by-one (each task alone), TAG and HOA (probes, then groups).

A run is a sequence of fixed-length stages (`common.phases`). A stage trains one model (the shared encoder and the
decoders of its tasks) with FedAvg, from scratch or from the all-in-one parameters, under its own lr schedule, and
serves some tasks: when it ends, its model becomes theirs. Stages after a split are only known once the server has
measured what the split needs, so the server decides them and tells each client, in the payload, what to train:
the decoders it sends and three scalars (the stage's round, its length, and how often to measure affinities).
Everything a stage needs is server state, so a run stopped in any stage resumes exactly.

A stage with no tasks (a group slot TAG's selection left unused) is idle: its clients are sent nothing and train
nothing. Evaluation is on the server, per task: the current stage's model for the tasks it serves, else the last
model that served the task, else the untrained initial model. At the end every task has its own reassembled model.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field, field_validator
from torch import Tensor

from manytask.client.lookahead import LookaheadProbe
from manytask.client.trainer import TaskData, TrainHook, evaluate
from manytask.errors import ManytaskError
from manytask.execution.plan import ClientPlan, NothingToBatch, PlanResult
from manytask.messages import Message
from manytask.methods.base import ClientContext, Metrics, Setup
from manytask.methods.common.global_model import GlobalModel, GlobalModelServer, fedavg_weights_of
from manytask.methods.common.phases import Phase, Phases, PhaseStep
from manytask.methods.common.wire import LOSS_PREFIX, fit_scalars, mean_train_losses
from manytask.methods.hosts.base import HostClient, HostModel, HostParams, TrainedCopy
from manytask.methods.mas.lookahead import AFFINITY_PREFIX, affinity_matrix, affinity_probe, affinity_scalars
from manytask.models.multitask import load_state, task_of_key, trainable_state

STAGE_ROUND, STAGE_ROUNDS, MEASURE_EVERY = "stage/round", "stage/rounds", "stage/affinity_every"
STAGE, SPLIT = "stage", "split"  # server parts: the current stage index; the groups chosen at the split
MODEL_PART = "model-"  # server part model-<task>: the last model that served the task
Start = Literal["scratch", "all-in-one"]


@dataclass(frozen=True)
class Stage:
    """One model trained for `rounds` rounds on `tasks`; when it ends it becomes the model of `serves`."""

    name: str
    tasks: tuple[str, ...]
    serves: tuple[str, ...]
    start: Start = "scratch"


class StagedParams(HostParams):
    affinity_every: int = Field(10, ge=1, description="measure lookahead affinities every this many local batches")
    per_lr: bool = Field(True, description="divide affinities by the lr (the reference code's normalization)")

    @field_validator("shared_head")
    @classmethod
    def _no_shared_head(cls, shared: bool) -> bool:
        if shared:
            raise ValueError("does not apply: every stage trains each of its tasks with a decoder of its own")
        return shared


class StagedClient(HostClient):
    """Trains the held tasks whose decoders the server sent, with the stage's lr schedule; measures lookahead
    affinities when the server asks (a `LookaheadProbe` the sequential trainer runs as a hook, and the batched
    executor measures for every client of the round at once)."""

    params: StagedParams

    def fit(self, ctx: ClientContext, payload: Message | None) -> Message:
        assert payload is not None, "staged clients always receive the stage's model"
        if not payload.arrays:  # an idle stage (a group slot a selection left unused): nothing to train
            return Message(scalars=fit_scalars(ctx.data, {}))
        self.stage_scalars = dict(payload.scalars)
        self.affinity: LookaheadProbe | None = None
        return super().fit(ctx, payload)

    def plan(self, ctx: ClientContext, payload: Message | None) -> ClientPlan | list[ClientPlan]:
        """`fit`'s round as a plan, for a round that is not idle."""
        assert payload is not None, "staged clients always receive the stage's model"
        if not payload.arrays:
            raise NothingToBatch("an idle stage trains nothing")
        self.stage_scalars = dict(payload.scalars)
        return self.host_plan(ctx, payload)

    def conclude(self, ctx: ClientContext, payload: Message | None, plan: ClientPlan | list[ClientPlan],
                 result: PlanResult | list[PlanResult]) -> Message:
        """The host's reply, with the affinities the executor measured for this client (if any)."""
        self.affinity = None  # `reply` adds the sequential hook's measurements only
        reply = super().conclude(ctx, payload, plan, result)
        if isinstance(plan, list) or not plan.probes:
            return reply
        assert isinstance(result, PlanResult)
        return Message(reply.arrays, {**reply.scalars, **affinity_scalars(list(plan.data), result.probes[0])})

    def schedule(self, ctx: ClientContext) -> tuple[int, int]:
        return int(self.stage_scalars[STAGE_ROUND]), int(self.stage_scalars[STAGE_ROUNDS])

    def copies(self, ctx: ClientContext, received: dict[str, Tensor]) -> Iterator[TrainedCopy]:
        yield self.start(ctx, received, self.stage_tasks(ctx, received))

    def planned_copies(self, ctx: ClientContext, received: dict[str, Tensor]) -> list[TrainedCopy]:
        return [TrainedCopy(None, self.stage_tasks(ctx, received), *self.template, received, ctx.seed)]

    @staticmethod
    def stage_tasks(ctx: ClientContext, received: Mapping[str, Tensor]) -> list[str]:
        """The held tasks whose decoders the server sent."""
        sent = {task_of_key(k) for k in received}
        return [t for t in ctx.data if t in sent]

    def hooks(self, ctx: ClientContext, copy: TrainedCopy) -> list[TrainHook]:
        every = int(self.stage_scalars.get(MEASURE_EVERY, 0))
        if not every:
            return []
        self.affinity = affinity_probe(self.setup.specs, every, self.setup.train.weight_decay, self.params.per_lr)
        return [self.affinity]

    def reply(self, ctx: ClientContext, tensors: dict[str, Tensor], scalars: dict[str, float]) -> Message:
        """The host's reply, with the affinities measured this round by the sequential trainer (if any)."""
        measured = {} if self.affinity is None else affinity_scalars(self.affinity.tasks, self.affinity.mean())
        return super().reply(ctx, tensors, {**scalars, **measured})


class StagedServer(HostModel, GlobalModelServer[StagedParams]):
    """FedAvg of the current stage's model (a `GlobalModel`); stage transitions, the split and per-task models in
    named server state (`parts`)."""

    params: StagedParams

    @classmethod
    @abstractmethod
    def build_phases(cls, setup: Setup, params: StagedParams) -> list[Phase]:
        """The stages' names and lengths, fixed before the run (what a split decides is only their tasks)."""

    @classmethod
    def total_rounds(cls, setup: Setup, params: StagedParams) -> int:
        return sum(phase.rounds or 0 for phase in cls.build_phases(setup, params))

    def __init__(self, setup: Setup, params: StagedParams) -> None:
        super().__init__(setup, params)
        self.tasks = list(setup.specs)
        self.phases = Phases(self.build_phases(setup, params), self.total_rounds(setup, params))
        self.initial = trainable_state(self.build_model()[0])  # every decoder, untrained: where "scratch" starts
        self.model = GlobalModel(setup, {}, params.guard)  # the running stage's model
        self.parts: dict[str, dict[str, Tensor]] = {STAGE: {"index": torch.tensor(-1)}}
        self.step = self.phases.at(0)

    # --- what a method decides -------------------------------------------------------------------------------
    @abstractmethod
    def stage(self, index: int) -> Stage:
        """Stage `index` (its tasks may depend on the split, which is made before it starts)."""

    def measure_every(self, step: PhaseStep, round_index: int) -> int:
        """Local batches between affinity measurements in this round (0: none)."""
        return 0

    def before_stage(self, index: int) -> None:
        """Runs once when stage `index` starts, before its model is set up (the place to split)."""

    def after_round(self, step: PhaseStep, round_index: int, replies: Mapping[int, Message]) -> dict[str, float]:
        """Runs after each round's aggregation with the round's replies; returns extra scalars to log."""
        return {}

    # --- the machinery ---------------------------------------------------------------------------------------
    @property
    def stage_index(self) -> int:
        return int(self.parts[STAGE]["index"])

    def start_state(self, stage: Stage) -> dict[str, Tensor]:
        """The parameters a stage starts from (its tasks' decoders and the encoder)."""
        if stage.start == "all-in-one":
            return self.parts["all-in-one"]
        return self.initial

    def enter(self, index: int) -> None:
        """Close the running stage (its model now serves its tasks) and set up stage `index`."""
        if self.stage_index >= 0:
            self.keep(self.stage(self.stage_index))
        self.before_stage(index)
        stage = self.stage(index)
        self.global_state = {k: v.clone() for k, v in self.start_state(stage).items()
                             if task_of_key(k) is None or task_of_key(k) in stage.tasks}
        self.parts[STAGE]["index"] = torch.tensor(index)

    def keep(self, stage: Stage) -> None:
        for task in stage.serves:
            self.parts[MODEL_PART + task] = {k: v.clone() for k, v in self.model_state(task, self.global_state).items()}

    @staticmethod
    def model_state(task: str, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The encoder and `task`'s decoder of a state (the tensors themselves, not copies)."""
        return {k: v for k, v in state.items() if task_of_key(k) in (None, task)}

    def participants(self, round_index: int, sampled: list[int]) -> list[int]:
        """The sampled clients that hold a task of the stage (all of them on a federation where everyone holds
        every task)."""
        tasks = set(self.stage_at(round_index).tasks)
        if not tasks:
            return sampled
        chosen = [c for c in sampled if tasks & set(self.setup.holdings[c])]
        if chosen:
            return chosen
        return sorted(c for c, held in self.setup.holdings.items() if tasks & set(held))[: max(len(sampled), 1)]

    def stage_at(self, round_index: int) -> Stage:
        index = self.phases.at(round_index).index
        if index != self.stage_index:
            self.enter(index)
        return self.stage(index)

    def configure_fit(self, round_index: int, clients: list[int]) -> dict[int, Message | None]:
        self.stage_at(round_index)
        self.step = self.phases.at(round_index)
        self.measuring = self.measure_every(self.step, round_index)
        return super().configure_fit(round_index, clients)

    def payload_for(self, client: int) -> Message:
        """The stage's encoder and the decoders of the client's tasks, with the stage's scalars."""
        scalars = {STAGE_ROUND: self.step.local_round, STAGE_ROUNDS: self.step.length, MEASURE_EVERY: self.measuring}
        if not self.stage(self.step.index).tasks:
            return Message(scalars=scalars)
        return Message.from_tensors(self.model.payload(client).tensors(), scalars=scalars)

    def aggregate_fit(self, round_index: int, replies: Mapping[int, Message | None]) -> dict[str, float]:
        received = {c: r for c, r in replies.items() if r is not None}
        log: dict[str, float] = {}
        if self.stage(self.step.index).tasks and received:  # an idle stage trains nothing
            self.model.average(self.model.read_updates(received, fedavg_weights_of))
            self.model.changed()
            log.update(mean_train_losses(list(received.values())))
        log.update(self.after_round(self.step, round_index, received))
        return {**log, "stage": float(self.step.index)}

    def configure_evaluate(self, clients: list[int]) -> dict[int, Message | None]:
        return dict.fromkeys(clients)

    def evaluate(self, test: TaskData) -> Metrics | None:
        """Every task on its own model: the running stage's, the last that served it, or the initial one."""
        current = set(self.stage(self.stage_index).serves) if self.stage_index >= 0 else set()
        model, module = self.build_model()  # one model; each task loads its encoder and decoder over it
        metrics = {}
        for task, (x, y) in test.items():
            load_state(model, self.model_state(task, self.task_state(task, current)))
            metrics[task] = evaluate(module, self.setup.specs[task], x, y)
        return metrics

    def task_state(self, task: str, current: set[str]) -> Mapping[str, Tensor]:
        if task in current:
            return self.global_state
        return self.parts.get(MODEL_PART + task) or self.initial


def mean_affinity(replies: Mapping[int, Message], tasks: list[str]) -> Tensor | None:
    """The clients' affinity matrices averaged with equal weight (the paper's server average), or None."""
    matrices = [m for m in (affinity_matrix(r.scalars, tasks) for r in replies.values()) if m is not None]
    return torch.stack(matrices).mean(0) if matrices else None


def affinity_log(scores: Tensor, tasks: list[str]) -> dict[str, float]:
    return {f"{AFFINITY_PREFIX}{a}/{b}": float(scores[i, j])
            for i, a in enumerate(tasks) for j, b in enumerate(tasks) if i != j}


def mean_losses(replies: Mapping[int, Message], tasks: list[str]) -> dict[str, float]:
    """The clients' mean training loss per task of `tasks` (equal weights)."""
    found = {t: [float(r.scalars[LOSS_PREFIX + t]) for r in replies.values() if LOSS_PREFIX + t in r.scalars]
             for t in tasks}
    return {t: sum(v) / len(v) for t, v in found.items() if v}


def split_log(tasks: list[str], ids: Tensor) -> dict[str, float]:
    """`split/<task>` = the group that serves the task, logged in the first round after a split."""
    return {f"{SPLIT}/{t}": float(g) for t, g in zip(tasks, ids.tolist(), strict=True)}


def split_groups(groups: list[list[int]], n: int) -> Tensor:
    """Group id per task (server state) from a list of groups."""
    ids = torch.full((n,), -1, dtype=torch.int64)
    for g, members in enumerate(groups):
        ids[members] = g
    return ids


def check_multi_task_clients(setup: Setup, method: str) -> None:
    """Affinities are measured on clients that hold several tasks (labelling the same images)."""
    if all(len(held) < 2 for held in setup.holdings.values()):
        raise ManytaskError(f"{method} measures inter-task affinity on clients that hold several tasks, but every "
                            "client here holds one; use federation.tasks: {kind: all}.")


def partition_ids(setup: Setup, partition: list[list[str]]) -> list[list[int]]:
    """A partition given by task names as task indices; every task exactly once, no empty group."""
    tasks = list(setup.specs)
    named = [name for group in partition for name in group]
    unknown = sorted(set(named) - set(tasks))
    if unknown or sorted(named) != sorted(tasks) or any(not group for group in partition):
        raise ManytaskError(f"partition {partition} must name every task ({', '.join(tasks)}) exactly once, in "
                            f"non-empty groups{f'; unknown: {unknown}' if unknown else ''}.")
    return [[tasks.index(name) for name in group] for group in partition]


def check_groups(setup: Setup, groups: int) -> None:
    if groups > len(setup.specs):
        raise ManytaskError(f"groups={groups} exceeds the {len(setup.specs)} tasks; choose at most "
                            f"{len(setup.specs)}.")

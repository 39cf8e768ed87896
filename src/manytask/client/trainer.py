"""The local `Trainer` every method uses: optimizer, steps or epochs, a per-round lr schedule, and extension points.

A multi-task client takes one batch of every held task per step and combines the task losses (by default their sum),
so one step moves the shared backbone for all its tasks at once. Methods extend the one loop instead of copying it:
- hooks see a `StepContext` (step, lr, every task's batch, outputs and backbone features of the forward pass already
  done, the task losses) and may add loss terms, edit gradients or act after the step;
- a loss combiner replaces the sum of task losses (learned task weights, e.g. GradNorm);
- an optimizer factory replaces the config's SGD/AdamW (e.g. `SparseSGDM`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from manytask.client.optimizers import OptimizerFactory, config_optimizer
from manytask.client.schedules import Schedule, scheduled_lr
from manytask.models.keyed_dropout import PassKeys
from manytask.models.multitask import model_tensors
from manytask.registry import Params
from manytask.seeding import torch_generator
from manytask.tasks.predictions import record_prediction
from manytask.tasks.task import TaskSpec


class TrainConfig(Params):
    optimizer: Literal["sgd", "adamw"] = "sgd"
    lr: float = Field(default=0.05, gt=0)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    weight_decay: float = Field(default=0.0, ge=0)
    local_epochs: int = Field(default=1, ge=1)
    local_steps: int | None = Field(default=None, ge=1, description="overrides local_epochs when set")
    batch_size: int = Field(default=32, ge=1)
    lr_schedule: Schedule = "constant"
    warmup_rounds: int = Field(default=0, ge=0, description="warmup-cosine: rounds of linear warmup")
    lr_power: float = Field(default=0.9, gt=0, description="poly: p in lr·(1 − r/R)^p")
    lr_step: int = Field(default=10, ge=1, description="step: rounds between two decays (StepLR's step_size)")
    lr_gamma: float = Field(default=0.1, gt=0, le=1, description="step: the factor of each decay")
    grad_clip: float | None = Field(default=None, gt=0)
    losses: dict[str, str] = Field(default_factory=dict, description="per task name, a training loss in place of "
                                   "its kind's: map-l1 (edges, saliency) or shifted-l1 (normals), the task-grouping "
                                   "code's (tasks/dense_losses.py)")
    precision: Literal["fp32", "bf16"] = Field(
        default="fp32", description="bf16: the forward passes and losses of local steps under bfloat16 autocast "
        "(parameters, gradients, optimizer and aggregation stay float32; docs/performance.md states its tolerance)")

    def describe(self) -> str:
        """The clients' effective optimizer in one line, momentum and schedule included (`sgd lr 0.03, momentum
        0.9, 1 local epoch of batch 32`): users of other libraries expect momentum 0 and must see where it is not."""
        parts = [f"{self.optimizer} lr {self.lr:g}"]
        if self.optimizer == "sgd":
            parts.append(f"momentum {self.momentum:g}")
        if self.weight_decay:
            parts.append(f"weight decay {self.weight_decay:g}")
        if self.lr_schedule != "constant":
            parts.append(f"{self.lr_schedule} schedule")
        work = (f"{self.local_steps} local steps" if self.local_steps is not None
                else f"{self.local_epochs} local epoch{'s' if self.local_epochs != 1 else ''}")
        parts.append(f"{work} of batch {self.batch_size}")
        if self.grad_clip is not None:
            parts.append(f"gradients clipped at {self.grad_clip:g}")
        return ", ".join(parts)

    def autocast(self, device: torch.device) -> torch.autocast:
        """The local step's forward context on `device`: bfloat16 autocast under `precision: bf16`, else off."""
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16")

    def lr_at(self, round_index: int, total_rounds: int) -> float:
        """The learning rate of a round (0-based); the schedule runs over rounds, not local steps."""
        return scheduled_lr(
            self.lr, self.lr_schedule, round_index, total_rounds, self.warmup_rounds, self.lr_power, self.lr_step,
            self.lr_gamma)


@dataclass
class StepContext:
    """What hooks and the loss combiner see at one local step, after the forward pass of every held task."""

    step: int  # 0-based local step
    lr: float
    model: nn.Module
    batches: dict[str, tuple[Tensor, Tensor]] = field(default_factory=dict)  # task -> (x, y) of this step
    outputs: dict[str, Tensor] = field(default_factory=dict)  # task -> its head's outputs
    features: dict[str, Tensor] = field(default_factory=dict)  # task -> backbone features of its batch
    losses: dict[str, Tensor] = field(default_factory=dict)  # task -> mean loss of its batch (with its graph)


class TrainHook:
    """Override what you need; the defaults do nothing."""

    def loss(self, step: StepContext) -> Tensor | None:
        """A term added to the step's loss (a proximal or contrastive term, an anchor loss), or None."""
        return None

    def before_backward(self, step: StepContext) -> None:
        """Runs after the step's loss is assembled, while the forward graph is intact: the place for measurements
        that differentiate the task losses themselves (MAS's lookahead affinities)."""

    def after_backward(self, step: StepContext) -> None:
        """Runs between backward() and the optimizer step: the place for gradient edits."""

    def after_step(self, step: StepContext) -> None:
        """Runs after each optimizer step."""


LossCombiner = Callable[[StepContext], Tensor]


def sum_of_task_losses(step: StepContext) -> Tensor:
    """The default combination: Σ_t L_t, in the order the client holds its tasks (from the first loss, not from a
    zero: 0 + L is L exactly, and one tensor fewer per step)."""
    losses = iter(step.losses.values())
    total = next(losses, None)
    if total is None:
        return torch.zeros(())
    for loss in losses:
        total = total + loss
    return total


@dataclass
class TrainReport:
    steps: int
    mean_loss: dict[str, float]


TaskData = Mapping[str, tuple[Tensor, Tensor]]


class Trainer:
    def __init__(self, config: TrainConfig, specs: Mapping[str, TaskSpec]) -> None:
        self.config = config
        self.specs = specs

    def steps_for(self, sizes: Mapping[str, int]) -> int:
        """Local steps of a client holding tasks of these sizes: `local_steps`, else epochs × the batches of its
        largest task. Servers whose step depends on local work use this too, so both sides agree."""
        if self.config.local_steps is not None:
            return self.config.local_steps
        return self.config.local_epochs * self.steps_per_epoch(sizes)

    def steps_per_epoch(self, sizes: Mapping[str, int]) -> int:
        return max(math.ceil(n / self.config.batch_size) for n in sizes.values())

    def epochs_for(self, sizes: Mapping[str, int]) -> float:
        """The local work in epochs: `local_epochs`, or `local_steps` as a fraction of one epoch's steps."""
        if self.config.local_steps is None:
            return float(self.config.local_epochs)
        return self.config.local_steps / self.steps_per_epoch(sizes)

    def num_steps(self, data: TaskData) -> int:
        return self.steps_for({task: y.shape[0] for task, (_, y) in data.items()})  # len() of a tensor is slower

    def train(
        self, model: nn.Module, data: TaskData, seed: int, round_index: int, total_rounds: int,
        hooks: Sequence[TrainHook] = (), optimizer: OptimizerFactory | None = None,
        combine: LossCombiner = sum_of_task_losses,
    ) -> TrainReport:
        """Train `model` in place on every task in `data`; deterministic given `seed`."""
        named = [(n, p) for n, p in model_tensors(model).parameters if p.requires_grad]
        params = [p for _, p in named]
        lr = self.config.lr_at(round_index, total_rounds)
        factory = optimizer or config_optimizer(self.config.optimizer, self.config.momentum, self.config.weight_decay)
        opt = factory(named, lr)
        shared = shares_inputs(data)
        batches = self._batches(data, seed, shared)
        losses: dict[str, list[Tensor]] = {task: [] for task in data}  # read once, after the last step: no sync
        steps = self.num_steps(data)
        train_mode(model)
        device = params[0].device if params else torch.device("cpu")
        autocast = self.config.autocast(device)
        passes = PassKeys(model, seed, device)  # dropout's draws: a function of (seed, stream, step)
        for index in range(steps):
            opt.zero_grad(set_to_none=True)
            step = StepContext(index, lr, model)
            with autocast:
                if shared:
                    passes.start("shared", index)
                    self._forward_shared(step, data, next(batches["shared"]))
                else:
                    for task, stream in batches.items():
                        passes.start(task, index)
                        self._forward(step, task, next(stream))
                for task in data:
                    losses[task].append(step.losses[task].detach())
                loss = combine(step)
                for hook in hooks:
                    extra = hook.loss(step)
                    if extra is not None:
                        loss = loss + extra
            for hook in hooks:
                hook.before_backward(step)
            loss.backward()
            for hook in hooks:
                hook.after_backward(step)
            if self.config.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(params, self.config.grad_clip)
            opt.step()
            for hook in hooks:
                hook.after_step(step)
        passes.close()
        return TrainReport(steps, {task: mean_of(values, steps) for task, values in losses.items()})

    def _batches(self, data: TaskData, seed: int, shared: bool) -> dict[str, Iterator]:
        """One endless batch stream per task, or, when every task labels the same inputs, one stream of indices
        that all tasks follow (so one step sees one batch of images, labelled for every task)."""
        size = self.config.batch_size
        if shared:
            return {"shared": shuffled_indices(len(next(iter(data.values()))[1]), size, seed, "shared")}
        return {task: shuffled_batches(x, y, size, seed, task) for task, (x, y) in data.items()}

    def _forward_shared(self, step: StepContext, data: TaskData, chosen: Tensor) -> None:
        """Every task on the same batch; the encoder runs once when the model can share it (`forward_many`)."""
        x = next(iter(data.values()))[0][chosen]
        many = getattr(step.model, "forward_many", None)
        results = many(x, list(data)) if many is not None else {
            task: step.model.forward_with_features(x, task) for task in data
        }
        for task, (outputs, features) in results.items():
            y = data[task][1][chosen]
            step.batches[task] = (x, y)
            step.outputs[task] = outputs
            step.features[task] = features
            step.losses[task] = self.specs[task].loss(outputs, y)

    def _forward(self, step: StepContext, task: str, batch: tuple[Tensor, Tensor]) -> None:
        x, y = batch
        outputs, features = step.model.forward_with_features(x, task)
        step.batches[task] = batch
        step.outputs[task] = outputs
        step.features[task] = features
        step.losses[task] = self.specs[task].loss(outputs, y)


def mean_of(losses: list[Tensor], steps: int) -> float:
    """Σ losses / max(steps, 1), the sum taken in Python floats from 0 in step order: the same bits as adding each
    step's `.item()` as it came, from one host read."""
    return sum(torch.stack(losses).tolist() if losses else []) / max(steps, 1)


def train_mode(model: nn.Module) -> None:
    """`model.train()`: the flag is set directly on every submodule when none overrides `train` (going through
    `nn.Module.__setattr__` for each cost a small client a noticeable share of its round). The module list is walked
    once per model: a built model's tree does not change. The model keeps its submodules, not itself: a model that
    refers to itself is freed only by a full garbage collection, which runs rarely during a run (`engine/heap.py`)."""
    cached = model.__dict__.get("_manytask_modules")
    if cached is None:
        below = list(model.modules())[1:]
        plain = all(type(m).train is nn.Module.train for m in [model, *below])
        cached = model.__dict__["_manytask_modules"] = (below, plain)
    below, plain = cached
    if not plain:
        model.train()
        return
    model.__dict__["training"] = True
    for module in below:
        module.__dict__["training"] = True


def shares_inputs(data: TaskData) -> bool:
    """True when a client holds several tasks that label the very same inputs (one dataset, many labels)."""
    inputs = [x for x, _ in data.values()]
    first = inputs[0] if inputs else None
    return len(inputs) > 1 and all(
        x is first or (x.shape == first.shape and torch.equal(x, first)) for x in inputs[1:]
    )


def shuffled_indices(count: int, batch_size: int, seed: int, key: str) -> Iterator[Tensor]:
    """Endless shuffled mini-batches of indices; each pass over the data is a fresh seeded permutation."""
    return index_batches(count, batch_size, torch_generator(*stream_seed_request(seed, key)))


def stream_seed_request(seed: int, key: str) -> tuple[int, str, str]:
    """The `derive_seed` arguments of the stream `shuffled_indices(..., seed, key)` draws from."""
    return seed, "batches", key


def index_batches(count: int, batch_size: int, generator: torch.Generator) -> Iterator[Tensor]:
    """`shuffled_indices` from its seeded generator."""
    while True:
        order = torch.randperm(count, generator=generator)
        for start in range(0, count, batch_size):
            yield order[start : start + batch_size]


def shuffled_batches(x: Tensor, y: Tensor, batch_size: int, seed: int, task: str) -> Iterator[tuple[Tensor, Tensor]]:
    """Endless shuffled mini-batches of one task."""
    for chosen in shuffled_indices(len(y), batch_size, seed, task):
        chosen = chosen.to(x.device)  # the indices are drawn on the CPU
        yield x.index_select(0, chosen), y.index_select(0, chosen)  # the same gather as x[chosen], a third faster


@torch.no_grad()
def evaluate(model: nn.Module, spec: TaskSpec, x: Tensor, y: Tensor, batch_size: int = 512) -> dict[str, float]:
    """The task's metrics of `model` on (x, y) over the whole set (means over samples, or dataset-level metrics
    such as mIoU and odsF for dense tasks)."""
    model.eval()
    meter = spec.meter()
    for start in range(0, len(y), batch_size):
        outputs = model(x[start : start + batch_size], spec.name)
        meter.update(outputs, y[start : start + batch_size])
        record_prediction(spec, x[start : start + batch_size], y[start : start + batch_size], outputs)
    return meter.result()

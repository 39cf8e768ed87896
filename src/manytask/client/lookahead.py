"""Lookahead measurements inside a local step: the step's task losses after one plain SGD step of the shared
parameters on each task's loss alone (MAS's and TAG's inter-task affinity, shared/specs/mas.md), taken without
moving the model.

    after[i, j] = L_j(X, θ_s^{+i}, θ_j),   θ_s^{+i} = θ_s − lr·(∇_{θ_s} L_i + wd·θ_s),   base[j] = L_j(X, θ_s, θ_j)

(weight decay, no momentum). A `LookaheadProbe` names how often it measures and what it makes of (base, after, lr)
(`piece`, the only place a method's arithmetic is written). The sequential trainer runs it as a hook
(`before_backward`, from the step's own forward pass: the shifted parameters and copies of the buffers are
substituted for one functional forward pass, so the model after a measurement is the model before it, bit for bit);
the batched executor measures every client of a round at once (`execution/probes.py`) with the same piece."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call

from manytask.client.trainer import StepContext, TrainHook
from manytask.models.multitask import task_of_key

ProbePiece = Callable[[Tensor, Tensor, float], Tensor]  # (base (T,), after (T, T), lr) -> scores (T, T)


class _Heads(nn.Module):
    """A forward of several heads on one batch (the encoder once), for `functional_call`."""

    def __init__(self, model: nn.Module, tasks: Sequence[str]) -> None:
        super().__init__()
        self.model = model
        self.tasks = list(tasks)

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        many = getattr(self.model, "forward_many", None)
        if many is not None:
            return {t: out for t, (out, _) in many(x, self.tasks).items()}
        return {t: self.model(x, t) for t in self.tasks}


def shared_parameters(model: nn.Module) -> dict[str, Tensor]:
    """The trainable parameters no task owns (the encoder θ_s), by name."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad and task_of_key(n) is None}


def lookahead_losses(step: StepContext, specs: Mapping, weight_decay: float) -> tuple[Tensor, Tensor]:
    """(base, after) for the tasks of `step`, in its order, from the step's own forward pass."""
    tasks = list(step.losses)
    shared = shared_parameters(step.model)
    names, params = list(shared), list(shared.values())
    buffers = dict(step.model.named_buffers())
    heads = _Heads(step.model, tasks)
    base = torch.stack([step.losses[t].detach() for t in tasks])
    after = []
    for task in tasks:
        grads = torch.autograd.grad(step.losses[task], params, retain_graph=True, allow_unused=True)
        shifted = {
            f"model.{n}": (p - step.lr * ((torch.zeros_like(p) if g is None else g) + weight_decay * p)).detach()
            for n, p, g in zip(names, params, grads, strict=True)
        }
        copies = {f"model.{n}": b.clone() for n, b in buffers.items()}  # BN statistics stay untouched
        with torch.no_grad():
            outputs = functional_call(heads, {**shifted, **copies}, (shared_input(step),))
            after.append(torch.stack([specs[t].loss(outputs[t], step.batches[t][1]) for t in tasks]))
    return base, torch.stack(after)


def shared_input(step: StepContext) -> Tensor:
    """The step's batch of images; a lookahead needs every task on the same images (one dataset, many labels)."""
    inputs = [x for x, _ in step.batches.values()]
    if any(x is not inputs[0] for x in inputs[1:]):
        raise ValueError("lookahead affinity needs every task on the same batch: the client's tasks must label the "
                         "same images (e.g. federation.samples: {kind: natural} on scenes buildings)")
    return inputs[0]


class LookaheadProbe(TrainHook):
    """Measures `piece(base, after, lr)` every `every` local steps (the first step included) of a client holding at
    least two tasks, and keeps the sum and the count of its measurements."""

    def __init__(self, specs: Mapping, every: int, weight_decay: float, piece: ProbePiece) -> None:
        self.specs, self.every, self.weight_decay, self.piece = specs, every, weight_decay, piece
        self.total: Tensor | None = None
        self.count = 0
        self.tasks: list[str] = []

    def measures(self, step: int, tasks: int) -> bool:
        """Whether local step `step` (0-based) of a client holding `tasks` tasks is measured."""
        return step % self.every == 0 and tasks >= 2

    def before_backward(self, step: StepContext) -> None:
        if not self.measures(step.step, len(step.losses)):
            return
        scores = self.piece(*lookahead_losses(step, self.specs, self.weight_decay), step.lr)
        self.tasks = list(step.losses)
        self.total = scores if self.total is None else self.total + scores
        self.count += 1

    def mean(self) -> Tensor | None:
        """The mean of the measurements over the client's tasks in the order it holds them (None: none made)."""
        return None if self.total is None else self.total / self.count

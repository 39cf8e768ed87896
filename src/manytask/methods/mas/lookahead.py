"""Lookahead inter-task affinity (MAS, shared/specs/mas.md; TAG, Fifty et al. 2021), measured inside the trainer's
step with the forward pass it already did.

S_{i→j} = 1 − L_j(X, θ_s^{+i}, θ_j) / L_j(X, θ_s, θ_j), θ_s^{+i} = θ_s − lr·(∇_{θ_s} L_i + wd·θ_s): one plain SGD step
(weight decay, no momentum) of the shared encoder on task i's loss alone. The encoder is never written: the shifted
parameters and copies of the buffers are substituted for one functional forward pass, so the model after a
measurement is the model before it, bit for bit, and training takes exactly the steps it would without measuring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call

from manytask.client.trainer import StepContext, TrainHook
from manytask.models.multitask import task_of_key

AFFINITY_PREFIX = "affinity/"  # reply scalars and server log: affinity/<i>/<j> = S_{i→j}


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


def lookahead_affinity(step: StepContext, specs: Mapping, weight_decay: float, per_lr: bool) -> Tensor:
    """S[i, j] = S_{i→j} for the tasks of `step` (in its order; diagonal 0), from the step's own forward pass.
    `per_lr` divides by the step's lr (the reference code's normalization, comparable across the lr schedule)."""
    tasks = list(step.losses)
    shared = shared_parameters(step.model)
    names, params = list(shared), list(shared.values())
    buffers = dict(step.model.named_buffers())
    heads = _Heads(step.model, tasks)
    base = torch.stack([step.losses[t].detach() for t in tasks])
    scores = torch.zeros(len(tasks), len(tasks))
    for i, task in enumerate(tasks):
        grads = torch.autograd.grad(step.losses[task], params, retain_graph=True, allow_unused=True)
        shifted = {
            f"model.{n}": (p - step.lr * ((torch.zeros_like(p) if g is None else g) + weight_decay * p)).detach()
            for n, p, g in zip(names, params, grads, strict=True)
        }
        copies = {f"model.{n}": b.clone() for n, b in buffers.items()}  # BN statistics stay untouched
        with torch.no_grad():
            outputs = functional_call(heads, {**shifted, **copies}, (_shared_input(step),))
            after = torch.stack([specs[t].loss(outputs[t], step.batches[t][1]) for t in tasks])
        scores[i] = 1 - after / base
        scores[i, i] = 0.0
    return scores / step.lr if per_lr else scores


def _shared_input(step: StepContext) -> Tensor:
    """The step's batch of images; affinity needs every task on the same images (one dataset, many labels)."""
    inputs = [x for x, _ in step.batches.values()]
    if any(x is not inputs[0] for x in inputs[1:]):
        raise ValueError("lookahead affinity needs every task on the same batch: the client's tasks must label the "
                         "same images (e.g. federation.samples: {kind: natural} on scenes buildings)")
    return inputs[0]


class AffinityHook(TrainHook):
    """Measures S every `every` local steps (the first step included) and keeps the running mean."""

    def __init__(self, specs: Mapping, every: int, weight_decay: float, per_lr: bool = True) -> None:
        self.specs, self.every, self.weight_decay, self.per_lr = specs, every, weight_decay, per_lr
        self.total: Tensor | None = None
        self.count = 0
        self.tasks: list[str] = []

    def before_backward(self, step: StepContext) -> None:
        if step.step % self.every or len(step.losses) < 2:
            return
        scores = lookahead_affinity(step, self.specs, self.weight_decay, self.per_lr)
        self.tasks = list(step.losses)
        self.total = scores if self.total is None else self.total + scores
        self.count += 1

    def scalars(self) -> dict[str, float]:
        """The mean S over the measured steps, as `affinity/<i>/<j>` scalars (none if nothing was measured)."""
        if self.total is None:
            return {}
        mean = self.total / self.count
        return {f"{AFFINITY_PREFIX}{a}/{b}": float(mean[i, j])
                for i, a in enumerate(self.tasks) for j, b in enumerate(self.tasks) if i != j}


def affinity_matrix(scalars: Mapping[str, float], tasks: Sequence[str]) -> Tensor | None:
    """S[i, j] from `affinity/<i>/<j>` scalars over `tasks` (None when any pair is missing)."""
    scores = torch.zeros(len(tasks), len(tasks), dtype=torch.float64)
    for i, a in enumerate(tasks):
        for j, b in enumerate(tasks):
            if i != j:
                key = f"{AFFINITY_PREFIX}{a}/{b}"
                if key not in scalars:
                    return None
                scores[i, j] = float(scalars[key])
    return scores

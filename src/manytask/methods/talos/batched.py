"""TaLoS's calibration of a round's clients as one computation (an executor's `WorkPlan`, execution/plan.py).

Each client's scored weights are stacked, (clients, ...), and every calibration round scores them all at once: per
task, the (client, task) pairs' examples are padded to one length (padding weighs 0), the labels are drawn from each
pair's own predictive distribution, and the per-example gradients come from one `vmap` over pairs of a `vmap` over
examples of `grad`. The nested ranking and the soft-zeroing are talos/mask.py's `nested_calibration`, row by row.
Each client draws its labels' randomness from its own generator in the order its `calibrate_mask` draws it (round,
then task), with the algorithm of `torch.multinomial` (`labels_from`), so a client's mask is the one it computes
alone, up to float rounding of the scores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from manytask.execution.budget import ACTIVATION_COPIES, activation_bytes
from manytask.execution.plan import Unbatchable
from manytask.methods.talos.mask import Masks, evaluating, labels_from, log_probability, nested_calibration
from manytask.models.multitask import head_prefix

# per-example gradients, their squares and their weighted squares, per scored entry
PER_EXAMPLE_COPIES = 3


@dataclass(frozen=True)
class Settings:
    """What every client of a calibration shares (talos/mask.py's `calibrate_mask` arguments)."""

    sparsity: float
    rounds: int
    soft_zero: float
    per_layer: bool
    raw_logit: bool


@dataclass
class Calibration:
    """One client's calibration: the model (`template` gives the structure and the weights no client changes, `start`
    the client's values of the scored weights, its tasks' heads and the buffers), its (task, inputs) examples, the
    classes of each task, and the seed of its label draws."""

    template: nn.Module
    start: Mapping[str, Tensor]
    batches: list[tuple[str, Tensor]]
    names: tuple[str, ...]  # the scored parameters, in model order
    classes: Mapping[str, int]
    settings: Settings
    seed: int

    def bytes(self) -> int:
        """The estimated memory of this client in a batched calibration: per example, its gradient of every scored
        entry (`PER_EXAMPLE_COPIES` times) and its forward pass's activations (`ACTIVATION_COPIES` times: the
        examples' passes run at once under `vmap`, each kept for its own backward), and the client's values."""
        scored = sum(self.start[n].numel() * self.start[n].element_size() for n in self.names)
        examples = sum(len(x) for _, x in self.batches)
        values = sum(t.numel() * t.element_size() for t in self.start.values())
        activations = sum(len(x) * activation_bytes(self.template, (task,), tuple(x.shape[1:]), x.dtype)
                          for task, x in self.batches)
        return PER_EXAMPLE_COPIES * examples * scored + ACTIVATION_COPIES * activations + 4 * values


@dataclass
class TaskGroup:
    """The (client, task) pairs of one task: their examples padded to one length, and their label draws."""

    task: str
    clients: Tensor  # (pairs,) the client of each pair
    x: Tensor  # (pairs, examples, ...) padded with zeros
    weight: Tensor  # (pairs, examples) 1 on real examples, 0 on padding
    draws: Tensor  # (rounds, pairs, examples, classes) Exp(1) draws, 1 on padding
    values: dict[str, Tensor]  # per pair, its values of the head and of the buffers, (pairs, ...)


def calibrate_many(plans: Sequence[Calibration]) -> list[Masks]:
    """Every client's TaLoS mask (True = trainable), as each one's `calibrate_mask` computes it alone."""
    first = plans[0]
    if any((p.template, p.names, p.settings) != (first.template, first.names, first.settings) for p in plans):
        raise Unbatchable("clients of the round calibrate different models or settings")
    settings, template = first.settings, first.template
    original = {n: torch.stack([p.start[n] for p in plans]) for n in first.names}
    groups = _task_groups(plans)
    device = original[first.names[0]].device
    counts = torch.tensor([max(sum(len(x) for _, x in p.batches), 1) for p in plans], device=device)
    frozen = {n: p.detach() for n, p in template.named_parameters() if n not in original}
    rounds = iter(range(settings.rounds))

    def scores_at(weights: Masks) -> dict[str, Tensor]:
        r = next(rounds)
        totals = {n: torch.zeros_like(w) for n, w in weights.items()}
        for group in groups:
            for name, squares in _squared_gradients(template, frozen, group, weights, r, settings.raw_logit).items():
                totals[name].index_add_(0, group.clients, squares)
        return {n: total / counts.view(-1, *[1] * (total.dim() - 1)) for n, total in totals.items()}

    with evaluating(template):
        masks = nested_calibration(scores_at, original, settings.sparsity, settings.rounds, settings.soft_zero,
                                   settings.per_layer)
    return [{n: mask[c] for n, mask in masks.items()} for c in range(len(plans))]


def _task_groups(plans: Sequence[Calibration]) -> list[TaskGroup]:
    """One group per task, its pairs in client order; each client's draws made in its own calibration's order."""
    rounds = plans[0].settings.rounds
    pairs: dict[str, list[tuple[int, Tensor]]] = {}
    for c, plan in enumerate(plans):
        for task, x in plan.batches:
            pairs.setdefault(task, []).append((c, x))
    groups = {}
    for task, members in pairs.items():
        length = max(len(x) for _, x in members)
        x0 = members[0][1]
        x = x0.new_zeros((len(members), length, *x0.shape[1:]))
        weight = torch.zeros(len(members), length, device=x0.device)
        for p, (_, xs) in enumerate(members):
            x[p, : len(xs)] = xs
            weight[p, : len(xs)] = 1
        heads = [n for n in plans[0].start if n.startswith(head_prefix(task))]
        buffers = [n for n, _ in plans[0].template.named_buffers()]
        values = {n: torch.stack([plans[c].start[n] for c, _ in members]) for n in [*heads, *buffers]}
        draws = torch.ones(rounds, len(members), length, plans[members[0][0]].classes[task])
        groups[task] = TaskGroup(task, torch.tensor([c for c, _ in members], device=x0.device), x, weight, draws,
                                 values)
    place = {(task, c): p for task, members in pairs.items() for p, (c, _) in enumerate(members)}
    for c, plan in enumerate(plans):
        generator = torch.Generator().manual_seed(plan.seed)
        for r in range(rounds):
            for task, x in plan.batches:
                groups[task].draws[r, place[task, c], : len(x)].exponential_(1, generator=generator)
    for group in groups.values():
        group.draws = group.draws.to(group.x.device)
    return list(groups.values())


def _squared_gradients(template: nn.Module, frozen: Mapping[str, Tensor], group: TaskGroup, weights: Masks,
                       round_index: int, raw_logit: bool) -> dict[str, Tensor]:
    """Per pair of `group`, Σ over its examples of the squared per-example gradient of log p(ŷ | x), ŷ drawn from
    the pair's model (its client's current `weights`)."""
    scored = {n: w.index_select(0, group.clients) for n, w in weights.items()}
    task = group.task

    def logits(own: dict[str, Tensor], values: dict[str, Tensor], x: Tensor) -> Tensor:
        return functional_call(template, {**frozen, **values, **own}, (x, task))

    with torch.no_grad():
        probabilities = torch.softmax(vmap(logits)(scored, group.values, group.x).float(), dim=-1)
    labels = labels_from(probabilities, group.draws[round_index])

    def score(own: dict[str, Tensor], values: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
        return log_probability(logits(own, values, xi.unsqueeze(0))[0], yi, raw_logit)

    per_example = vmap(vmap(grad(score), in_dims=(None, None, 0, 0)))(scored, group.values, group.x, labels)
    weight = group.weight
    return {n: (g.pow(2) * weight.view(*weight.shape, *[1] * (g.dim() - 2))).sum(dim=1)
            for n, g in per_example.items()}

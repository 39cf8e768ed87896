"""Vectorized clients (`execution: vectorized`): the clients of a round trained as one batched computation.

Every trainable parameter is stacked over clients, (C, ...). A local step runs each task's forward pass for all
clients at once (`torch.func.functional_call` under `vmap`), on padded batches whose per-sample weights make each
client's task loss its own batch mean (1/n on its n real samples, 0 on padding and on tasks it does not hold). One
backward pass of the sum over clients gives every client its own gradients, because the slices are independent.
The SGD step (momentum, weight decay, as `torch.optim.SGD`) is applied per slice under a mask: a client whose own
steps are done, or a parameter it does not train (the head of a task it does not hold), keeps its values. So each
client takes exactly its own steps on exactly its own batches, drawn from the same seeded streams as the sequential
trainer's.

The result equals sequential training up to float rounding: sums over a batch run in another order. With float32
MLPs the trained parameters agree to `TOLERANCE` (tests/test_vectorized.py measures it).

What vectorizes: models without buffers (no batch-norm statistics) and without dropout, classification and
regression tasks, the config's SGD without gradient clipping, the default sum of task losses, and hooks that are
`ParameterTerm`s (FedProx's proximal term, FedDyn's linear term). Anything else raises `NotVectorizable` with the
reason, and the engine trains those clients one after another.

This module holds the jobs, the stacking, the masked SGD and the loop; the batches are planned in
`client/batch_plans.py`, and plain chains (MLPs) take the fast path of `client/plain_chain.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from manytask.client.batch_plans import SAMPLE_LOSSES, StepLosses, TaskPlan, batch_plans
from manytask.client.plain_chain import Gathered, MergedHeads, Pass, chain_passes
from manytask.client.trainer import ParameterTerm, TaskData, Trainer, TrainReport
from manytask.models.multitask import task_of_key
from manytask.tasks.task import TaskSpec

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}  # vectorized vs sequential trained parameters (float32)


class NotVectorizable(Exception):
    """Raised before anything changes when a round's clients cannot train as one batched computation; the message
    says why, and the engine trains them one after another instead."""


@dataclass
class ClientJob:
    """One client's local training in a vectorized round."""

    data: TaskData  # task -> (x, y) of the tasks it trains, in the order it holds them
    start: dict[str, Tensor]  # its initial value of every trainable parameter
    seed: int
    terms: list[ParameterTerm] = field(default_factory=list)


@dataclass
class JobResult:
    params: dict[str, Tensor]  # the trained value of every trainable parameter
    report: TrainReport


def check_model(model: nn.Module) -> None:
    """Raise `NotVectorizable` for a model whose forward pass a batched computation cannot reproduce per client."""
    if any(True for _ in model.buffers()):
        raise NotVectorizable("the model has buffers (batch-norm statistics), which each client updates on its own")
    if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        raise NotVectorizable("the model uses dropout, whose random masks follow one client's generator")


def check_trainer(trainer: Trainer, specs: Mapping[str, TaskSpec]) -> None:
    config = trainer.config
    if config.optimizer != "sgd":
        raise NotVectorizable(f"optimizer '{config.optimizer}' has no vectorized step (sgd has)")
    if config.grad_clip is not None:
        raise NotVectorizable("gradient clipping is per client")
    dense = [name for name, spec in specs.items() if spec.kind not in SAMPLE_LOSSES]
    if dense:
        raise NotVectorizable(f"tasks {dense} have no per-sample loss (dense tasks)")


def train_vectorized(
    template: nn.Module, trainer: Trainer, jobs: Sequence[ClientJob], round_index: int, total_rounds: int,
) -> list[JobResult]:
    """Train every job from its `start` as `trainer.train` would, all in one batched computation; `template` only
    gives the model's structure (its values of the trained parameters are never used, nor changed).

    Clients are ordered by their number of steps, most first, so the clients still training at any step are a
    prefix of the stack: each step differentiates and updates views of that prefix only."""
    check_model(template)
    check_trainer(trainer, {t: trainer.specs[t] for job in jobs for t in job.data})
    names = list(jobs[0].start)
    if any(list(job.start) != names for job in jobs):
        raise NotVectorizable("clients of the round train different parameters")
    own_steps = [trainer.num_steps(job.data) for job in jobs]
    rank = {task: i for i, task in enumerate(trainer.specs)}
    first = [min(rank[t] for t in job.data) for job in jobs]
    order = sorted(range(len(jobs)), key=lambda c: (-own_steps[c], first[c]))
    jobs = [jobs[c] for c in order]
    steps = [own_steps[c] for c in order]
    params = {n: torch.stack([job.start[n] for job in jobs]) for n in names}
    terms = _stacked_terms(jobs, params)
    config = trainer.config
    masked = bool(config.weight_decay or terms)  # only then can a head move without its own task's loss
    trains = {n: _trains_mask(n, jobs, params[n]) if masked else None for n in names}
    plans = batch_plans(trainer, jobs, steps)
    passes = chain_passes(template, plans, params, steps)
    heads = None if passes is None else MergedHeads(plans)
    if heads is not None:
        params = heads.merge(params)
        trains = heads.merge(trains) if masked else dict.fromkeys(params)
    else:
        for plan in plans.values():
            plan.finish()
    names = list(params)  # the leaves: parameters, or (plain chains) the merged head in place of the heads
    lr = config.lr_at(round_index, total_rounds)
    buffers: list[Tensor] = []  # momentum, every client's, by name
    device = next(iter(params.values())).device
    recorded: StepLosses = []  # every step's (task columns, client rows, losses), summed per client and task at the end
    for step in range(steps[0]):
        active = sum(count > step for count in steps)
        live = {n: p[:active].detach().requires_grad_() for n, p in params.items()}  # views of the prefix
        named = live if heads is None else heads.views(live)
        gathered: Gathered = []
        losses = step_losses(template, plans, live, step, passes, gathered)
        parts = [row_loss.sum() for _, _, row_loss in losses]
        loss = parts[0] if len(parts) == 1 else torch.stack(parts).sum()
        for term in terms:
            loss = loss + term(named, active)
        grads = list(torch.autograd.grad(loss, [live[n] for n in names] + [leaf for _, _, leaf in gathered],
                                         allow_unused=True, materialize_grads=True))
        with torch.no_grad():
            for (name, rows, _), grad in zip(gathered, grads[len(names):], strict=True):
                grads[names.index(name)].index_add_(0, rows, grad)
            grads = grads[: len(names)]
            recorded.extend((columns, rows, row_loss.detach()) for columns, rows, row_loss in losses)
            masks = [None if trains[n] is None else trains[n][:active] for n in names]
            buffers = _sgd_step([live[n] for n in names], grads, buffers, masks, config.momentum,
                                config.weight_decay, lr)
    totals = _loss_totals(recorded, len(jobs), len(plans), device)
    return _results(jobs, order, params if heads is None else heads.views(params), list(plans), totals, steps)


def _loss_totals(recorded: StepLosses, clients: int, tasks: int, device: torch.device) -> Tensor:
    """Per client and task, the sum of its losses over the steps, (clients, tasks), in float64. One accumulating
    `index_put_` adds them in the order recorded (the CPU kernel accumulates serially), as one per step would."""
    totals = torch.zeros(clients, tasks, dtype=torch.float64, device=device)
    if recorded:
        columns, rows, losses = (torch.cat(part) for part in zip(*recorded, strict=True))
        totals.index_put_((rows, columns), losses.double(), accumulate=True)
    return totals


def _results(jobs: Sequence[ClientJob], order: list[int], params: Mapping[str, Tensor], tasks: list[str],
             totals: Tensor, steps: list[int]) -> list[JobResult]:
    """Each client's trained parameters (views of the stack, which changes no more) and report, in the callers'
    order."""
    per_client = {n: p.unbind(0) for n, p in params.items()}
    mean = dict(zip(tasks, totals.T.tolist(), strict=True))
    results: list[JobResult | None] = [None] * len(jobs)
    for c, (job, original) in enumerate(zip(jobs, order, strict=True)):
        losses = {task: mean[task][c] / max(steps[c], 1) for task in job.data}
        results[original] = JobResult({n: rows[c] for n, rows in per_client.items()}, TrainReport(steps[c], losses))
    return results  # type: ignore[return-value]


def _sgd_step(params: list[Tensor], grads: list[Tensor], buffers: list[Tensor], masks: list[Tensor | None],
              momentum: float, weight_decay: float, lr: float) -> list[Tensor]:
    """`torch.optim.SGD`'s update (no dampening, no Nesterov; the same arithmetic, element by element) on the
    training prefix of the stack, in place, moving only the clients where a mask is 1 (all where it is None).
    Returns the momentum buffers, which hold every client: the prefix only shrinks, so each client's buffer is its
    own from its first step."""
    if weight_decay:
        grads = torch._foreach_add(grads, params, alpha=weight_decay)
    if momentum:
        if not buffers:  # the first step's gradients become the buffers: autograd made them for this step alone
            buffers = grads
        else:
            prefix = [buffer[: len(grad)] for buffer, grad in zip(buffers, grads, strict=True)]
            torch._foreach_mul_(prefix, momentum)
            torch._foreach_add_(prefix, grads)
        grads = [buffer[: len(grad)] for buffer, grad in zip(buffers, grads, strict=True)]
    steps = [grad if mask is None else grad * mask for grad, mask in zip(grads, masks, strict=True)]
    torch._foreach_add_(params, steps, alpha=-lr)
    return buffers


def _broadcast(per_client: Tensor, like: Tensor) -> Tensor:
    return per_client.view(-1, *([1] * (like.dim() - 1)))


def _trains_mask(name: str, jobs: Sequence[ClientJob], like: Tensor) -> Tensor | None:
    """1 for the clients that train `name`, a head only its task's holders; None for a shared parameter (all).
    Needed only with weight decay or parameter terms: without them the gradient of a head a client does not hold is
    exactly zero (its loss never reads that head), so its momentum stays zero and the head does not move."""
    task = task_of_key(name)
    if task is None:
        return None
    return _broadcast(torch.tensor([task in job.data for job in jobs], dtype=like.dtype, device=like.device), like)


Term = Callable[[Mapping[str, Tensor], int], Tensor]


def _stacked_terms(jobs: Sequence[ClientJob], params: Mapping[str, Tensor]) -> list[Term]:
    """Each hook position's parameter terms over all clients, as one function of (the stack's training prefix, its
    length) per position."""
    kinds = {tuple(type(term) for term in job.terms) for job in jobs}
    if len(kinds) > 1:
        raise NotVectorizable("clients of the round have different training hooks")
    closures = []
    for position in range(len(jobs[0].terms)):
        per_client = [job.terms[position] for job in jobs]
        keys = list(dict.fromkeys(k for term in per_client for k in term.operands))
        unknown = [k for k in keys if k not in params]
        if unknown:
            raise NotVectorizable(f"a hook's term covers parameters that are not trained ({unknown[:2]})")
        operands = {k: torch.stack([t.operands.get(k, torch.zeros_like(params[k][0])) for t in per_client])
                    for k in keys}
        present = {k: _broadcast(torch.tensor([k in t.operands for t in per_client], dtype=params[k].dtype,
                                              device=params[k].device), params[k]) for k in keys}
        closures.append(_closure(per_client[0], operands, present))
    return closures


def _closure(term: ParameterTerm, operands: dict[str, Tensor], present: dict[str, Tensor]) -> Term:
    def evaluate(live: Mapping[str, Tensor], active: int) -> Tensor:
        return term.batched_loss(live, {k: v[:active] for k, v in operands.items()},
                                 {k: v[:active] for k, v in present.items()})

    return evaluate


def step_losses(
    template: nn.Module, plans: Mapping[str, TaskPlan], params: Mapping[str, Tensor], step: int,
    passes: list[list[Pass]] | None, gathered: Gathered,
) -> StepLosses:
    """Every (task column, client row, mean loss) of the batches at `step`, as three aligned tensors: through the
    passes of a plain chain when there are any (their gathered leaves appended to `gathered`), else each task through
    `vmap` on the rows that take a batch of it."""
    if passes is None:
        return [(torch.full_like(rows, column), rows, row_loss)
                for column, plan in enumerate(plans.values()) if plan.live(step)
                for rows, row_loss in [plan.losses(template, params, step)]]
    losses = []
    for batch in passes[step]:
        losses.extend(batch.losses(template, params, gathered))
    return losses

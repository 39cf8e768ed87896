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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.nn.utils.rnn import pad_sequence

from manytask.client.trainer import ParameterTerm, TaskData, Trainer, TrainReport, shares_inputs, shuffled_indices
from manytask.models.multitask import task_of_key
from manytask.tasks.task import TaskKind, TaskSpec

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
    trains = {n: _trains_mask(n, jobs, params[n]) for n in names}
    plans = _batch_plans(trainer, jobs, steps)
    passes = _passes(template, plans, params, steps)
    if passes is None:
        for plan in plans.values():
            plan.finish()
    terms = _stacked_terms(jobs, params)
    config = trainer.config
    lr = config.lr_at(round_index, total_rounds)
    buffers: list[Tensor] = []  # momentum, every client's, by name
    device = next(iter(params.values())).device
    totals = torch.zeros(len(jobs), len(plans), dtype=torch.float64, device=device)  # client x task loss sums
    for step in range(steps[0]):
        active = sum(count > step for count in steps)
        live = {n: p[:active].detach().requires_grad_() for n, p in params.items()}  # views of the prefix
        losses = step_losses(template, plans, live, step, passes)
        loss = torch.stack([row_loss.sum() for _, _, row_loss in losses]).sum()
        for term in terms:
            loss = loss + term(live, active)
        grads = torch.autograd.grad(loss, [live[n] for n in names], allow_unused=True, materialize_grads=True)
        with torch.no_grad():
            for columns, rows, row_loss in losses:
                totals.index_put_((rows, columns), row_loss.detach().double(), accumulate=True)
            masks = [None if trains[n] is None else trains[n][:active] for n in names]
            buffers = _sgd_step([live[n] for n in names], list(grads), buffers, masks, config.momentum,
                                config.weight_decay, lr)
    return _results(jobs, order, params, list(plans), totals, steps)


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
        if not buffers:
            buffers = [grad.clone() for grad in grads]
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
    """1 for the clients that train `name`, a head only its task's holders; None for a shared parameter (all)."""
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


def _cross_entropy(outputs: Tensor, targets: Tensor) -> Tensor:
    return nn.functional.cross_entropy(outputs, targets, reduction="none")


def _squared_error(outputs: Tensor, targets: Tensor) -> Tensor:
    return (outputs - targets.view_as(outputs)).pow(2).flatten(1).mean(1)


# per-sample losses whose batch mean is `TaskSpec.loss`
SAMPLE_LOSSES: dict[TaskKind, Callable[[Tensor, Tensor], Tensor]] = {
    TaskKind.CLASSIFICATION: _cross_entropy, TaskKind.REGRESSION: _squared_error,
}


def _padded(batches: list[Tensor], batch: int, like: Tensor) -> tuple[Tensor, Tensor]:
    """Index batches padded to `batch`, (rows, batch), and their per-sample weights: 1/n on a row's n real samples,
    0 on padding (in `like`'s floating dtype, on its device)."""
    dtype = like.dtype if like.is_floating_point() else torch.get_default_dtype()
    if not batches:
        return (torch.zeros(0, batch, dtype=torch.long, device=like.device),
                torch.zeros(0, batch, dtype=dtype, device=like.device))
    lengths = [b.shape[0] for b in batches]
    index = nn.functional.pad(pad_sequence(batches, batch_first=True), (0, batch - max(lengths)))
    counts = torch.tensor(lengths)[:, None].to(dtype)
    weight = (torch.arange(batch) < counts).to(dtype) / counts
    return index.to(like.device), weight.to(like.device)


class TaskPlan:
    """One task's batches: per step, the clients that take a batch of this task (they hold it and have steps left),
    their indices into the task's data of all clients concatenated, (rows, batch), and per-sample weights (1/n on a
    client's n real samples, 0 on padding). Only those clients run the task's forward pass, so the batched work is
    the sequential work plus padding."""

    def __init__(self, task: str, spec: TaskSpec, x: Tensor, y: Tensor, steps: int, batch: int) -> None:
        self.task, self.x, self.y, self.batch, self.outputs, self.kind = task, x, y, batch, spec.num_outputs, spec.kind
        self.sample_loss = SAMPLE_LOSSES[spec.kind]
        self.placed: list[list[tuple[int, Tensor]]] = [[] for _ in range(steps)]  # step -> [(client, indices)]

    def place(self, step: int, client: int, chosen: Tensor, offset: int) -> None:
        self.placed[step].append((client, chosen + offset))

    def finish(self) -> None:
        """Stack each step's placed batches into rows, (rows,), indices and weights, (rows, batch)."""
        self.steps = [self._stacked(placed) for placed in self.placed]

    def _stacked(self, placed: list[tuple[int, Tensor]]) -> tuple[Tensor, Tensor, Tensor]:
        rows = torch.tensor([client for client, _ in placed], dtype=torch.long, device=self.x.device)
        return rows, *_padded([chosen for _, chosen in placed], self.batch, self.x)

    def live(self, step: int) -> bool:
        return len(self.steps[step][0]) > 0

    def losses(self, template: nn.Module, params: Mapping[str, Tensor], step: int) -> tuple[Tensor, Tensor]:
        """(the clients that take a batch of this task at `step`, each one's mean loss on it), the forward pass
        through `functional_call` under `vmap`."""
        rows, index, _ = self.steps[step]
        used = {k: p.index_select(0, rows) for k, p in params.items() if task_of_key(k) in (None, self.task)}

        def one(client_params: dict[str, Tensor], client_x: Tensor) -> Tensor:
            return functional_call(template, client_params, (client_x, self.task), strict=False)

        return rows, self.mean_losses(vmap(one)(used, self.x[index]), step)

    def mean_losses(self, outputs: Tensor, step: int) -> Tensor:
        """Each row's weighted mean loss at `step` from its outputs, (rows, batch, ...)."""
        _, index, weight = self.steps[step]
        per_sample = self.sample_loss(outputs.flatten(0, 1), self.y[index].flatten(0, 1)).view(index.shape)
        return (per_sample * weight).sum(dim=1)


StepLosses = list[tuple[Tensor, Tensor, Tensor]]  # (task columns, client rows, losses), aligned


def step_losses(
    template: nn.Module, plans: Mapping[str, TaskPlan], params: Mapping[str, Tensor], step: int,
    passes: list[list[Pass]] | None,
) -> StepLosses:
    """Every (task column, client row, mean loss) of the batches at `step`, as three aligned tensors: through the
    passes of a plain chain when there are any, else each task through `vmap` on the rows that take a batch of it."""
    if passes is None:
        return [(torch.full_like(rows, column), rows, row_loss)
                for column, plan in enumerate(plans.values()) if plan.live(step)
                for rows, row_loss in [plan.losses(template, params, step)]]
    losses = []
    for batch in passes[step]:
        losses.extend(batch.losses(template, params))
    return losses


class Round:
    """Every step's batches of a round on a plain chain (`plain_chain`), built at once: for each row (a batch of one
    client's task at one step), its client, its task's column, its inputs, its targets and its per-sample weights.
    For classification, also each row's own columns of the merged head (the heads of all the round's tasks, their
    weights concatenated along the outputs) and the −∞ mask of the padding between them."""

    def __init__(self, steps: list[list[tuple[int, str, Tensor]]], inputs: Inputs, plans: Mapping[str, TaskPlan]):
        every, starts = inputs
        rows = [row for step in steps for row in step]
        self.plans, self.tasks = plans, list(plans)
        self.sizes = [plans[task].outputs for task in self.tasks]
        device = every.device
        column = {task: i for i, task in enumerate(self.tasks)}
        index, self.weight = _padded([chosen + starts[task] for _, task, chosen in rows],
                                     next(iter(plans.values())).batch, every)
        self.columns = torch.tensor([column[task] for _, task, _ in rows], device=device)
        firsts = torch.tensor([starts[task] for task in self.tasks], device=device)
        self.index = (index - firsts[self.columns][:, None]).clamp_(min=0)  # into each row's task's data
        self.x = every[index]
        self.clients = torch.tensor([client for client, _, _ in rows], device=device)
        self.rows_of = {task: (self.columns == column[task]).nonzero().squeeze(1) for task in self.tasks}
        classification = all(plans[task].kind is TaskKind.CLASSIFICATION for task in self.tasks)
        self.picks = self._picks() if classification else None
        self.passes = []
        begin = 0
        for step in steps:
            clients = [client for client, _, _ in step]
            prefix = next((row for row, client in enumerate(clients) if client != row), len(clients))
            self.passes.append(Pass(self, begin, begin + len(step), begin + prefix))
            begin += len(step)

    def _picks(self) -> tuple[Tensor, Tensor, Tensor]:
        """(each row's own columns of the merged head, padded, (rows, widest); the −∞ mask of the padding,
        (rows, 1, widest); each row's own targets, (rows, batch))."""
        device = self.x.device
        sizes = torch.tensor(self.sizes, device=device)
        slot = torch.arange(max(self.sizes), device=device)
        size = sizes[self.columns][:, None]
        picks = (sizes.cumsum(0) - sizes)[self.columns][:, None] + torch.minimum(slot, size - 1)
        mask = torch.zeros(picks.shape, dtype=self.weight.dtype, device=device).masked_fill_(slot >= size, -torch.inf)
        own = torch.zeros(self.index.shape, dtype=torch.long, device=device)
        for task, rows in self.rows_of.items():
            own.index_copy_(0, rows, self.plans[task].y[self.index.index_select(0, rows)])
        return picks, mask[:, None], own


class Pass:
    """One step of a `Round`, as one batched pass over its rows. The first rows are every client still training, in
    stack order, each with its first task's batch: they run on the stack's prefix itself, with no gather of
    parameters and no scatter of their gradients. The batches of the clients' further tasks follow as extra rows,
    whose parameters are gathered (few clients hold several tasks). The shared layers run once per row, then the
    merged head. Each row's loss is taken on its own task's outputs: for classification, one cross-entropy over every
    row, its own task's logits picked out and the others' masked to −∞; otherwise each task's loss on its slice,
    weighted to zero on the rows of other tasks."""

    def __init__(self, round_: Round, begin: int, end: int, extra_from: int) -> None:
        self.round, self.rows = round_, slice(begin, end)
        self.extra = round_.clients[extra_from:end] if extra_from < end else None

    def losses(self, template: nn.Module, params: Mapping[str, Tensor]) -> StepLosses:
        def used(key: str) -> Tensor:
            if self.extra is None:
                return params[key]
            return torch.cat([params[key], params[key].index_select(0, self.extra)])

        batches, rows = self.round, self.rows
        body = plain_chain(template, batches.tasks[0])[:-1]  # type: ignore[index]
        features = _run_chain(body, {k: used(k) for k in _chain_keys(body)}, batches.x[rows])
        heads = [f"heads.{task}" for task in batches.tasks]
        weight = torch.cat([used(f"{head}.weight") for head in heads], dim=1)
        bias = torch.cat([used(f"{head}.bias") for head in heads], dim=1)
        outputs = torch.baddbmm(bias.unsqueeze(1), features, weight.transpose(1, 2))
        clients, columns, sample_weight = batches.clients[rows], batches.columns[rows], batches.weight[rows]
        if batches.picks is not None:
            picks, mask, own = (part[rows] for part in batches.picks)
            logits = outputs.gather(2, picks[:, None, :].expand(-1, outputs.shape[1], -1)) + mask
            per_sample = nn.functional.cross_entropy(logits.flatten(0, 1), own.flatten(), reduction="none")
            return [(columns, clients, (per_sample.view(own.shape) * sample_weight).sum(dim=1))]
        losses = []
        for column, (task, task_outputs) in enumerate(zip(batches.tasks, outputs.split(batches.sizes, dim=2),
                                                          strict=True)):
            on_task = columns == column
            y = batches.plans[task].y[batches.index[rows].masked_fill(~on_task[:, None], 0)]
            per_sample = batches.plans[task].sample_loss(task_outputs.flatten(0, 1), y.flatten(0, 1))
            row_weight = sample_weight * on_task[:, None]
            losses.append((columns, clients, (per_sample.view(row_weight.shape) * row_weight).sum(dim=1)))
        return losses


Inputs = tuple[Tensor, dict[str, int]]  # every task's inputs concatenated, and the row where each task's start


def _passes(template: nn.Module, plans: Mapping[str, TaskPlan], params: Mapping[str, Tensor],
            steps: list[int]) -> list[list[Pass]] | None:
    """Every step's pass when every task's forward pass is a plain chain over trained parameters, else None."""
    chains = [plain_chain(template, task) for task in plans]
    if not all(chain is not None and all(k in params for k in _chain_keys(chain)) for chain in chains):
        return None
    sizes = [len(plan.x) for plan in plans.values()]
    inputs = (torch.cat([plan.x for plan in plans.values()]),
              dict(zip(plans, torch.tensor([0, *sizes[:-1]]).cumsum(0).tolist(), strict=True)))
    rows = []
    for step in range(steps[0]):
        placed: dict[int, list[tuple[str, Tensor]]] = {}
        for task, plan in plans.items():  # the setup's task order
            for client, chosen in plan.placed[step]:
                placed.setdefault(client, []).append((task, chosen))
        clients = sorted(placed)
        depths = max(len(batches) for batches in placed.values())
        rows.append([(c, *placed[c][depth]) for depth in range(depths) for c in clients if len(placed[c]) > depth])
    return [[step] for step in Round(rows, inputs, plans).passes]


Chain = list[tuple[str, nn.Module]]


def plain_chain(template: nn.Module, task: str) -> Chain | None:
    """A task's forward pass as (parameter prefix, layer) steps when it is a chain of linear, ReLU and flatten
    layers (an MLP backbone and a linear head with a bias), which run as batched matrix products without `vmap`'s
    tracing."""
    from manytask.models.backbones import MLP
    from manytask.models.multitask import MultiTaskModel

    if not isinstance(template, MultiTaskModel) or type(template.backbone) is not MLP or task in template.dense:
        return None
    head = template.heads[task]
    if not isinstance(head, nn.Linear) or head.bias is None:
        return None
    chain = [(f"backbone.layers.{name}", m) for name, m in template.backbone.layers.named_children()]
    chain.append((f"heads.{task}", head))
    return chain if all(isinstance(m, nn.Linear | nn.ReLU | nn.Flatten) for _, m in chain) else None


def _chain_keys(chain: Chain) -> list[str]:
    return [f"{prefix}.{name}" for prefix, m in chain if isinstance(m, nn.Linear) for name, _ in m.named_parameters()]


def _run_chain(chain: Chain, params: Mapping[str, Tensor], x: Tensor) -> Tensor:
    """`chain` on stacked inputs (clients, batch, ...) with stacked parameters (clients, ...)."""
    for prefix, layer in chain:
        if isinstance(layer, nn.Linear):
            weight = params[f"{prefix}.weight"].transpose(1, 2)
            bias = params.get(f"{prefix}.bias")
            x = torch.bmm(x, weight) if bias is None else torch.baddbmm(bias.unsqueeze(1), x, weight)
        elif isinstance(layer, nn.ReLU):
            x = torch.relu(x)
        else:  # Flatten, shifted by the clients' dimension
            x = x.flatten(layer.start_dim + 1, layer.end_dim if layer.end_dim < 0 else layer.end_dim + 1)
    return x


def _batch_plans(trainer: Trainer, jobs: Sequence[ClientJob], steps: list[int]) -> dict[str, TaskPlan]:
    """Each task's plan, filled from the same seeded streams `Trainer.train` draws (one shared stream of indices
    when a client's tasks label the same inputs)."""
    batch = trainer.config.batch_size
    tasks = [t for t in trainer.specs if any(t in job.data for job in jobs)]  # the setup's order, as `_passes`'
    offsets: list[dict[str, int]] = [{} for _ in jobs]
    plans = {}
    for task in tasks:
        holders = [c for c, job in enumerate(jobs) if task in job.data]
        sizes = [len(jobs[c].data[task][1]) for c in holders]
        for c, start in zip(holders, torch.tensor([0, *sizes[:-1]]).cumsum(0).tolist(), strict=True):
            offsets[c][task] = start
        x = torch.cat([jobs[c].data[task][0] for c in holders])
        y = torch.cat([jobs[c].data[task][1] for c in holders])
        plans[task] = TaskPlan(task, trainer.specs[task], x, y, max(steps), batch)
    for c, (job, own) in enumerate(zip(jobs, steps, strict=True)):
        if shares_inputs(job.data):
            stream = shuffled_indices(len(next(iter(job.data.values()))[1]), batch, job.seed, "shared")
            for step in range(own):
                chosen = next(stream)
                for task in job.data:
                    plans[task].place(step, c, chosen, offsets[c][task])
        else:
            streams = {t: shuffled_indices(len(y), batch, job.seed, t) for t, (_, y) in job.data.items()}
            for step in range(own):
                for task, stream in streams.items():
                    plans[task].place(step, c, next(stream), offsets[c][task])
    return plans

"""The fast path of vectorized clients: a task's forward pass that is a chain of linear, ReLU and flatten layers (an
MLP backbone and a linear head) runs as batched matrix products over stacked client parameters, one pass per
local step, without `vmap`'s tracing."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from manytask.client.batch_plans import StepLosses, TaskPlan, offsets, padded_batches
from manytask.tasks.task import TaskKind

# CPU kernels of log-softmax take a scalar path over rows narrower than one vector register (16 floats with AVX-512,
# measured here: 10 classes cost 9x what 16 do; an AVX2 register holds 8). Padding the picked logits to 16 with −∞
# (exp(−∞) adds exactly 0 to the softmax sum) keeps every row on the vector path.
SOFTMAX_WIDTH = 16


class Round:
    """Every step's batches of a round on a plain chain (`plain_chain`), built at once: for each row (a batch of one
    client's task at one step), its client, its task's column, its inputs, its targets and its per-sample weights.
    For classification, also each row's own columns of the merged head (the heads of all the round's tasks, their
    weights concatenated along the outputs) and the −∞ mask of the padding between them."""

    def __init__(self, steps: list[list[Row]], inputs: Inputs, plans: Mapping[str, TaskPlan]):
        every, starts = inputs
        rows = [row for step in steps for row in step]
        self.plans, self.tasks = plans, list(plans)
        self.sizes = [plans[task].outputs for task in self.tasks]
        device = every.device
        column = {task: i for i, task in enumerate(self.tasks)}
        index, self.weight = padded_batches([chosen for _, _, chosen, _ in rows], next(iter(plans.values())).batch,
                                            every)
        self.columns = torch.tensor([column[task] for _, task, _, _ in rows], device=device)
        self.index = index + offsets([offset for _, _, _, offset in rows], index)  # into each row's task's data
        within = index + offsets([starts[task] + offset for _, task, _, offset in rows], index)
        # index_select on the flat index (advanced indexing with a 2-D index is 4x slower here), of rows flattened to
        # one dimension (the kernel's copy per row of an image is twice as slow)
        self.x = every.flatten(1).index_select(0, within.flatten()).view(*within.shape, *every.shape[1:])
        self.clients = torch.tensor([client for client, _, _, _ in rows], device=device)
        self.rows_of = {task: (self.columns == column[task]).nonzero().squeeze(1) for task in self.tasks}
        classification = all(plans[task].kind is TaskKind.CLASSIFICATION for task in self.tasks)
        self.picks = self._picks() if classification else None
        self.bounds = []  # per step: (its first row, its end, where its extra rows begin)
        begin = 0
        for step in steps:
            clients = [client for client, _, _, _ in step]
            prefix = next((row for row, client in enumerate(clients) if client != row), len(clients))
            self.bounds.append((begin, begin + len(step), begin + prefix))
            begin += len(step)

    def passes(self) -> list[Pass]:
        """One pass per step. The round holds no list of them: each pass holds the round, and a cycle would keep the
        round's tensors alive until a full garbage collection (rounds piled up, ~1 MB each at 30 clients)."""
        return [Pass(self, *bounds) for bounds in self.bounds]

    def _picks(self) -> tuple[Tensor, Tensor, Tensor]:
        """(each row's own columns of the merged head, padded, (rows, width); the −∞ mask of the padding,
        (rows, 1, width); each row's own targets, (rows, batch)). The width is the widest head's, but at least
        `SOFTMAX_WIDTH`."""
        device = self.x.device
        sizes = torch.tensor(self.sizes, device=device)
        slot = torch.arange(max(*self.sizes, SOFTMAX_WIDTH), device=device)
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
    whose parameters are gathered (few clients hold several tasks) and which run as a second group: joining them to
    the prefix would copy every parameter's whole prefix at every step. The shared layers run once per row, then the
    merged head, and the groups' outputs are joined. Each row's loss is taken on its own task's outputs: for
    classification, one cross-entropy over every row, its own task's logits picked out and the others' masked to
    −∞; otherwise each task's loss on its slice, weighted to zero on the rows of other tasks."""

    def __init__(self, round_: Round, begin: int, end: int, extra_from: int) -> None:
        self.round, self.rows = round_, slice(begin, end)
        self.groups = [slice(begin, extra_from), slice(extra_from, end)] if extra_from < end else [self.rows]
        self.extra = round_.clients[extra_from:end] if extra_from < end else None

    def losses(self, template: nn.Module, params: Mapping[str, Tensor], gathered: Gathered) -> StepLosses:
        """The pass's losses; the extra rows' parameters are gathered into new leaves, appended to `gathered` as
        (name, stack rows, leaf), whose gradients the caller adds to the stack's rows: cheaper than differentiating
        through the gather, which zero-fills a gradient of the whole prefix for every parameter."""
        batches, rows = self.round, self.rows
        body = plain_chain(template, batches.tasks[0])[:-1]  # type: ignore[index]
        keys = chain_keys(body) + list(MERGED)
        groups = [params]
        if self.extra is not None:
            leaves = {k: params[k].detach().index_select(0, self.extra).requires_grad_() for k in keys}
            gathered.extend((k, self.extra, leaf) for k, leaf in leaves.items())
            groups.append(leaves)
        outputs = [_outputs(body, group, batches.x[group_rows])
                   for group, group_rows in zip(groups, self.groups, strict=True)]
        outputs = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
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


def _outputs(body: Chain, params: Mapping[str, Tensor], x: Tensor) -> Tensor:
    """The merged head's outputs, (rows, batch, every task's outputs), of `body` then the merged head."""
    weight, bias = (params[name] for name in MERGED)
    return torch.baddbmm(bias.unsqueeze(1), run_chain(body, params, x), weight.transpose(1, 2))


MERGED = ("heads.*.weight", "heads.*.bias")  # the leaves of the merged head


class MergedHeads:
    """The heads of a round's tasks trained as one merged head: two stacked leaves, the heads' weights (biases)
    concatenated along the outputs in the round's task order. The passes then read the merged head without a cat
    at every step, its gradient comes back as one tensor, and the SGD step moves two tensors, not two per task;
    each head is a view of its rows (`views`)."""

    def __init__(self, plans: Mapping[str, TaskPlan]) -> None:
        self.heads = [f"heads.{task}" for task in plans]
        self.sizes = [plan.outputs for plan in plans.values()]

    def merge(self, named: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """`named` (parameters, or per-client masks broadcast over them) with the heads replaced by the merged
        head's two leaves, placed last."""
        merged = [f"{head}.{part}" for head in self.heads for part in ("weight", "bias")]
        leaves = {name: value for name, value in named.items() if name not in merged}
        for name, part in zip(MERGED, ("weight", "bias"), strict=True):
            heads = [named[f"{head}.{part}"] for head in self.heads]
            leaves[name] = torch.cat([h.expand(-1, size, *h.shape[2:]) for h, size in zip(heads, self.sizes,
                                                                                        strict=True)], dim=1)
        return leaves

    def views(self, leaves: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Every parameter by name: the leaves, each head as a view of the merged head's rows."""
        named = {name: value for name, value in leaves.items() if name not in MERGED}
        for name, part in zip(MERGED, ("weight", "bias"), strict=True):
            for head, rows in zip(self.heads, leaves[name].split(self.sizes, dim=1), strict=True):
                named[f"{head}.{part}"] = rows
        return named


Row = tuple[int, str, Tensor, int]  # (client, task, a batch of its own sample indices, where they start in the task)
Gathered = list[tuple[str, Tensor, Tensor]]  # (parameter name, the stack rows gathered, the leaf holding them)
Inputs = tuple[Tensor, dict[str, int]]  # every task's inputs concatenated, and the row where each task's start


def chain_passes(template: nn.Module, plans: Mapping[str, TaskPlan], params: Mapping[str, Tensor],
            steps: list[int]) -> list[list[Pass]] | None:
    """Every step's pass when every task's forward pass is a plain chain over trained parameters, else None."""
    chains = [plain_chain(template, task) for task in plans]
    if not all(chain is not None and all(k in params for k in chain_keys(chain)) for chain in chains):
        return None
    sizes = [plan.y.shape[0] for plan in plans.values()]
    inputs = (torch.cat([x for plan in plans.values() for x in plan.xs]),  # one copy of the inputs, not two
              dict(zip(plans, torch.tensor([0, *sizes[:-1]]).cumsum(0).tolist(), strict=True)))
    rows = []
    for step in range(steps[0]):
        placed: dict[int, list[tuple[str, Tensor, int]]] = {}
        for task, plan in plans.items():  # the setup's task order
            for client, chosen, offset in plan.placed[step]:
                placed.setdefault(client, []).append((task, chosen, offset))
        clients = sorted(placed)
        depths = max(len(batches) for batches in placed.values())
        rows.append([(c, *placed[c][depth]) for depth in range(depths) for c in clients if len(placed[c]) > depth])
    return [[step] for step in Round(rows, inputs, plans).passes()]


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


def chain_keys(chain: Chain) -> list[str]:
    return [f"{prefix}.{name}" for prefix, m in chain if isinstance(m, nn.Linear) for name, _ in m.named_parameters()]


def run_chain(chain: Chain, params: Mapping[str, Tensor], x: Tensor) -> Tensor:
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

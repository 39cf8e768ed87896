"""The batched executor: a round's clients trained as one computation, whatever tasks they hold.

Every trainable backbone parameter and buffer is stacked over clients, (C, ...). A step runs one backbone pass per
*row*: a client's mini-batch of one task, or of all its tasks at once when they label the same inputs (as the
sequential trainer does). Rows run as one `vmap` of `functional_call`, each row with its client's parameters. Heads
are grouped by structure, not by task name: every (client, task) pair whose head has the same shapes and loss kind
is one row of a stacked head, so a federation in which every client holds its own task still takes one head call
per structure. Batches are drawn from the very streams `Trainer.train` draws and padded to the batch size; each
sample's weight (1/n on a row's n real samples, 0 on padding) makes a row's loss its batch mean, and BatchNorm
normalizes each row over its real samples (`execution/norms.py`).

One backward pass of the sum over rows gives every client its own gradients, because the rows are independent; the
optimizer then moves each row as its client's own optimizer would (`execution/steps.py`), gradients clipped per
client. Clients with fewer steps are masked, not dropped, so every step has the same shapes. Losses are read once,
at the end of the round.

The result equals sequential training up to float rounding (sums over a batch run in another order):
`TOLERANCE` holds for float32 models (tests/test_batched.py measures it)."""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, vmap

from manytask.client.terms import ParameterTerm
from manytask.client.trainer import Trainer, TrainReport, index_batches, shares_inputs, stream_seed_request
from manytask.execution.chains import chain_forward
from manytask.execution.norms import MaskedBatchNorm, NormContext, Statistics, masked_copy
from manytask.execution.plan import ClientPlan, PlanResult, Unbatchable
from manytask.execution.steps import batched_optimizer, clip_per_client
from manytask.models.multitask import (
    BACKBONE_PREFIX,
    BUFFER_PREFIX,
    head_prefix,
    merged_state,
    model_tensors,
    task_of_key,
)
from manytask.seeding import derive_seeds
from manytask.tasks.task import TaskKind, TaskSpec

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}  # batched vs sequential trained parameters (float32)


def _cross_entropy(outputs: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(outputs, targets, reduction="none")


def _squared_error(outputs: Tensor, targets: Tensor) -> Tensor:
    return (outputs - targets.view_as(outputs)).pow(2).flatten(1).mean(1)


# per-sample losses whose batch mean is `TaskSpec.loss`
SAMPLE_LOSSES: dict[TaskKind, Callable[[Tensor, Tensor], Tensor]] = {
    TaskKind.CLASSIFICATION: _cross_entropy, TaskKind.REGRESSION: _squared_error,
}


def check_trainer(trainer: Trainer, tasks: Sequence[str]) -> None:
    dense = [t for t in tasks if trainer.specs[t].kind not in SAMPLE_LOSSES]
    if dense:
        raise Unbatchable(f"tasks {dense} have no per-sample loss (dense tasks)")


def check_model(model: nn.Module) -> None:
    if not all(hasattr(model, part) for part in ("backbone", "heads", "head_input")):
        raise Unbatchable(f"{type(model).__name__} is not a backbone with heads")
    if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        raise Unbatchable("the model uses dropout, whose random masks follow one client's generator")
    outside = [n for n, _ in model.named_buffers() if not n.startswith(BACKBONE_PREFIX)]
    if outside:
        raise Unbatchable(f"buffers outside the backbone ({outside[0]})")


@dataclass
class _Row:
    """One backbone pass a step: a client's batch of one task (`key` the task) or of all its tasks ('shared')."""

    client: int
    key: str
    tasks: list[str]
    slot: int  # the client's how-many-th row: passes run in this order in the sequential trainer


@dataclass
class _HeadGroup:
    """(client, task) pairs whose heads share one structure and loss: their head parameters stacked, (pairs, ...)."""

    task: str  # the task whose head module runs them all (any of the group's, they are alike)
    sample_loss: Callable[[Tensor, Tensor], Tensor]
    pairs: list[tuple[int, str, int]] = field(default_factory=list)  # (client, task, row)

    def key(self, index: int, suffix: str) -> str:
        return f"group{index}:{suffix}"


def _head_signature(head: nn.Module, spec: TaskSpec) -> tuple:
    return (type(head).__name__, spec.kind,
            tuple((n, tuple(p.shape), p.dtype) for n, p in head.named_parameters()))


class _Round:
    """The round's layout: rows, head groups, the stacked leaves and where each client's values live in them."""

    def __init__(self, template: nn.Module, trainer: Trainer, plans: Sequence[ClientPlan]) -> None:
        self.template, self.trainer, self.plans = template, trainer, plans
        named = model_tensors(template)
        self.names = [n for n, p in named.parameters if p.requires_grad]
        self.buffer_names = [n for n, _ in named.buffers]
        for plan in plans:
            missing = [n for n in [*self.names, *self.buffer_names] if n not in plan.start]
            if missing:
                raise Unbatchable(f"a client's plan has no start for {missing[0]}")
        self.rows: list[_Row] = []
        for c, plan in enumerate(plans):
            tasks = list(plan.data)
            if shares_inputs(plan.data):
                self.rows.append(_Row(c, "shared", tasks, 0))
            else:
                self.rows.extend(_Row(c, t, [t], slot) for slot, t in enumerate(tasks))
        self.rows.sort(key=lambda row: (row.slot, row.client))
        self.row_clients = torch.tensor([row.client for row in self.rows])
        self.one_row_each = len(self.rows) == len(plans)  # then row r is client r
        groups: dict[tuple, _HeadGroup] = {}
        for r, row in enumerate(self.rows):
            for task in row.tasks:
                spec = trainer.specs[task]
                signature = _head_signature(template.heads[task], spec)
                group = groups.setdefault(signature, _HeadGroup(task, SAMPLE_LOSSES[spec.kind]))
                group.pairs.append((row.client, task, r))
        self.groups = list(groups.values())
        for group in self.groups:  # by client: the clients still training at a step own a prefix of the pairs
            group.pairs.sort(key=lambda pair: (pair[0], pair[2]))
        self.pair_places = {(c, t): (index, position) for index, group in enumerate(self.groups)
                            for position, (c, t, _) in enumerate(group.pairs)}
        kinds = {tuple((type(t), t.module) for t in plan.features) for plan in plans}
        if len(kinds) > 1:
            raise Unbatchable("clients of the round have different feature terms")
        # per client, whole: the backbone and the modules feature terms train (MOON's projection)
        self.client_prefixes = (BACKBONE_PREFIX, *(f"{t.module}." for t in plans[0].features))

    def per_client(self, name: str) -> bool:
        return name.startswith(self.client_prefixes)

    def leaves(self) -> dict[str, Tensor]:
        """The stacked trainable leaves: backbone parameters over clients, head parameters over each group's
        pairs."""
        starts = [plan.start for plan in self.plans]
        leaves = {n: torch.stack([s[n] for s in starts]) for n in self.names if self.per_client(n)}
        for index, group in enumerate(self.groups):
            for suffix, _ in self.template.heads[group.task].named_parameters():
                leaves[group.key(index, suffix)] = torch.stack(
                    [starts[c][head_prefix(t) + suffix] for c, t, _ in group.pairs])
        return leaves

    def owners(self, leaves: Mapping[str, Tensor]) -> dict[str, Tensor | None]:
        """Per leaf, the client of each of its rows (None: row r is client r)."""
        owners: dict[str, Tensor | None] = dict.fromkeys(n for n in leaves if self.per_client(n))
        for index, group in enumerate(self.groups):
            clients = torch.tensor([c for c, _, _ in group.pairs], device=self.device)
            for suffix, _ in self.template.heads[group.task].named_parameters():
                owners[group.key(index, suffix)] = clients
        return owners

    @property
    def device(self) -> torch.device:
        return next(iter(self.plans[0].start.values())).device

    def leaf_of(self, client: int, name: str) -> tuple[str, int] | None:
        """(leaf, row) where `client`'s value of parameter `name` is trained, or None when it is not trained."""
        if self.per_client(name):
            return name, client
        task = task_of_key(name)
        place = None if task is None else self.pair_places.get((client, task))
        if place is None:
            return None
        index, position = place
        return self.groups[index].key(index, name[len(head_prefix(task)):]), position


def _streams(round_: _Round, steps: list[int]) -> Iterator[list[Tensor]]:
    """Per step, each row's batch of its own sample indices, from `Trainer.train`'s seeded streams (empty for a
    client whose steps are done)."""
    batch = round_.trainer.config.batch_size
    seeds = derive_seeds([stream_seed_request(round_.plans[row.client].seed, row.key) for row in round_.rows])
    streams = []
    for row, seed in zip(round_.rows, seeds, strict=True):
        count = round_.plans[row.client].data[row.tasks[0]][1].shape[0]
        streams.append(index_batches(count, batch, torch.Generator().manual_seed(seed)))
    empty = torch.zeros(0, dtype=torch.long)
    for step in range(max(steps)):
        yield [next(stream) if step < steps[row.client] else empty for row, stream in zip(round_.rows, streams,
                                                                                             strict=True)]


@dataclass
class _Batches:
    index: Tensor  # (steps, rows, batch): each sample's place in the round's inputs (padding: the row's first)
    weight: Tensor  # (steps, rows, batch): 1/n on a row's n real samples, 0 on padding
    mask: Tensor  # (steps, rows, batch): 1 on real samples


def _batches(round_: _Round, steps: list[int], inputs_like: Tensor) -> tuple[_Batches, Tensor]:
    """Every step's padded batches of every row, and the local indices (steps, rows, batch) before offsets."""
    batch = round_.trainer.config.batch_size
    chosen = [b for step in _streams(round_, steps) for b in step]
    counts = torch.tensor([b.shape[0] for b in chosen]).view(max(steps), len(round_.rows), 1)
    real = torch.arange(batch) < counts
    local = torch.zeros(real.shape, dtype=torch.long).masked_scatter_(real, torch.cat(chosen))
    dtype = inputs_like.dtype if inputs_like.is_floating_point() else torch.get_default_dtype()
    weight = real.to(dtype) / counts.clamp(min=1).to(dtype)
    device = inputs_like.device
    starts = torch.tensor([0, *[_row_x(round_, row).shape[0] for row in round_.rows][:-1]]).cumsum(0)
    index = local + starts.view(1, -1, 1)
    return _Batches(index.to(device), weight.to(device), real.to(dtype).to(device)), local.to(device)


class _Concatenated:
    """The last round's concatenated inputs, reused while the next round's rows hold the very same tensors (the
    engine keeps each client's data tensors across rounds): the inputs move once, not every round."""

    def __init__(self) -> None:
        self.sources: list[weakref.ref] = []
        self.value: Tensor | None = None

    def concatenated(self, tensors: list[Tensor]) -> Tensor:
        if self.value is None or len(tensors) != len(self.sources) or any(
                ref() is not t for ref, t in zip(self.sources, tensors, strict=True)):
            self.value = torch.cat(tensors)
            self.sources = [weakref.ref(t) for t in tensors]
        return self.value


_INPUTS = _Concatenated()


def _row_x(round_: _Round, row: _Row) -> Tensor:
    return round_.plans[row.client].data[row.tasks[0]][0]


def _group_targets(round_: _Round, group: _HeadGroup, local: Tensor) -> tuple[Tensor, Tensor]:
    """A group's targets of every pair concatenated, and each step's indices into them, (steps, pairs, batch)."""
    ys = [round_.plans[c].data[t][1] for c, t, _ in group.pairs]
    starts = torch.tensor([0, *[y.shape[0] for y in ys][:-1]], device=local.device).cumsum(0)
    rows = torch.tensor([r for _, _, r in group.pairs], device=local.device)
    return torch.cat(ys), local.index_select(1, rows) + starts.view(1, -1, 1)


def _per_leaf(round_: _Round, per_client: Sequence[Mapping[str, Tensor]], leaves: Mapping[str, Tensor]
              ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Per-client tensors by parameter name, placed on the rows of the leaves that train them: per leaf, the stacked
    values (zeros on rows without one) and `present`, (rows,), 1 where a row has one."""
    places: dict[str, list[tuple[int, Tensor]]] = {}
    for client, tensors in enumerate(per_client):
        for name, value in tensors.items():
            place = round_.leaf_of(client, name)
            if place is None:
                raise Unbatchable(f"a client's objective covers a parameter that is not trained ({name})")
            places.setdefault(place[0], []).append((place[1], value))
    stacked, present = {}, {}
    for leaf, entries in places.items():
        values = torch.zeros_like(leaves[leaf])
        rows = torch.tensor([row for row, _ in entries], device=values.device)
        values.index_copy_(0, rows, torch.stack([value for _, value in entries]).to(values.dtype))
        present[leaf] = torch.zeros(len(values), dtype=values.dtype, device=values.device).index_fill_(0, rows, 1.0)
        stacked[leaf] = values
    return stacked, present


class _StackedTerm:
    """One hook position's parameter terms of every client, over the leaves."""

    def __init__(self, round_: _Round, terms: list[ParameterTerm], leaves: Mapping[str, Tensor]) -> None:
        self.term = terms[0]
        if any(t.scale != self.term.scale or t.piece is not self.term.piece for t in terms):
            raise Unbatchable("clients of the round weigh a training term differently")
        self.operands, self.present = _per_leaf(round_, [t.operands for t in terms], leaves)

    def loss(self, live: Mapping[str, Tensor]) -> Tensor:
        """The term over the live rows (a prefix of each leaf's)."""
        operands = {k: v[:len(live[k])] for k, v in self.operands.items()}
        return self.term.stacked_loss(live, operands, {k: v[:len(live[k])] for k, v in self.present.items()})


class _StackedFeatureTerm:
    """One hook position's feature terms of every client: the frozen anchors stacked per row once a round, their
    representations computed per step without gradient, the term on every row's batch at once."""

    def __init__(self, round_: _Round, position: int) -> None:
        self.terms = [plan.features[position] for plan in round_.plans]
        self.term = self.terms[0]
        if any(t.scale != self.term.scale for t in self.terms):
            raise Unbatchable("clients of the round weigh a feature term differently")
        self.prefix = f"{self.term.module}."
        self.module = round_.template.get_submodule(self.term.module)
        self.eval_backbone = copy.deepcopy(round_.template.backbone).eval()
        self.rows = None if round_.one_row_each else round_.row_clients
        self.per_row_tasks = torch.tensor([len(row.tasks) for row in round_.rows])
        self.round = round_
        initial = {**dict(round_.template.named_parameters()), **dict(round_.template.named_buffers())}
        count = {len(t.anchors) for t in self.terms}
        if len(count) > 1:
            raise Unbatchable("clients of the round hold different numbers of anchor models")
        self.anchors = [self._stacked([merged_state(initial, *t.anchors[i]) for t in self.terms])
                        for i in range(count.pop())]

    def _stacked(self, states: list[dict[str, Tensor]]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """(backbone tensors, module parameters) of one anchor, stacked over rows, by module-relative name."""
        backbone = {n[len(BACKBONE_PREFIX):]: torch.stack([s[n] for s in states]).detach()
                    for n in states[0] if n.startswith(BACKBONE_PREFIX)}
        module = {n[len(self.prefix):]: torch.stack([s[n] for s in states]).detach()
                  for n in states[0] if n.startswith(self.prefix)}
        if self.rows is not None:
            rows = self.rows.to(next(iter(backbone.values())).device)
            backbone = {n: v.index_select(0, rows) for n, v in backbone.items()}
            module = {n: v.index_select(0, rows) for n, v in module.items()}
        return backbone, module

    def _represent(self, backbone: dict[str, Tensor], module: dict[str, Tensor], x: Tensor) -> Tensor:
        return functional_call(self.module, module, (functional_call(self.eval_backbone, backbone, (x,)),))

    def loss(self, live: Mapping[str, Tensor], features: Tensor, x: Tensor, weight: Tensor, layout: _Step) -> Tensor:
        """The term over the step's active rows (`layout`)."""
        own = {n[len(self.prefix):]: live[n] if layout.row_clients is None else live[n].index_select(
            0, layout.row_clients) for n in live if n.startswith(self.prefix)}
        z = vmap(lambda params, f: functional_call(self.module, params, (f,)))(own, features)

        def active(stacked: dict[str, Tensor]) -> dict[str, Tensor]:
            return {n: v[:layout.clients] if layout.rows is None else v.index_select(0, layout.rows)
                    for n, v in stacked.items()}

        with torch.no_grad():
            anchor_zs = [vmap(self._represent)(active(backbone), active(module), x)
                         for backbone, module in self.anchors]
        per_sample = vmap(self.term.per_sample)(z, anchor_zs)
        tasks = self.per_row_tasks.to(per_sample.device, per_sample.dtype)
        tasks = (tasks[:layout.clients] if layout.rows is None else tasks.index_select(0, layout.rows)).view(-1, 1)
        return self.term.scale * (per_sample * weight * tasks).sum()


def _updated_states(round_: _Round, leaves: Mapping[str, Tensor]) -> list[dict[str, Tensor]]:
    """Each client's `StateUpdate` applied to its trained parameters, all clients' at once per leaf (views of the
    results, by parameter name); empty dicts where the plans carry none."""
    updates = [plan.update for plan in round_.plans]
    if all(u is None for u in updates):
        return [{} for _ in updates]
    if any(u is None for u in updates) or len({u.function for u in updates}) > 1:
        raise Unbatchable("clients of the round update their state differently")
    state, _ = _per_leaf(round_, [u.state for u in updates], leaves)
    reference, _ = _per_leaf(round_, [u.reference for u in updates], leaves)
    function = updates[0].function
    rows = {leaf: function(state[leaf], leaves[leaf], reference[leaf]).unbind(0) for leaf in state}
    results = []
    for client, update in enumerate(updates):
        places = {name: round_.leaf_of(client, name) for name in update.state}
        results.append({name: rows[leaf][row] for name, (leaf, row) in places.items()})
    return results


def _stacked_terms(round_: _Round, leaves: Mapping[str, Tensor]) -> list[_StackedTerm]:
    kinds = {tuple(type(t) for t in plan.terms) for plan in round_.plans}
    if len(kinds) > 1:
        raise Unbatchable("clients of the round have different training terms")
    return [_StackedTerm(round_, [plan.terms[position] for plan in round_.plans], leaves)
            for position in range(len(round_.plans[0].terms))]


def _fold_statistics(running: dict[str, Tensor], stats: Mapping[str, tuple[Tensor, Tensor, Tensor]],
                     momenta: Mapping[str, float], layout: _Step) -> None:
    """Each client's running statistics after its rows' BatchNorm passes of a step, slot by slot, the order the
    sequential trainer runs them: mean ← mean + m·moved·(batch mean − mean), the same for the variance (unbiased),
    and the counter + moved."""
    for layer, (mean, variance, moved) in stats.items():
        m = momenta[layer]
        for first, end, clients in layout.slots:
            for buffer, value in ((f"{layer}.running_mean", mean), (f"{layer}.running_var", variance)):
                stack = running[BACKBONE_PREFIX + buffer]
                current = stack[:end - first] if clients is None else stack.index_select(0, clients)
                moved_rows = moved[first:end].view(-1, *([1] * (current.dim() - 1)))
                updated = current + (m * moved_rows) * (value[first:end] - current)
                if clients is None:
                    current.copy_(updated)
                else:
                    stack.index_copy_(0, clients, updated)
            counter = running[BACKBONE_PREFIX + f"{layer}.num_batches_tracked"]
            increment = moved[first:end].to(counter.dtype)
            if clients is None:
                counter[:end - first].add_(increment)
            else:
                counter.index_add_(0, clients, increment)


@dataclass
class _Step:
    """Which rows and pairs train at one step: the clients still training are a prefix of the round's clients (they
    are ordered by their steps, most first), so their rows are a prefix of each slot and their pairs a prefix of
    each head group; every stacked leaf trains on a prefix view of itself, without a copy."""

    clients: int  # the prefix of clients still training
    rows: Tensor | None  # the active rows, in row order (None: rows 0..clients-1, the first row of each client)
    row_clients: Tensor | None  # their clients (None: as `rows`)
    slots: list[tuple[int, int, Tensor | None]]  # per slot: (first active row, end, their clients or None: identity)
    pairs: list[int]  # per head group, the prefix of its pairs still training
    positions: list[Tensor | None]  # per head group, its active pairs' places among the active rows (None: same)
    pair_index: Tensor  # the active pairs' indices into the round's pairs, in the order their losses come


def _step_layouts(round_: _Round, steps: list[int], device: torch.device) -> list[_Step]:
    layouts = []
    offsets = [0]
    for group in round_.groups:
        offsets.append(offsets[-1] + len(group.pairs))
    for step in range(max(steps)):
        clients = sum(count > step for count in steps)
        rows = [r for r, row in enumerate(round_.rows) if row.client < clients]
        place = {r: i for i, r in enumerate(rows)}
        identity = rows == list(range(clients))
        slots = []
        for slot in sorted({round_.rows[r].slot for r in rows}):
            members = [i for i, r in enumerate(rows) if round_.rows[r].slot == slot]
            owners = [round_.rows[rows[i]].client for i in members]
            slots.append((members[0], members[-1] + 1,
                          None if owners == list(range(len(owners))) else torch.tensor(owners, device=device)))
        pairs, positions, index = [], [], []
        for g, group in enumerate(round_.groups):
            count = sum(c < clients for c, _, _ in group.pairs)
            where = [place[r] for _, _, r in group.pairs[:count]]
            pairs.append(count)
            positions.append(None if where == list(range(len(rows))) else torch.tensor(where, device=device))
            index.extend(range(offsets[g], offsets[g] + count))
        layouts.append(_Step(
            clients, None if identity else torch.tensor(rows, device=device),
            None if identity else torch.tensor([round_.rows[r].client for r in rows], device=device),
            slots, pairs, positions, torch.tensor(index, device=device)))
    return layouts


def train_batched(plans: Sequence[ClientPlan], plain_chains: bool = True) -> list[PlanResult]:
    """Train every plan from its `start` as its `trainer.train` would, all in one batched computation. The plans
    share one template (it only gives the model's structure: its values of the trained parameters are never used,
    nor changed), one trainer and one point of the lr schedule. The `mlp` and `cnn` backbones run as plain chains
    (`execution/chains.py`) unless `plain_chains` is off; every other backbone, through `vmap`."""
    first = plans[0]
    template, trainer, round_index, total_rounds = first.template, first.trainer, first.round_index, first.total_rounds
    if any((p.template, p.trainer.config, p.round_index, p.total_rounds) != (template, trainer.config, round_index,
                                                                            total_rounds) for p in plans):
        raise Unbatchable("clients of the round train different models, optimizers or lr schedules")
    check_model(template)
    check_trainer(trainer, list(dict.fromkeys(t for plan in plans for t in plan.data)))
    own_steps = [trainer.num_steps(plan.data) for plan in plans]
    order = sorted(range(len(plans)), key=lambda c: -own_steps[c])  # most steps first: the active are a prefix
    results = _train_ordered(template, trainer, [plans[c] for c in order], [own_steps[c] for c in order],
                             round_index, total_rounds, plain_chains)
    back = [0] * len(plans)
    for position, client in enumerate(order):
        back[client] = position
    return [results[back[c]] for c in range(len(plans))]


def _train_ordered(template: nn.Module, trainer: Trainer, plans: Sequence[ClientPlan], steps: list[int],
                   round_index: int, total_rounds: int, plain_chains: bool) -> list[PlanResult]:
    round_ = _Round(template, trainer, plans)
    leaves = round_.leaves()
    owners = round_.owners(leaves)
    terms = _stacked_terms(round_, leaves)
    feature_terms = [_StackedFeatureTerm(round_, position) for position in range(len(plans[0].features))]
    device = round_.device
    inputs = _INPUTS.concatenated([_row_x(round_, row) for row in round_.rows])
    batches, local = _batches(round_, steps, inputs)
    targets = [_group_targets(round_, group, local) for group in round_.groups]
    running = {n: torch.stack([plan.start[n] for plan in plans]) for n in round_.buffer_names}
    context = NormContext()
    backbone = masked_copy(template.backbone, context)
    momenta = {m.name: m.momentum for m in backbone.modules() if isinstance(m, MaskedBatchNorm)}
    whole = all(p.requires_grad for p in template.backbone.parameters())  # frozen weights: not per row, so vmap
    chain = chain_forward(template.backbone) if plain_chains and whole else None
    config = trainer.config
    optimizer = batched_optimizer(config, config.lr_at(round_index, total_rounds))
    names = list(leaves)
    group_of = {n: i for i, g in enumerate(round_.groups) for n in names if n.startswith(g.key(i, ""))}
    recorded: list[tuple[Tensor, Tensor]] = []

    def backbone_row(params: dict[str, Tensor], buffers: dict[str, Tensor], x: Tensor, mask: Tensor):
        context.mask, context.stats = mask, {}
        features = functional_call(backbone, (params, buffers), (x,))
        return features, dict(context.stats)

    for step, layout in enumerate(_step_layouts(round_, steps, device)):
        sizes = {n: layout.clients if n not in group_of else layout.pairs[group_of[n]] for n in names}
        live = {n: leaves[n][:sizes[n]].detach().requires_grad_() for n in names}
        index, weight, mask = (part[step][:layout.clients] if layout.rows is None else
                               part[step].index_select(0, layout.rows)
                               for part in (batches.index, batches.weight, batches.mask))
        x = inputs.index_select(0, index.flatten()).view(*index.shape, *inputs.shape[1:])
        rows_forward = vmap(backbone_row) if chain is None else chain
        raw_features, stats, extra = _backbone_passes(rows_forward, live, leaves, running, x, mask, layout)
        features = template.head_input(raw_features)
        losses = []
        for g, (group, (y, y_index)) in enumerate(zip(round_.groups, targets, strict=True)):
            count, positions = layout.pairs[g], layout.positions[g]
            if not count:
                continue
            head = template.heads[group.task]
            params = {s: live[group.key(g, s)] for s, _ in head.named_parameters()}
            row_features = features if positions is None else features.index_select(0, positions)
            row_weight = weight if positions is None else weight.index_select(0, positions)
            pair_index = y_index[step][:count]
            row_y = y.index_select(0, pair_index.flatten()).view(*pair_index.shape, *y.shape[1:])
            losses.append(vmap(_head_loss(head, group.sample_loss))(params, row_features, row_y, row_weight))
        step_losses = losses[0] if len(losses) == 1 else torch.cat(losses)
        loss = step_losses.sum()
        for term in terms:
            loss = loss + term.loss(live)
        for feature_term in feature_terms:
            loss = loss + feature_term.loss(live, raw_features, x, weight, layout)
        grads = list(torch.autograd.grad(loss, [live[n] for n in names] + list(extra.values()), allow_unused=True,
                                         materialize_grads=True))
        with torch.no_grad():
            extra_grads = dict(zip(extra, grads[len(names):], strict=True))
            grads = [grad if n not in extra_grads else grad.index_add_(0, layout.row_clients[layout.clients:],
                                                                        extra_grads[n])
                     for n, grad in zip(names, grads[:len(names)], strict=True)]
            _fold_statistics(running, stats, momenta, layout)
            if config.grad_clip is not None:
                grads = clip_per_client(grads, [None if owners[n] is None else owners[n][:sizes[n]] for n in names],
                                        layout.clients, config.grad_clip)
            optimizer.step([leaves[n][:sizes[n]] for n in names], grads)
        recorded.append((step_losses.detach(), layout.pair_index))
    return _results(round_, leaves, running, steps, recorded, _updated_states(round_, leaves))


def _backbone_passes(forward: Callable, live: Mapping[str, Tensor], leaves: Mapping[str, Tensor],
                     running: Mapping[str, Tensor], x: Tensor, mask: Tensor, layout: _Step
                     ) -> tuple[Tensor, dict[str, Statistics], dict[str, Tensor]]:
    """The backbone on the step's active rows: (features, BatchNorm statistics, the extra rows' parameter leaves).

    The first rows are each active client's first (the stacks' prefix itself: no gather). A client's further rows
    (its other tasks' batches) run as a second pass on leaves of their own, gathered from the stacks without
    autograd; their gradients are added into the stacks' afterwards. Differentiating through a gather instead
    scatters every step's gradient into a zero-filled copy of the whole stack."""
    strip = len(BACKBONE_PREFIX)
    first = layout.clients
    params = {n[strip:]: v for n, v in live.items() if n.startswith(BACKBONE_PREFIX)}
    buffers = {n[strip:]: b[:first] for n, b in running.items()}
    if layout.row_clients is None:
        features, stats = forward(params, buffers, x, mask)
        return features, stats, {}
    others = layout.row_clients[first:]
    extra = {n: leaves[n].index_select(0, others).requires_grad_() for n in live if n.startswith(BACKBONE_PREFIX)}
    features, stats = forward(params, buffers, x[:first], mask[:first])
    more, more_stats = forward({n[strip:]: v for n, v in extra.items()},
                               {n[strip:]: b.index_select(0, others) for n, b in running.items()}, x[first:],
                               mask[first:])
    joined = {layer: tuple(torch.cat([a, b]) for a, b in zip(stats[layer], more_stats[layer], strict=True))
              for layer in stats}
    return torch.cat([features, more]), joined, extra


def _head_loss(head: nn.Module, sample_loss: Callable[[Tensor, Tensor], Tensor]):
    def loss(params: dict[str, Tensor], features: Tensor, y: Tensor, weight: Tensor) -> Tensor:
        return (sample_loss(functional_call(head, params, (features,)), y) * weight).sum()

    return loss


def _results(round_: _Round, leaves: Mapping[str, Tensor], running: Mapping[str, Tensor], steps: list[int],
             recorded: list[tuple[Tensor, Tensor]], states: list[dict[str, Tensor]]) -> list[PlanResult]:
    """Each client's trained parameters and buffers (views of the stacks, which change no more) and its report;
    the losses are summed per pair once, in float64 (one accumulating op), and read once."""
    pairs = sum(len(group.pairs) for group in round_.groups)
    losses, where = (torch.cat(part) for part in zip(*recorded, strict=True))
    totals = torch.zeros(pairs, dtype=torch.float64, device=losses.device).index_put_(
        (where,), losses.double(), accumulate=True).tolist()
    pair_losses: dict[tuple[int, str], float] = {}
    position = 0
    for group in round_.groups:
        for client, task, _ in group.pairs:
            pair_losses[client, task] = totals[position]
            position += 1
    rows = {n: leaf.unbind(0) for n, leaf in leaves.items()}
    buffers = {n: stack.unbind(0) for n, stack in running.items()}
    results = []
    for c, plan in enumerate(round_.plans):
        params = {}
        for name in round_.names:
            place = round_.leaf_of(c, name)
            params[name] = plan.start[name] if place is None else rows[place[0]][place[1]]
        for name in round_.buffer_names:
            params[BUFFER_PREFIX + name] = buffers[name][c]
        losses = {t: pair_losses[c, t] / max(steps[c], 1) for t in plan.data}
        results.append(PlanResult(params, TrainReport(steps[c], losses), states[c]))
    return results

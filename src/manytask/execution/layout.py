"""The layout of a batched round: which backbone passes (rows) run each step, which heads train together (head
groups, by structure), the batches each row draws (from `Trainer.train`'s own seeded streams, padded with per-sample
weights), and which rows and pairs are still training at each step (a prefix: clients are ordered by their steps)."""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from manytask.client.trainer import Trainer, index_batches, shares_inputs, stream_seed_request
from manytask.execution.losses import RowLoss, row_loss
from manytask.execution.plan import ClientPlan, Unbatchable
from manytask.models.multitask import BACKBONE_PREFIX, head_prefix, model_tensors, task_of_key
from manytask.seeding import derive_seeds
from manytask.tasks.task import TaskSpec


@dataclass
class Row:
    """One backbone pass a step: a client's batch of one task (`key` the task) or of all its tasks ('shared')."""

    client: int
    key: str
    tasks: list[str]
    slot: int  # the client's how-many-th row: passes run in this order in the sequential trainer


@dataclass
class HeadGroup:
    """(client, task) pairs whose heads share one structure and loss: their head parameters stacked, (pairs, ...)."""

    task: str  # the task whose head module runs them all (any of the group's, they are alike)
    row_loss: RowLoss
    pairs: list[tuple[int, str, int]] = field(default_factory=list)  # (client, task, row)

    def key(self, index: int, suffix: str) -> str:
        return f"group{index}:{suffix}"


def head_signature(head: nn.Module, spec: TaskSpec) -> tuple:
    return (type(head).__name__, spec.kind, spec.loss_choice,
            tuple((n, tuple(p.shape), p.dtype) for n, p in head.named_parameters()))


class Round:
    """The round's layout: rows, head groups, the stacked leaves and where each client's values live in them."""

    def __init__(self, template: nn.Module, trainer: Trainer, plans: Sequence[ClientPlan]) -> None:
        self.template, self.trainer, self.plans = template, trainer, plans
        named = model_tensors(template)
        self.names = [n for n, p in named.parameters if p.requires_grad]
        # heads a phase keeps frozen under a trained backbone: each pair's own values, stacked, but never moved
        self.frozen_names = [n for n, p in named.parameters if not p.requires_grad and task_of_key(n) is not None]
        # the backbone's buffers, per client; the heads' (a decoder's BatchNorm) are stacked per pair (`head_buffers`)
        self.buffer_names = [n for n, _ in named.buffers if task_of_key(n) is None]
        self.head_buffer_names = [n for n, _ in named.buffers if task_of_key(n) is not None]
        for plan in plans:
            held = [n for n in [*self.frozen_names, *self.head_buffer_names] if task_of_key(n) in plan.data]
            missing = [n for n in [*self.names, *self.buffer_names, *held] if n not in plan.start]
            if missing:
                raise Unbatchable(f"a client's plan has no start for {missing[0]}")
        self.rows: list[Row] = []
        for c, plan in enumerate(plans):
            tasks = list(plan.data)
            if shares_inputs(plan.data):
                self.rows.append(Row(c, "shared", tasks, 0))
            else:
                self.rows.extend(Row(c, t, [t], slot) for slot, t in enumerate(tasks))
        self.rows.sort(key=lambda row: (row.slot, row.client))
        self.row_clients = torch.tensor([row.client for row in self.rows])
        self.one_row_each = len(self.rows) == len(plans)  # then row r is client r
        groups: dict[tuple, HeadGroup] = {}
        for r, row in enumerate(self.rows):
            for task in row.tasks:
                spec = trainer.specs[task]
                signature = head_signature(template.heads[task], spec)
                group = groups.setdefault(signature, HeadGroup(task, row_loss(spec)))
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

    def leaves(self, trainable: bool = True) -> dict[str, Tensor]:
        """The stacked trainable leaves: backbone parameters over clients, head parameters over each group's
        pairs; or (`trainable` off) the frozen head parameters, stacked the same way."""
        starts = [plan.start for plan in self.plans]
        leaves = {n: torch.stack([s[n] for s in starts]) for n in self.names if trainable and self.per_client(n)}
        for index, group in enumerate(self.groups):
            for suffix, param in self.template.heads[group.task].named_parameters():
                if param.requires_grad == trainable:
                    leaves[group.key(index, suffix)] = torch.stack(
                        [starts[c][head_prefix(t) + suffix] for c, t, _ in group.pairs])
        return leaves

    def head_buffers(self) -> dict[str, Tensor]:
        """Every head group's buffers (its decoders' BatchNorm statistics), stacked over its pairs, by group key."""
        stacks = {}
        for index, group in enumerate(self.groups):
            for suffix, _ in self.template.heads[group.task].named_buffers():
                stacks[group.key(index, suffix)] = torch.stack(
                    [self.plans[c].start[head_prefix(t) + suffix] for c, t, _ in group.pairs])
        return stacks

    def masks(self, leaves: Mapping[str, Tensor]) -> list[Tensor | None] | None:
        """Per leaf (in `leaves`' order), every client's `masks` stacked in the leaf's dtype (None: the leaf moves
        whole); None when no plan trains under masks."""
        masks = [plan.masks for plan in self.plans]
        if all(m is None for m in masks):
            return None
        names = set(masks[0] or ())
        if any(m is None or set(m) != names for m in masks):
            raise Unbatchable("clients of the round train under masks of different parameters, or without")
        outside = [n for n in names if n not in leaves or not self.per_client(n)]
        if outside:
            raise Unbatchable(f"a mask covers a parameter that is not trained per client ({outside[0]})")
        return [torch.stack([m[n] for m in masks]).to(device=leaf.device, dtype=leaf.dtype) if n in names else None
                for n, leaf in leaves.items()]

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


def streams(round_: Round, steps: list[int]) -> Iterator[list[Tensor]]:
    """Per step, each row's batch of its own sample indices, from `Trainer.train`'s seeded streams (empty for a
    client whose steps are done); a batch is drawn every `inner_steps` steps and trains that many."""
    batch = round_.trainer.config.batch_size
    every = round_.plans[0].inner_steps  # the same for every plan (`train_batched` checks)
    seeds = derive_seeds([stream_seed_request(round_.plans[row.client].seed, row.key) for row in round_.rows])
    streams = []
    for row, seed in zip(round_.rows, seeds, strict=True):
        count = round_.plans[row.client].data[row.tasks[0]][1].shape[0]
        streams.append(index_batches(count, batch, torch.Generator().manual_seed(seed)))
    empty = torch.zeros(0, dtype=torch.long)
    drawn = [empty] * len(streams)
    for step in range(max(steps)):
        if step % every == 0:
            drawn = [next(stream) if step < steps[row.client] else empty for row, stream in zip(round_.rows, streams,
                                                                                                   strict=True)]
        yield drawn


@dataclass
class Batches:
    index: Tensor  # (steps, rows, batch): each sample's place in the round's inputs (padding: the row's first)
    weight: Tensor  # (steps, rows, batch): 1/n on a row's n real samples, 0 on padding
    mask: Tensor  # (steps, rows, batch): 1 on real samples


def padded_batches(round_: Round, steps: list[int], inputs_like: Tensor) -> tuple[Batches, Tensor]:
    """Every step's padded batches of every row, and the local indices (steps, rows, batch) before offsets."""
    batch = round_.trainer.config.batch_size
    chosen = [b for step in streams(round_, steps) for b in step]
    counts = torch.tensor([b.shape[0] for b in chosen]).view(max(steps), len(round_.rows), 1)
    real = torch.arange(batch) < counts
    local = torch.zeros(real.shape, dtype=torch.long).masked_scatter_(real, torch.cat(chosen))
    dtype = inputs_like.dtype if inputs_like.is_floating_point() else torch.get_default_dtype()
    weight = real.to(dtype) / counts.clamp(min=1).to(dtype)
    device = inputs_like.device
    starts = torch.tensor([0, *[row_inputs(round_, row).shape[0] for row in round_.rows][:-1]]).cumsum(0)
    index = local + starts.view(1, -1, 1)
    return Batches(index.to(device), weight.to(device), real.to(dtype).to(device)), local.to(device)


class Concatenated:
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


INPUTS = Concatenated()


def row_inputs(round_: Round, row: Row) -> Tensor:
    return round_.plans[row.client].data[row.tasks[0]][0]


def group_targets(round_: Round, group: HeadGroup, local: Tensor) -> tuple[Tensor, Tensor]:
    """A group's targets of every pair concatenated, and each step's indices into them, (steps, pairs, batch)."""
    ys = [round_.plans[c].data[t][1] for c, t, _ in group.pairs]
    starts = torch.tensor([0, *[y.shape[0] for y in ys][:-1]], device=local.device).cumsum(0)
    rows = torch.tensor([r for _, _, r in group.pairs], device=local.device)
    return torch.cat(ys), local.index_select(1, rows) + starts.view(1, -1, 1)


@dataclass
class Step:
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


def step_layouts(round_: Round, steps: list[int], device: torch.device) -> list[Step]:
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
        layouts.append(Step(
            clients, None if identity else torch.tensor(rows, device=device),
            None if identity else torch.tensor([round_.rows[r].client for r in rows], device=device),
            slots, pairs, positions, torch.tensor(index, device=device)))
    return layouts

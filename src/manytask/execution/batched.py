"""The batched executor: a round's clients trained as one computation, whatever tasks they hold.

Every trainable backbone parameter and buffer is stacked over clients, (C, ...). A step runs one backbone pass per
*row*: a client's mini-batch of one task, or of all its tasks at once when they label the same inputs (as the
sequential trainer does), each row with its client's parameters: the `mlp` and `cnn` backbones layer by layer
(`execution/chains.py`), any other as one `vmap` of `functional_call`. Heads are grouped by structure, not by task
name: every (client, task) pair whose head has the same shapes and loss kind is one row of a stacked head, so a
federation in which every client holds its own task still takes one head call per structure. A vector head reads
the backbone's features; a dense task's decoder reads the pass's feature pyramid (an encoder–decoder round). The
round's layout (`execution/layout.py`) draws the batches from the very streams `Trainer.train` draws and pads them
to the batch size; each sample's weight (1/n on a row's n real samples, 0 on padding) gives each kind's loss over a
row's real samples (`execution/losses.py`), and BatchNorm normalizes each row over its real samples
(`execution/norms.py`).

One backward pass of the sum over rows gives every client its own gradients, because the rows are independent; the
optimizer then moves each row as its client's own optimizer would (`execution/steps.py`), gradients clipped per
client. Clients are ordered by their steps, most first, so those still training at a step are a prefix of every
stack, and the step trains that prefix only (views, no copies). Losses are read once, at the end of the round.

The result equals sequential training up to float rounding (sums over a batch run in another order):
`TOLERANCE` holds for float32 models (tests/test_batched.py measures it)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from manytask.client.trainer import Trainer, TrainReport
from manytask.execution.chains import chain_forward
from manytask.execution.layout import (
    INPUTS,
    Round,
    Step,
    group_targets,
    padded_batches,
    row_inputs,
    step_layouts,
)
from manytask.execution.losses import RowLoss
from manytask.execution.norms import MaskedBatchNorm, NormContext, Statistics, masked_copy
from manytask.execution.plan import ClientPlan, PlanResult, Unbatchable, WorkPlan
from manytask.execution.probes import stacked_probes
from manytask.execution.stacked import StackedFeatureTerm, StackedStateTerm, stacked_terms, updated_states
from manytask.execution.steps import batched_optimizer, clip_per_client
from manytask.models.decoders import Pyramid
from manytask.models.keyed_dropout import GOLDEN, dropout_key, wrapped
from manytask.models.multitask import BACKBONE_PREFIX, BUFFER_PREFIX, HEAD_PREFIX, head_prefix, task_of_key
from manytask.models.transformers_backbones import eager_attention
from manytask.seeding import derive_seeds

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}  # batched vs sequential trained parameters (float32)


def dense_round(trainer: Trainer, tasks: Sequence[str]) -> bool:
    """Whether the round's heads are dense decoders (on the backbone's feature pyramid) rather than vector heads."""
    dense = {trainer.specs[t].is_dense for t in tasks}
    if len(dense) > 1:
        raise Unbatchable("the round mixes dense tasks and vector tasks (two backbone passes a row)")
    return dense.pop()


def check_model(model: nn.Module) -> None:
    if not all(hasattr(model, part) for part in ("backbone", "heads", "head_input")):
        raise Unbatchable(f"{type(model).__name__} is not a backbone with heads")
    if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        raise Unbatchable("the model uses dropout that is not keyed (models/keyed_dropout.py): its random masks "
                          "follow one client's generator")
    if any(getattr(m, "drop_prob", 0) > 0 for m in model.modules()):  # Swin's, timm's DropPath
        raise Unbatchable("the model uses stochastic depth (drop path) that is not keyed: its draws follow one "
                          "client's generator")
    if dropout_key(model.heads) is not None:
        raise Unbatchable("a head has dropout (the heads run outside the backbone's keyed passes)")
    outside = [n for n, _ in model.named_buffers() if not n.startswith((BACKBONE_PREFIX, HEAD_PREFIX))]
    if outside:
        raise Unbatchable(f"buffers outside the backbone and the heads ({outside[0]})")


def _fold_statistics(running: dict[str, Tensor], stats: Mapping[str, tuple[Tensor, Tensor, Tensor]],
                     momenta: Mapping[str, float], layout: Step) -> None:
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


@contextmanager
def ieee_float32() -> Iterator[None]:
    """Float32 convolutions and matmuls in full precision within the block. By default cuDNN may run a float32
    convolution in TF32 (a 10-bit mantissa), and it picks TF32 for the batched path's grouped convolutions where it
    does not for one client's: on an H100 the batched losses of SFMTL-Graph, FedU, pFedMe and Local then left the
    sequential ones by up to 1.7e-3 after two rounds, and by 2e-7 with TF32 off (2026-11-28)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def run_batched(plans: Sequence[ClientPlan | WorkPlan]) -> list[PlanResult] | list[Any]:
    """One batch of a round's plans as one computation: training plans by `train_batched`, a method's work plans by
    their own `run` (the same for every plan of the batch)."""
    if all(isinstance(plan, ClientPlan) for plan in plans):
        return train_batched(plans)
    if not all(isinstance(plan, WorkPlan) and plan.run == plans[0].run for plan in plans):
        raise Unbatchable("clients of the round plan different kinds of work")
    return plans[0].run([plan.inputs for plan in plans])


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
    if len({plan.inner_steps for plan in plans}) > 1:
        raise Unbatchable("clients of the round take different numbers of steps on a batch")
    dense = dense_round(trainer, list(dict.fromkeys(t for plan in plans for t in plan.data)))
    own_steps = [trainer.num_steps(plan.data) * plan.inner_steps for plan in plans]
    order = sorted(range(len(plans)), key=lambda c: -own_steps[c])  # most steps first: the active are a prefix
    with ieee_float32(), eager_attention(template):
        results = _train_ordered(template, trainer, [plans[c] for c in order], [own_steps[c] for c in order],
                                 round_index, total_rounds, plain_chains, dense)
    back = [0] * len(plans)
    for position, client in enumerate(order):
        back[client] = position
    return [results[back[c]] for c in range(len(plans))]


def _train_ordered(template: nn.Module, trainer: Trainer, plans: Sequence[ClientPlan], steps: list[int],
                   round_index: int, total_rounds: int, plain_chains: bool, dense: bool) -> list[PlanResult]:
    round_ = Round(template, trainer, plans)
    leaves, frozen = round_.leaves(), round_.leaves(trainable=False)
    owners = round_.owners(leaves)
    terms = stacked_terms(round_, leaves)
    feature_terms = [StackedFeatureTerm(round_, position) for position in range(len(plans[0].features))]
    if len({len(plan.state_terms) for plan in plans}) > 1:
        raise Unbatchable("clients of the round have different feature terms with a state")
    state_terms = [StackedStateTerm(round_, position) for position in range(len(plans[0].state_terms))]
    device = round_.device
    inputs = INPUTS.concatenated([row_inputs(round_, row) for row in round_.rows])
    batches, local = padded_batches(round_, steps, inputs)
    targets = [group_targets(round_, group, local) for group in round_.groups]
    running = {n: torch.stack([plan.start[n] for plan in plans]) for n in round_.buffer_names}
    head_running = round_.head_buffers()
    context, head_context = NormContext(), NormContext()
    backbone = masked_copy(template.backbone, context)
    momenta = {m.name: m.momentum for m in backbone.modules() if isinstance(m, MaskedBatchNorm)}
    # a head with BatchNorm (a decoder's) runs as a masked copy: each pair normalized over its real samples
    heads = [masked_copy(template.heads[g.task], head_context) if any(True for _ in template.heads[g.task].buffers())
             else template.heads[g.task] for g in round_.groups]
    whole = all(p.requires_grad for p in template.backbone.parameters())  # frozen weights: not per row, so vmap
    chain = chain_forward(template.backbone) if plain_chains and whole and not dense else None
    passed = Pyramid(backbone) if dense else backbone  # a dense round's pass gives the feature pyramid
    prefix = Pyramid.PREFIX if dense else ""
    config = trainer.config
    lr = config.lr_at(round_index, total_rounds)
    probes = stacked_probes(round_, steps, lr)
    dropout = dropout_key(backbone)
    keys = _row_keys(round_, device) if dropout is not None else None
    key_dims = (0, 0, 0, 0, None if keys is None else 0)  # the rows' keys, when the model draws
    if dropout is not None and probes:
        raise Unbatchable("lookahead probes on a model with dropout (a probe's passes would repeat the step's draws)")
    optimizer = batched_optimizer(config, lr, round_.masks(leaves))
    autocast = config.autocast(device)
    names = list(leaves)
    group_of = {n: i for i, g in enumerate(round_.groups) for n in names if n.startswith(g.key(i, ""))}
    recorded: list[tuple[Tensor, Tensor]] = []

    def backbone_row(params: dict[str, Tensor], buffers: dict[str, Tensor], x: Tensor, mask: Tensor,
                     key: Tensor | None):
        context.mask, context.stats = mask, {}
        if dropout is not None:
            dropout.value = key  # this row's key: its client's seed, its stream, the step
        features = functional_call(passed, ({prefix + n: p for n, p in params.items()},
                                            {prefix + n: b for n, b in buffers.items()}), (x,))
        return features, dict(context.stats)

    for step, layout in enumerate(step_layouts(round_, steps, device)):
        sizes = {n: layout.clients if n not in group_of else layout.pairs[group_of[n]] for n in names}
        live = {n: leaves[n][:sizes[n]].detach().requires_grad_() for n in names}
        index, weight, mask = (part[step][:layout.clients] if layout.rows is None else
                               part[step].index_select(0, layout.rows)
                               for part in (batches.index, batches.weight, batches.mask))
        x = inputs.index_select(0, index.flatten()).view(*index.shape, *inputs.shape[1:])

        def forward(live: Mapping[str, Tensor], x: Tensor = x, mask: Tensor = mask, weight: Tensor = weight,
                    layout: Step = layout, step: int = step):
            """The step's pair losses with the leaves `live` (the step's own, or a probe's moved ones), and what
            training folds and differentiates besides: BatchNorm statistics, extra rows, features, labels."""
            rows_forward = vmap(backbone_row, in_dims=key_dims) if chain is None else _keyless(chain)
            step_keys = None if keys is None else _step_keys(keys, layout, step)
            passes, stats, extra = _backbone_passes(rows_forward, live, leaves, running, x, mask, step_keys, layout)
            # what the heads read, and the feature vectors MOON contrasts (a dense model's pooled deepest level)
            raw_features = passes[-1].mean(dim=(-2, -1)) if dense else passes
            head_inputs = passes if dense else template.head_input(passes)
            size = tuple(x.shape[-2:]) if dense else None
            losses, head_stats, labels = [], [], None
            for g, (group, (y, y_index)) in enumerate(zip(round_.groups, targets, strict=True)):
                count, positions = layout.pairs[g], layout.positions[g]
                if not count:
                    continue
                head = heads[g]
                params = {s: live[k] if (k := group.key(g, s)) in live else frozen[k][:count]
                          for s, _ in head.named_parameters()}
                buffers = {s: head_running[group.key(g, s)][:count] for s, _ in head.named_buffers()}
                pair_inputs = head_inputs if positions is None else _rows(head_inputs, positions)
                row_weight = weight if positions is None else weight.index_select(0, positions)
                pair_index = y_index[step][:count]
                row_y = y.index_select(0, pair_index.flatten()).view(*pair_index.shape, *y.shape[1:])
                normed = head is not template.heads[group.task]  # a masked copy: the head has BatchNorm
                pair_losses, stats_of_pairs = vmap(_head_loss(head, group.row_loss, size,
                                                              head_context if normed else None))(
                    params, buffers, pair_inputs, row_y, row_weight)
                losses.append(pair_losses)
                head_stats.append((g, count, stats_of_pairs))
                labels = row_y  # one group when there are state terms: the labels of the rows, in row order
            step_losses = losses[0] if len(losses) == 1 else torch.cat(losses)
            return step_losses, stats, extra, head_stats, raw_features, labels

        with autocast:
            step_losses, stats, extra, head_stats, raw_features, labels = forward(live)
            loss = step_losses.sum()
            for term in terms:
                if not term.analytic:
                    loss = loss + term.loss(live)
            for feature_term in feature_terms:
                loss = loss + feature_term.loss(live, raw_features, x, weight, layout)
            for state_term in state_terms:
                loss = loss + state_term.loss(raw_features, labels, mask, layout)
            for probe in probes:
                probe.measure(step, layout, live, step_losses, lambda shifted: forward(shifted)[0])
        grads = list(torch.autograd.grad(loss, [live[n] for n in names] + list(extra.values()), allow_unused=True,
                                         materialize_grads=True))
        with torch.no_grad():
            extra_grads = dict(zip(extra, grads[len(names):], strict=True))
            by_leaf = {n: grad if n not in extra_grads else grad.index_add_(0, layout.row_clients[layout.clients:],
                                                                              extra_grads[n])
                       for n, grad in zip(names, grads[:len(names)], strict=True)}
            for term in terms:
                if term.analytic:
                    term.add_gradient(by_leaf, live)
            grads = [by_leaf[n] for n in names]
            _fold_statistics(running, stats, momenta, layout)
            for g, count, stats_of_pairs in head_stats:
                _fold_head_statistics(head_running, round_.groups[g].key(g, ""), stats_of_pairs, heads[g], count)
            if config.grad_clip is not None:
                grads = clip_per_client(grads, [None if owners[n] is None else owners[n][:sizes[n]] for n in names],
                                        layout.clients, config.grad_clip)
            optimizer.step([leaves[n][:sizes[n]] for n in names], grads)
            for term in terms:
                term.move(step, leaves, sizes)
        recorded.append((step_losses.detach(), layout.pair_index))
    if dropout is not None:
        dropout.value = None
    return _results(round_, leaves, {**running, **head_running}, steps, recorded, updated_states(round_, leaves),
                    [term.final() for term in state_terms], [term.final(round_) for term in terms if term.moves],
                    [probe.final() for probe in probes])


def _keyless(chain: Callable) -> Callable:
    """A plain chain's forward taking the rows' dropout keys (a plain chain has no random layer)."""
    return lambda params, buffers, x, mask, _keys: chain(params, buffers, x, mask)


def _row_keys(round_: Round, device: torch.device) -> Tensor:
    """Each row's step-0 dropout key, (rows,): the key `Trainer.train` sets for its client's stream
    (`keyed_dropout.stream_key`)."""
    seeds = derive_seeds([(round_.plans[row.client].seed, "dropout", row.key) for row in round_.rows])
    return torch.tensor(seeds, dtype=torch.int64, device=device)


def _step_keys(keys: Tensor, layout: Step, step: int) -> Tensor:
    """The active rows' dropout keys at `step`: step 0's + step · GOLDEN, as the sequential trainer's."""
    active = keys[:layout.clients] if layout.rows is None else keys.index_select(0, layout.rows)
    return active + wrapped(step * GOLDEN)


def _backbone_passes(forward: Callable, live: Mapping[str, Tensor], leaves: Mapping[str, Tensor],
                     running: Mapping[str, Tensor], x: Tensor, mask: Tensor, keys: Tensor | None, layout: Step
                     ) -> tuple[Tensor, dict[str, Statistics], dict[str, Tensor]]:
    """The backbone on the step's active rows: (features, BatchNorm statistics, the extra rows' parameter leaves);
    `keys` are the rows' dropout keys (None: the model has no random layer).

    The first rows are each active client's first (the stacks' prefix itself: no gather). A client's further rows
    (its other tasks' batches) run as a second pass on leaves of their own, gathered from the stacks without
    autograd; their gradients are added into the stacks' afterwards. Differentiating through a gather instead
    scatters every step's gradient into a zero-filled copy of the whole stack."""
    strip = len(BACKBONE_PREFIX)
    first = layout.clients
    params = {n[strip:]: v for n, v in live.items() if n.startswith(BACKBONE_PREFIX)}
    buffers = {n[strip:]: b[:first] for n, b in running.items()}
    if layout.row_clients is None:
        features, stats = forward(params, buffers, x, mask, keys)
        return features, stats, {}
    others = layout.row_clients[first:]
    extra = {n: leaves[n].index_select(0, others).requires_grad_() for n in live if n.startswith(BACKBONE_PREFIX)}
    features, stats = forward(params, buffers, x[:first], mask[:first], None if keys is None else keys[:first])
    more, more_stats = forward({n[strip:]: v for n, v in extra.items()},
                               {n[strip:]: b.index_select(0, others) for n, b in running.items()}, x[first:],
                               mask[first:], None if keys is None else keys[first:])
    joined = {layer: tuple(torch.cat([a, b]) for a, b in zip(stats[layer], more_stats[layer], strict=True))
              for layer in stats}
    if isinstance(features, Tensor):
        return torch.cat([features, more]), joined, extra
    return [torch.cat([a, b]) for a, b in zip(features, more, strict=True)], joined, extra


def _rows(passes: Tensor | list[Tensor], positions: Tensor) -> Tensor | list[Tensor]:
    """Rows `positions` of a backbone pass's output (a feature tensor, or each level of a pyramid)."""
    if isinstance(passes, Tensor):
        return passes.index_select(0, positions)
    return [level.index_select(0, positions) for level in passes]


def _head_loss(head: nn.Module, row_loss: RowLoss, size: tuple[int, ...] | None, context: NormContext | None):
    """One pair's loss and its head's BatchNorm statistics (a head with BatchNorm reads its row's sample mask from
    `context`): its head (with the pair's own buffers) on its row's features (a vector head), or on its row's
    pyramid decoded at the input's `size` (a dense decoder)."""
    def loss(params: dict[str, Tensor], buffers: dict[str, Tensor], inputs: Tensor | list[Tensor], y: Tensor,
             weight: Tensor) -> tuple[Tensor, dict[str, Statistics]]:
        if context is not None:
            context.mask, context.stats = (weight > 0).to(weight.dtype), {}
        arguments = (inputs,) if size is None else (inputs, size)
        value = row_loss(functional_call(head, (params, buffers), arguments), y, weight)
        return value, {} if context is None else dict(context.stats)

    return loss


def _fold_head_statistics(running: dict[str, Tensor], prefix: str, stats: Mapping[str, Statistics], head: nn.Module,
                          count: int) -> None:
    """The running statistics of a head group's active pairs (its first `count`, each its own BatchNorm) after a
    step: mean ← mean + m·moved·(batch mean − mean), the same for the variance (unbiased), the counter + moved."""
    momenta = {m.name: m.momentum for m in head.modules() if isinstance(m, MaskedBatchNorm)}
    for layer, (mean, variance, moved) in stats.items():
        m = momenta[layer]
        for buffer, value in ((f"{layer}.running_mean", mean), (f"{layer}.running_var", variance)):
            current = running[prefix + buffer][:count]
            current.copy_(current + (m * moved.view(-1, *([1] * (current.dim() - 1)))) * (value - current))
        counter = running[prefix + f"{layer}.num_batches_tracked"][:count]
        counter.add_(moved.to(counter.dtype))


def _results(round_: Round, leaves: Mapping[str, Tensor], running: Mapping[str, Tensor], steps: list[int],
             recorded: list[tuple[Tensor, Tensor]], states: list[dict[str, Tensor]], term_states: list[list[Tensor]],
             moved: list[list[dict[str, Tensor]]], probes: list[list[Tensor | None]]) -> list[PlanResult]:
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
        params.update({name: plan.start[name] for name in round_.frozen_names if name in plan.start})
        for name in round_.buffer_names:
            params[BUFFER_PREFIX + name] = buffers[name][c]
        for name in round_.head_buffer_names:  # those of the heads it trains from their pairs' rows, the rest as sent
            task = task_of_key(name)
            if task in plan.data:
                index, position = round_.pair_places[c, task]
                params[BUFFER_PREFIX + name] = buffers[round_.groups[index].key(index, name[len(head_prefix(task)):])][
                    position]
            elif name in plan.start:
                params[BUFFER_PREFIX + name] = plan.start[name]
        losses = {t: pair_losses[c, t] / max(steps[c], 1) for t in plan.data}
        results.append(PlanResult(params, TrainReport(steps[c], losses), states[c], [t[c] for t in term_states],
                                  [m[c] for m in moved], [p[c] for p in probes]))
    return results

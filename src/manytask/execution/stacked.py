"""What a round's clients add to their objective and keep afterwards, stacked over the rows of the leaves that
train: parameter terms (`ParameterTerm`), feature terms (`FeatureTerm`, with their frozen anchors), feature terms
with a state of their own (`FeatureStateTerm`) and state updates (`StateUpdate`)."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Mapping, Sequence
from functools import partial

import torch
from torch import Tensor
from torch.func import functional_call, vmap

from manytask.client.terms import MovingParameterTerm, ParameterTerm
from manytask.execution.layout import Round, Step
from manytask.execution.plan import Unbatchable
from manytask.models.multitask import BACKBONE_PREFIX, merged_state


def per_leaf(round_: Round, per_client: Sequence[Mapping[str, Tensor]], leaves: Mapping[str, Tensor],
             untrained: bool = False) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Per-client tensors by parameter name, placed on the rows of the leaves that train them: per leaf, the stacked
    values (zeros on rows without one) and `present`, (rows,), 1 where a row has one. A parameter the client does
    not train is left out where `untrained` allows it, else refused."""
    places: dict[str, list[tuple[int, Tensor]]] = {}
    for client, tensors in enumerate(per_client):
        for name, value in tensors.items():
            place = round_.leaf_of(client, name)
            if place is None and untrained:
                continue
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


class StackedTerm:
    """One hook position's parameter terms of every client, over the leaves: differentiated with the loss (`loss`),
    or, where the term gives its gradient, added to the stacked gradients (`add_gradient`); the operands of a
    `MovingParameterTerm` move in place every `every` steps."""

    def __init__(self, round_: Round, terms: list[ParameterTerm], leaves: Mapping[str, Tensor]) -> None:
        self.term = terms[0]
        if any(t.scale != self.term.scale or t.piece is not self.term.piece or t.gradient is not self.term.gradient
               for t in terms):
            raise Unbatchable("clients of the round weigh a training term differently")
        self.analytic = self.term.gradient is not None
        self.moves = isinstance(self.term, MovingParameterTerm)
        if self.moves and any(not same_function(t.move, self.term.move) or t.every != self.term.every
                              for t in terms):
            raise Unbatchable("clients of the round move a training term's operands differently")
        self.names = [[n for n in t.operands if round_.leaf_of(c, n) is not None] for c, t in enumerate(terms)]
        # a term's piece on a parameter the client does not train (another task's head, in a copy trained on one
        # task) is a constant of its objective: it moves nothing, so it is left out
        self.operands, self.present = per_leaf(round_, [t.operands for t in terms], leaves, untrained=True)
        rows = Counter(round_.leaf_of(c, n)[0] for c, names in enumerate(self.names) for n in names)
        self.everywhere = {leaf for leaf, count in rows.items() if count == len(leaves[leaf])}  # no row to mask
        if self.moves:  # moved in place: the clients' own operands stay as they were
            self.operands = {k: v.clone() for k, v in self.operands.items()}

    def loss(self, live: Mapping[str, Tensor]) -> Tensor:
        """The term over the live rows (a prefix of each leaf's)."""
        operands = {k: v[:len(live[k])] for k, v in self.operands.items()}
        return self.term.stacked_loss(live, operands, {k: v[:len(live[k])] for k, v in self.present.items()})

    def add_gradient(self, grads: Mapping[str, Tensor], live: Mapping[str, Tensor]) -> None:
        """Adds scale · present · (c_θ θ + c_a a) to `grads` (by leaf, over the live rows), in place: one fused sum
        per operand over the leaves every row covers, a masked one per other leaf."""
        full = [leaf for leaf in self.operands if leaf in self.everywhere]
        partial_leaves = [leaf for leaf in self.operands if leaf not in self.everywhere]
        for coefficient, values in zip(self.term.gradient, (live, self.operands), strict=True):
            if not coefficient:
                continue
            alpha = self.term.scale * coefficient
            rows = {leaf: values[leaf][:len(live[leaf])].detach() for leaf in self.operands}
            if full:
                torch._foreach_add_([grads[leaf] for leaf in full], [rows[leaf] for leaf in full], alpha=alpha)
            for leaf in partial_leaves:
                present = self.present[leaf][:len(live[leaf])].view(-1, *[1] * (live[leaf].dim() - 1))
                grads[leaf].addcmul_(rows[leaf], present, value=alpha)

    def move(self, step: int, leaves: Mapping[str, Tensor], sizes: Mapping[str, int]) -> None:
        """After step `step` (0-based) of the active rows (`sizes`, per leaf): a ← move(a, θ) every `every` steps."""
        if not self.moves or (step + 1) % self.term.every:
            return
        for leaf, operand in self.operands.items():
            active = operand[:sizes[leaf]]
            active.copy_(self.term.move(active, leaves[leaf][:sizes[leaf]]))

    def final(self, round_: Round) -> list[dict[str, Tensor]]:
        """Each client's operands after the round, by parameter name (views of the stacks)."""
        results = []
        for client, names in enumerate(self.names):
            places = {name: round_.leaf_of(client, name) for name in names}
            results.append({name: self.operands[leaf][row] for name, (leaf, row) in places.items()})
        return results


def same_function(a: object, b: object) -> bool:
    """`a` is `b`, or both are `functools.partial`s of one function with equal arguments (a per-client partial)."""
    if a is b:
        return True
    return (isinstance(a, partial) and isinstance(b, partial) and a.func is b.func and a.args == b.args
            and a.keywords == b.keywords)


class StackedFeatureTerm:
    """One hook position's feature terms of every client: the frozen anchors stacked per row once a round, their
    representations computed per step without gradient, the term on every row's batch at once."""

    def __init__(self, round_: Round, position: int) -> None:
        self.terms = [plan.features[position] for plan in round_.plans]
        self.term = self.terms[0]
        if any(t.scale != self.term.scale for t in self.terms):
            raise Unbatchable("clients of the round weigh a feature term differently")
        self.prefix = f"{self.term.module}."
        self.module = round_.template.get_submodule(self.term.module)
        self.eval_backbone = copy.deepcopy(round_.template.backbone).eval()
        self.rows = None if round_.one_row_each else round_.row_clients
        self.per_row_tasks = torch.tensor([len(row.tasks) for row in round_.rows], device=round_.device)
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

    def loss(self, live: Mapping[str, Tensor], features: Tensor, x: Tensor, weight: Tensor, layout: Step) -> Tensor:
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
        tasks = self.per_row_tasks.to(per_sample.dtype)
        tasks = (tasks[:layout.clients] if layout.rows is None else tasks.index_select(0, layout.rows)).view(-1, 1)
        return self.term.scale * (per_sample * weight * tasks).sum()


class StackedStateTerm:
    """One hook position's `FeatureStateTerm`s of every client: their states stacked over clients once a round,
    the term's piece mapped over the step's active rows, the states moved in place after each step's loss."""

    def __init__(self, round_: Round, position: int) -> None:
        terms = [plan.state_terms[position] for plan in round_.plans]
        self.term = terms[0]
        if not round_.one_row_each or len(round_.groups) != 1:
            raise Unbatchable("a feature term with a state needs one batch a client a step, under one head structure")
        if any(t.scale != self.term.scale or t.piece is not self.term.piece or t.state.shape != self.term.state.shape
               for t in terms):
            raise Unbatchable("clients of the round weigh, compute or shape a feature term's state differently")
        self.state = torch.stack([t.state for t in terms]).detach()

    def loss(self, features: Tensor, labels: Tensor, mask: Tensor, layout: Step) -> Tensor:
        """The term over the step's active rows (a prefix: one row per client), and their states moved."""
        active = self.state[:layout.clients]
        losses, moved = vmap(self.term.piece)(features, labels, mask, active)
        active.copy_(moved)
        return self.term.scale * losses.sum()

    def final(self) -> list[Tensor]:
        """Each client's state after the round (views of the stack)."""
        return list(self.state.unbind(0))


def updated_states(round_: Round, leaves: Mapping[str, Tensor]) -> list[dict[str, Tensor]]:
    """Each client's `StateUpdate` applied to its trained parameters, all clients' at once per leaf (views of the
    results, by parameter name); empty dicts where the plans carry none."""
    updates = [plan.update for plan in round_.plans]
    if all(u is None for u in updates):
        return [{} for _ in updates]
    if any(u is None for u in updates) or len({u.function for u in updates}) > 1:
        raise Unbatchable("clients of the round update their state differently")
    state, _ = per_leaf(round_, [u.state for u in updates], leaves)
    reference, _ = per_leaf(round_, [u.reference for u in updates], leaves)
    function = updates[0].function
    rows = {leaf: function(state[leaf], leaves[leaf], reference[leaf]).unbind(0) for leaf in state}
    results = []
    for client, update in enumerate(updates):
        places = {name: round_.leaf_of(client, name) for name in update.state}
        results.append({name: rows[leaf][row] for name, (leaf, row) in places.items()})
    return results


def stacked_terms(round_: Round, leaves: Mapping[str, Tensor]) -> list[StackedTerm]:
    kinds = {tuple(type(t) for t in plan.terms) for plan in round_.plans}
    if len(kinds) > 1:
        raise Unbatchable("clients of the round have different training terms")
    return [StackedTerm(round_, [plan.terms[position] for plan in round_.plans], leaves)
            for position in range(len(round_.plans[0].terms))]

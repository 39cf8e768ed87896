"""A round's `LookaheadProbe`s measured for every client at once (`client/lookahead.py`).

At a measured step, for each task i of the round: one gradient of the sum of the active clients' task-i losses
gives every client its own ∇_{θ_s} L_i (rows are independent); each client's shared parameters move one plain SGD
step along it, θ_s − lr·(∇L_i + wd·θ_s), and one forward pass of the step's batches with the moved parameters and
the step's heads gives every client's losses after it, without gradient and without touching the BatchNorm
statistics. The probe's piece then scores every client's (base, after) at once (`vmap`), and the scores add up on
the device; they are read once, as each client's mean, when the round's results are made."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor
from torch.func import vmap

from manytask.client.lookahead import LookaheadProbe
from manytask.execution.layout import Round, Step
from manytask.execution.plan import Unbatchable
from manytask.execution.stacked import same_function

PairLosses = Callable[[Mapping[str, Tensor]], Tensor]  # leaves -> the step's active pair losses, in loss order


class StackedProbe:
    """One hook position's probes of every client of a round."""

    def __init__(self, round_: Round, probes: Sequence[LookaheadProbe], steps: Sequence[int], lr: float) -> None:
        self.probe = probe = probes[0]
        if any(p.every != probe.every or p.weight_decay != probe.weight_decay
               or not same_function(p.piece, probe.piece) for p in probes):
            raise Unbatchable("clients of the round measure lookaheads differently")
        if not round_.one_row_each:
            raise Unbatchable("a lookahead needs every task of a client on the same batch")
        self.lr = lr
        self.client_tasks = [list(plan.data) for plan in round_.plans]
        self.tasks = list(dict.fromkeys(t for tasks in self.client_tasks for t in tasks))
        self.place = {t: i for i, t in enumerate(self.tasks)}
        device = round_.device
        # every pair of the round in loss order (group by group), by client and task index
        pairs = [(c, self.place[t]) for group in round_.groups for c, t, _ in group.pairs]
        self.pair_client = torch.tensor([c for c, _ in pairs], device=device)
        self.pair_task = torch.tensor([t for _, t in pairs], device=device)
        self.measured = [[probe.measures(s, len(tasks)) for s in range(count)]
                         for tasks, count in zip(self.client_tasks, steps, strict=True)]
        self.shared = [n for n in round_.names if round_.per_client(n)]
        size = len(self.tasks)
        self.total = torch.zeros(len(round_.plans), size, size, device=device)

    def measure(self, step: int, layout: Step, live: Mapping[str, Tensor], losses: Tensor,
                pair_losses: PairLosses) -> None:
        """Adds the scores of the step's measured clients (the active ones the probe measures at `step`); `losses`
        are the step's pair losses (with their graph), `pair_losses` gives them for other leaves."""
        active = layout.clients
        chosen = [self.measured[c][step] for c in range(active)]
        if not any(chosen):
            return
        clients = self.pair_client.index_select(0, layout.pair_index)
        tasks = self.pair_task.index_select(0, layout.pair_index)
        size = len(self.tasks)
        base = torch.ones(active, size, dtype=losses.dtype, device=losses.device)
        base.index_put_((clients, tasks), losses.detach())
        after = torch.ones(active, size, size, dtype=losses.dtype, device=losses.device)
        held = {self.place[t] for c in range(active) if chosen[c] for t in self.client_tasks[c]}
        shared = [live[n] for n in self.shared]
        for i in sorted(held):
            of_task = (tasks == i).to(losses.dtype)
            grads = torch.autograd.grad((losses * of_task).sum(), shared, retain_graph=True, materialize_grads=True)
            with torch.no_grad():
                moved = {n: p - self.lr * (g + self.probe.weight_decay * p)
                         for n, p, g in zip(self.shared, shared, grads, strict=True)}
                shifted = pair_losses({**live, **moved})
                after[:, i].index_put_((clients, tasks), shifted.detach())
        with torch.no_grad():
            scores = vmap(lambda b, a: self.probe.piece(b, a, self.lr))(base, after)
            chosen_rows = torch.tensor(chosen).to(scores.device).view(-1, 1, 1)
            self.total[:active] += torch.where(chosen_rows, scores, 0.0)

    def final(self) -> list[Tensor | None]:
        """Each client's mean scores over its tasks (in its data's order), None where none was measured."""
        results: list[Tensor | None] = []
        for c, tasks in enumerate(self.client_tasks):
            count = sum(self.measured[c])
            if not count:
                results.append(None)
                continue
            index = torch.tensor([self.place[t] for t in tasks], device=self.total.device)
            results.append(self.total[c].index_select(0, index).index_select(1, index) / count)
        return results


def stacked_probes(round_: Round, steps: Sequence[int], lr: float) -> list[StackedProbe]:
    counts = {len(plan.probes) for plan in round_.plans}
    if len(counts) > 1:
        raise Unbatchable("clients of the round measure different lookaheads")
    return [StackedProbe(round_, [plan.probes[position] for plan in round_.plans], steps, lr)
            for position in range(counts.pop())]

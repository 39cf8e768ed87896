"""FedGA (Zhang et al., CVPR 2023, "Federated Domain Generalization with Generalization Adjustment"; authors' code
MediaBrain-SJTU/FedDG-GA, `utils/weight_adjust.py`): FedAvg whose aggregation weights a_n move towards the clients
on which the aggregated model generalizes worst.

Client rule: FedAvg's training. Each participation, the client measures on its whole training data (eval mode, no
gradient) the loss of the global model it received and, after training, the loss of its trained model, which it
keeps in client state. From its second participation on it uploads the generalization gap
    G_n = L_n(global model received this round) − L_n(its own model of its previous round)    (scalar `ga/gap`),
the paper's gap of the previous aggregation, so adjusting the weights with it before this round's aggregation keeps
the paper's order. A multi-task client's loss is the mean per-sample loss over all its tasks' samples (per-task
copies: each copy on its own task).

Server rule (paper Algorithm 1), before aggregating round r (0-based) of R, over the participants that sent a gap:
    G̃ = (G − mean G) / max|G − mean G|   (no change when that max is 0),
    a_n ← a_n + d_r·G̃_n,  d_r = d·(1 − r/R),  then clip to [0, 1] and renormalize to Σ_n a_n = 1,
with a_n initialized to client n's share of all samples; then FedAvg with weight a_n·w_{n,k}/n_n per parameter
(w_{n,k} FedAvg's weight, n_n the client's sample count), so the initial weights are exactly FedAvg's.
d defaults to 0.2, the authors' `--step_size`; their code also scales it by 1/3 (one over its three source domains)
and does not subtract the mean, while we follow the paper's formula.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from pydantic import Field
from torch import Tensor, nn

from manytask.client.trainer import TaskData
from manytask.messages import Message
from manytask.methods.base import ClientContext, MethodDef, Setup
from manytask.methods.client_state import StatePart
from manytask.methods.common.aggregation import fedavg_weights
from manytask.methods.hosts.base import HostClient, HostParams, TrainedCopy
from manytask.methods.hosts.server import Adjust, HostServer, Rule
from manytask.methods.registry import HOST, register_method
from manytask.models.multitask import load_state
from manytask.tasks.task import TaskSpec

GAP = "ga/gap"  # reply scalar: the client's generalization gap
OWN_LOSS = "fedga/loss_sum"  # client state, per copy: summed per-sample loss of its trained model on its data
PART, WEIGHTS = "fedga", "weights"  # server state: a_n over all clients, in client-id order


class FedGaParams(HostParams):
    step_size: float = Field(default=0.2, ge=0, description="d: step of the weight adjustment, decayed linearly to 0")


def generalization_adjustment(weights: Tensor, members: Sequence[int], gaps: Tensor, step: float) -> Tensor:
    """FedDG-GA Algorithm 1: a_n ← a_n + step·(G_n − mean G)/max|G − mean G| for the `members` (positions in
    `weights`) that reported the gaps G, then clip to [0, 1] and renormalize; unchanged when the gaps are all
    equal."""
    centered = gaps - gaps.mean()
    scale = centered.abs().max()
    if scale == 0:
        return weights.clone()
    adjusted = weights.clone()
    adjusted[list(members)] += step * centered / scale
    adjusted = adjusted.clamp(0.0, 1.0)
    return adjusted / adjusted.sum()


@torch.no_grad()
def summed_loss(module: nn.Module, specs: Mapping[str, TaskSpec], data: TaskData, batch_size: int = 512) -> float:
    """Σ over every sample of every task in `data` of its loss under `module` (eval mode)."""
    module.eval()
    total = 0.0
    for task, (x, y) in data.items():
        for start in range(0, len(y), batch_size):
            xb, yb = x[start : start + batch_size], y[start : start + batch_size]
            total += specs[task].loss(module(xb, task), yb).item() * len(yb)
    return total


def sample_count(data: TaskData) -> int:
    return sum(len(y) for _, y in data.values())


class FedGaClient(HostClient):
    def fit(self, ctx: ClientContext, payload: Message | None) -> Message:
        previous = self.previous_loss(ctx)  # read before training replaces it
        reply = super().fit(ctx, payload)
        if previous is not None:
            reply.scalars[GAP] = self.received_loss(ctx, payload) - previous
        return reply

    def finish(self, ctx: ClientContext, copy: TrainedCopy) -> dict[str, float]:
        data = {t: ctx.data[t] for t in copy.tasks}
        ctx.state[copy.state_prefix + OWN_LOSS] = torch.tensor(summed_loss(copy.module, self.setup.specs, data),
                                                               dtype=torch.float64)
        return {}

    def state_parts(self, copies: tuple[str, ...], keys: list[str]) -> dict[str, StatePart]:
        return {"own loss": StatePart.of([OWN_LOSS], copies)}

    def previous_loss(self, ctx: ClientContext) -> float | None:
        """Mean per-sample loss of the client's models of its previous round (None before its first)."""
        sums = [v for k, v in ctx.state.items() if k == OWN_LOSS or k.endswith("/" + OWN_LOSS)]
        return float(sum(sums)) / sample_count(ctx.data) if sums else None

    def received_loss(self, ctx: ClientContext, payload: Message | None) -> float:
        """Mean per-sample loss of the received global model on all the client's data."""
        model, module = self.build_on_device()
        load_state(model, self.received(ctx, payload))
        return summed_loss(module, self.setup.specs, ctx.data) / sample_count(ctx.data)


class FedGaServer(HostServer):
    params: FedGaParams

    def __init__(self, setup: Setup, params: FedGaParams) -> None:
        super().__init__(setup, params)
        self.clients = sorted(setup.holdings)
        self.samples = torch.tensor([sum(setup.holdings[c].values()) for c in self.clients], dtype=torch.float64)
        self.parts[PART] = {WEIGHTS: self.samples / self.samples.sum()}

    @property
    def weights(self) -> Tensor:
        return self.parts[PART][WEIGHTS]

    def update_weights(self, client: int, keys: list[str], sizes: dict[str, int]) -> dict[str, float | Tensor]:
        """FedAvg's weight × a_n / n_n."""
        position = self.clients.index(client)
        scale = float(self.weights[position]) / float(self.samples[position])  # a_n may lie on the device
        return {k: w * scale for k, w in fedavg_weights(keys, sizes).items()}

    def aggregate_replies(
        self, round_index: int, replies: Mapping[int, Message | None], adjust: Adjust | None = None,
        rule: Rule | None = None,
    ) -> dict[str, float]:
        """Adjust a_n from the reported gaps, then aggregate with the adjusted weights."""
        gaps = {c: float(r.scalars[GAP]) for c, r in replies.items() if r is not None and GAP in r.scalars}
        if gaps:
            step = self.params.step_size * (1 - round_index / self.setup.rounds)
            members = [self.clients.index(c) for c in gaps]
            values = torch.tensor(list(gaps.values()), dtype=torch.float64, device=self.weights.device)
            self.parts[PART][WEIGHTS] = generalization_adjustment(self.weights, members, values, step)
        return super().aggregate_replies(round_index, replies, adjust, rule)


register_method(
    "fedga", MethodDef(FedGaClient, FedGaServer, family=HOST), FedGaParams,
    "FedGA: FedAvg with aggregation weights adjusted towards clients with larger generalization gaps",
)

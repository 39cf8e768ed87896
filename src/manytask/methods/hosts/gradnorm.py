"""GradNorm (Chen et al., ICML 2018, "GradNorm: Gradient Normalization for Adaptive Loss Balancing in Deep
Multitask Networks", Algorithm 1) as an all-in-one FedAvg host: clients combine their task losses with learned
weights through the trainer's loss-combination hook; the server averages the clients' weights like the model.

At each local step, with W the last shared layer, G_i = ‖∇_W w_i L_i‖, Ḡ = mean_i G_i, L̃_i = L_i(t) / L_i(0),
r_i = L̃_i / mean_j L̃_j:  L_grad = Σ_i |G_i − Ḡ·r_i^α| with the targets Ḡ·r_i^α held constant, one gradient step on
the weights (∂L_grad/∂w_i = sign(G_i − Ḡ r_i^α)·‖∇_W L_i‖), then Σ_i w_i renormalized to the number of tasks. The
model's loss is Σ_i w_i L_i with the step's weights held constant. L_i(0) is the client's loss at its first step
(kept in client state); the weights travel as scalars `gradnorm/<task>` both ways.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from pydantic import Field
from torch import Tensor

from manytask.client.trainer import LossCombiner, StepContext
from manytask.messages import Message
from manytask.methods.base import ClientContext, MethodDef, Setup
from manytask.methods.client_state import StatePart
from manytask.methods.common.updates import Update
from manytask.methods.hosts.base import TrainedCopy
from manytask.methods.hosts.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from manytask.methods.registry import HOST, register_method
from manytask.models.multitask import task_of_key

WEIGHT_PREFIX = "gradnorm/"
INITIAL_LOSSES = "gradnorm/initial"  # client state: L_i(0) in the client's task order


class GradNormParams(FedAvgParams):
    alpha: float = Field(1.5, ge=0, description="α: how strongly slow tasks are pulled up")
    weight_lr: float = Field(0.025, gt=0, description="learning rate of the loss weights")


def gradnorm_step(weights: Tensor, norms: Tensor, ratios: Tensor, alpha: float, lr: float) -> Tensor:
    """One GradNorm update of the loss weights (Chen et al., 2018, eq. 2 and Algorithm 1). `norms[i]` = ‖∇_W L_i‖
    (unweighted), `ratios[i]` = L_i(t) / L_i(0). Returns the new weights, positive and summing to n."""
    grads = weights * norms
    target = grads.mean() * (ratios / ratios.mean()) ** alpha
    updated = (weights - lr * torch.sign(grads - target) * norms).clamp_min(1e-3)
    return updated * len(weights) / updated.sum()


def last_shared_layer(model: torch.nn.Module) -> Tensor:
    """W: the last trainable weight (not a bias) no task owns."""
    shared = [p for n, p in model.named_parameters() if p.requires_grad and task_of_key(n) is None and p.dim() > 1]
    return shared[-1]


class GradNormCombiner:
    """Σ_i w_i L_i, updating w after each step's losses are known (the weights are constants of the step)."""

    def __init__(self, weights: Tensor, initial: Tensor | None, params: GradNormParams) -> None:
        self.weights, self.initial, self.params = weights, initial, params

    def __call__(self, step: StepContext) -> Tensor:
        losses = torch.stack(list(step.losses.values()))
        if self.initial is None:
            self.initial = losses.detach().clone()
        total = (self.weights * losses).sum()
        layer = last_shared_layer(step.model)
        norms = torch.stack([
            torch.linalg.vector_norm(torch.autograd.grad(loss, layer, retain_graph=True)[0])
            for loss in step.losses.values()
        ])
        ratios = losses.detach() / self.initial
        self.weights = gradnorm_step(self.weights, norms, ratios, self.params.alpha, self.params.weight_lr)
        return total


class GradNormClient(FedAvgClient):
    params: GradNormParams

    def fit(self, ctx: ClientContext, payload: Message | None) -> Message:
        assert payload is not None
        self.sent_weights = {k[len(WEIGHT_PREFIX):]: float(v) for k, v in payload.scalars.items()
                             if k.startswith(WEIGHT_PREFIX)}
        return super().fit(ctx, payload)

    def combine(self, ctx: ClientContext, copy: TrainedCopy) -> LossCombiner:
        weights = torch.tensor([self.sent_weights.get(t, 1.0) for t in copy.tasks], device=self.device)
        self.combiner = GradNormCombiner(weights, ctx.state.get(INITIAL_LOSSES), self.params)
        return self.combiner

    def state_parts(self, copies: tuple[str, ...], keys: list[str]) -> dict[str, StatePart]:
        return {"initial losses": StatePart.of([INITIAL_LOSSES])}

    def finish(self, ctx: ClientContext, copy: TrainedCopy) -> dict[str, float]:
        if self.combiner.initial is not None:
            ctx.state[INITIAL_LOSSES] = self.combiner.initial
        return {WEIGHT_PREFIX + t: float(w) for t, w in zip(copy.tasks, self.combiner.weights, strict=True)}


class GradNormServer(FedAvgServer):
    params: GradNormParams

    def __init__(self, setup: Setup, params: GradNormParams) -> None:
        super().__init__(setup, params)
        self.parts["gradnorm"] = {"weights": torch.ones(len(setup.specs), dtype=torch.float64)}

    def payload_for(self, client: int) -> Message:
        weights = dict(zip(self.setup.specs, self.parts["gradnorm"]["weights"].tolist(), strict=True))
        held = self.setup.holdings[client]
        return Message.from_tensors(super().payload_for(client).tensors(),
                                    scalars={WEIGHT_PREFIX + t: w for t, w in weights.items() if t in held})

    def aggregate_updates(self, round_index: int, updates: list[Update]) -> dict[str, float]:
        """FedAvg of the model; the loss weights averaged over the clients that used them."""
        log = super().aggregate_updates(round_index, updates)
        self.parts["gradnorm"]["weights"] = averaged_weights(self.parts["gradnorm"]["weights"], updates,
                                                             list(self.setup.specs))
        return {**log, **{WEIGHT_PREFIX + t: float(w)
                          for t, w in zip(self.setup.specs, self.parts["gradnorm"]["weights"], strict=True)}}


def averaged_weights(current: Tensor, updates: list[Update], tasks: list[str]) -> Tensor:
    """Per task, the mean of the weights the clients report (the current weight where none reports it)."""
    reported: Mapping[str, list[float]] = {t: [float(u.scalars[WEIGHT_PREFIX + t]) for u in updates
                                               if WEIGHT_PREFIX + t in u.scalars] for t in tasks}
    return torch.tensor([sum(v) / len(v) if v else float(current[i]) for i, v in enumerate(reported.values())],
                        dtype=torch.float64)


register_method(
    "gradnorm", MethodDef(GradNormClient, GradNormServer, family=HOST), GradNormParams,
    "All-in-one FedAvg with GradNorm's learned task-loss weights (loss-combination hook)",
)

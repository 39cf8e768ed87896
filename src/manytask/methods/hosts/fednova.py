"""FedNova (Wang et al., NeurIPS 2020, "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization"): normalized averaging, so that clients doing more local steps do not pull the global model towards
their own objective.

Client: FedAvg's. Server, per parameter k over the updates n that contain it, with p_n = w_n / Σ_m w_m (per entry
when the weights are tensors) and Δ_n = trained − reference:
    θ_k ← θ_k + τ_eff · Σ_n p_n Δ_n / a_n,   τ_eff = Σ_n p_n a_n   (FedNova's choice of τ_eff),
where a_n = ‖a_n‖₁ is client n's normalizing factor, the paper's one for τ_n local steps of SGD with momentum ρ:
a = [τ − ρ(1 − ρ^τ)/(1 − ρ)] / (1 − ρ), so a = τ for plain SGD. The paper gives no factor for adaptive
local optimizers: with AdamW we take a = τ. τ_n is computed on the server from the public holdings
(`Trainer.steps_for`, which respects `local_steps`), so clients upload nothing beyond FedAvg's reply. Buffers are
averaged with FedAvg's weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from manytask.methods.base import MethodDef
from manytask.methods.common.aggregation import Weight, weighted_average
from manytask.methods.common.updates import Update
from manytask.methods.hosts.fedavg import FedAvgClient, FedAvgParams
from manytask.methods.hosts.rules import Plain, RoundDelta, RuleServer
from manytask.methods.registry import HOST, register_method


def normalizing_factor(steps: int, momentum: float) -> float:
    """‖a‖₁ of τ local steps of SGD with momentum ρ (FedNova): [τ − ρ(1 − ρ^τ)/(1 − ρ)] / (1 − ρ); τ when ρ = 0.
    It sums how often each step's gradient is applied: 1, 1 + ρ, 1 + ρ + ρ², …"""
    return (steps - momentum * (1 - momentum**steps) / (1 - momentum)) / (1 - momentum)


def normalized_step(
    deltas: Sequence[Mapping[str, Tensor]], weights: Sequence[Mapping[str, Weight]], factors: Sequence[float]
) -> dict[str, Tensor]:
    """FedNova's server step per key: τ_eff · Σ_n p_n Δ_n / a_n with τ_eff = Σ_n p_n a_n, over the updates that
    hold the key (p_n = w_n / Σ_m w_m, per entry for tensor weights)."""
    pairs = list(zip(deltas, factors, strict=True))
    direction = weighted_average([{k: d / a for k, d in delta.items()} for delta, a in pairs], weights)
    factors_by_key = [dict.fromkeys(delta, torch.tensor(a, dtype=torch.float64)) for delta, a in pairs]
    tau_eff = weighted_average(factors_by_key, weights)
    return {k: (tau_eff[k] * d).to(d.dtype) for k, d in direction.items()}


class FedNovaServer(RuleServer):
    """FedAvg's step (`rules.Plain`) on FedNova's normalized mean update."""

    def build_rule(self) -> Plain:
        return Plain()

    def normalizing_factor(self, update: Update) -> float:
        """a_n of the copy's local steps, from its public task sizes; a = τ for AdamW."""
        train = self.setup.train
        momentum = 0.0 if train.optimizer == "adamw" else train.momentum
        return normalizing_factor(self.setup.trainer().steps_for(update.sizes), momentum)

    def round_summary(self, updates: list[Update]) -> RoundDelta:
        deltas = [u.deltas() for u in updates]
        step = normalized_step(deltas, [u.weights for u in updates], [self.normalizing_factor(u) for u in updates])
        return RoundDelta(step, {k: sum(k in delta for delta in deltas) for k in step})


register_method(
    "fednova", MethodDef(FedAvgClient, FedNovaServer, family=HOST), FedAvgParams,
    "FedNova: FedAvg clients, server averages updates normalized by each client's local steps",
)

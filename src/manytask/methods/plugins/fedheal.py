"""FedHEAL (Chen et al., CVPR 2024, "Fair Federated Learning under Domain Skew with Local Consistency and Domain
Diversity"), a plug-in over any host; FedDEA's comparison. Two server-side parts, per update n:

- FPHL, parameter-wise consistency masking: h_n holds, per entry, the fraction of the client's past participations
  in which its update was ≥ 0; an entry is kept where the fraction of past updates in the current direction
  exceeds τ (every entry at a client's first participation); then h_n ← (h_n·c_n + 1[Δ_n ≥ 0]) / (c_n + 1).
- FAEL, fairness weights from update distances: d_n = Σ_k ‖Δ̂_n,k‖₂ of the masked update,
  δ_n ← (1 − β)·δ_n^prev + β·d_n / Σ d, w_n ← w_n^prev + δ_n (w^prev starts at 1 / number of updates),
  p_n = w_n / Σ w over this round's updates.
The host aggregates reference + Δ̂_n with per-entry weights host_weight × p_n × mask_n, or host_weight × p_n where
those sum to 0 over the updates (the authors' fallback, on the weights: no update is kept there, or only updates
the host gives weight 0, e.g. FedGA's clipped clients; Δ̂ is 0 there anyway). Buffers are untouched.

Choices: c_n counts the client's participations, where the authors' code (`yuhangchen0/FedHEAL`,
models/utils/federated_model.py) uses the round index, which is the same under full participation; defaults
τ = 0.3, β = 0.4 are theirs (main.py). Their code masks global − local, we mask Δ = local − global with 1[Δ ≥ 0]:
the two differ only at entries with Δ = 0 exactly. The authors replace the sample-size weights by p_n; we multiply
the host's weights by p_n, so FedHEAL composes with any host's weighting. History and weights are kept per
(client, copy), and "participants" for w^prev are this round's updates.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from pydantic import Field
from torch import Tensor

from manytask.methods.common.updates import Update
from manytask.methods.plugins.base import PluginClient, PluginServer
from manytask.methods.registry import PluginDef, register_plugin
from manytask.registry import Params


class FedhealParams(Params):
    threshold: float = Field(default=0.3, ge=0, lt=1, description="consistency threshold τ of the masks")
    beta: float = Field(default=0.4, ge=0, le=1, description="momentum β of the fairness weight steps")


def consistency_mask(change: Tensor, history: Tensor | None, count: int, threshold: float) -> tuple[Tensor, Tensor]:
    """FPHL, FedHEAL's consistency masking, for one array: (mask, next history). `history` is the fraction h of
    the `count` past updates that were ≥ 0 (None before the first); the mask keeps entries where the fraction of
    past updates in the direction of `change` exceeds `threshold`, all of them at the first participation."""
    rises = (change >= 0).to(change.dtype)
    if history is None:
        return torch.ones_like(change), rises
    agreement = torch.where(change >= 0, history, 1 - history)
    return (agreement > threshold).to(change.dtype), (history * count + rises) / (count + 1)


def fairness_weights(
    distances: Tensor, previous_weights: Tensor, previous_steps: Tensor, beta: float
) -> tuple[Tensor, Tensor, Tensor]:
    """FAEL, FedHEAL's fairness weights: δ = (1 − β)·δ^prev + β·d / Σ d, w = w^prev + δ, p = w / Σ w.
    Returns (p, w, δ); a round whose updates are all zero adds no step."""
    total = distances.sum()
    shares = distances / total if total > 0 else torch.zeros_like(distances)
    steps = (1 - beta) * previous_steps + beta * shares
    weights = previous_weights + steps
    return weights / weights.sum(), weights, steps


def masked_norm_sum(masked: dict[str, Tensor]) -> float:
    """d_n = Σ_k ‖Δ̂_n,k‖₂ (FedHEAL's update distance)."""
    return sum(float(torch.linalg.vector_norm(v.double())) for v in masked.values())


def masked_weights(weights: list[dict[str, Tensor | float]], masks: list[dict[str, Tensor]]) -> list[dict[str, Tensor]]:
    """Per update and key, weight × mask, except at entries where those sum to 0 over the updates holding the key:
    there the unmasked weight (FedHEAL's fallback)."""
    masked = [{k: w[k] * m for k, m in mask.items()} for w, mask in zip(weights, masks, strict=True)]
    totals: dict[str, Tensor] = {}
    for update in masked:
        for key, value in update.items():
            totals[key] = totals[key] + value if key in totals else value
    return [{k: torch.where(totals[k] > 0, v, weights[n][k] * torch.ones_like(v)) for k, v in update.items()}
            for n, update in enumerate(masked)]


class FedhealServer(PluginServer[FedhealParams]):
    """Masks every update by its client's consistency history and reweights it for fairness before the host's
    rule; history, counts and weights live in `self.state` (checkpointed)."""

    device_ready = True

    def adjust(self, round_index: int, updates: list[Update]) -> list[Update]:
        slots = [self.slot(u) for u in updates]
        deltas = [u.deltas() for u in updates]
        masks = [self.mask_and_record(slot, d) for slot, d in zip(slots, deltas, strict=True)]
        masked = [{k: m * d[k] for k, m in mask.items()} for d, mask in zip(deltas, masks, strict=True)]
        shares = self.shares(slots, [masked_norm_sum(m) for m in masked])
        plain = [{k: u.weights[k] * share for k in mask} for u, mask, share in zip(updates, masks, shares, strict=True)]
        weights = masked_weights(plain, masks)
        return [replace(u.with_deltas(m), weights={**u.weights, **w})
                for u, m, w in zip(updates, masked, weights, strict=True)]

    @staticmethod
    def slot(update: Update) -> str:
        """Where an update's history lives: per client, and per copy for `per_task` copies."""
        return str(update.client) if update.copy is None else f"{update.client}/{update.copy}"

    def mask_and_record(self, slot: str, deltas: dict[str, Tensor]) -> dict[str, Tensor]:
        """The update's consistency masks; its history and participation count move one step."""
        count = int(self.state[f"count/{slot}"]) if f"count/{slot}" in self.state else 0
        masks = {}
        for key, change in deltas.items():
            history = self.state.get(f"history/{slot}/{key}") if count else None
            masks[key], self.state[f"history/{slot}/{key}"] = consistency_mask(
                change, history, count, self.params.threshold)
        self.state[f"count/{slot}"] = torch.tensor(count + 1)
        return masks

    def shares(self, slots: list[str], distances: list[float]) -> list[float]:
        """p_n of this round's updates; w and δ are remembered per slot."""
        start = torch.tensor(1 / len(slots), dtype=torch.float64)
        zero = torch.zeros((), dtype=torch.float64)
        previous_weights = torch.stack([self.state.get(f"weight/{s}", start) for s in slots])
        previous_steps = torch.stack([self.state.get(f"step/{s}", zero) for s in slots])
        p, weights, steps = fairness_weights(
            torch.tensor(distances, dtype=torch.float64), previous_weights, previous_steps, self.params.beta)
        for slot, weight, step in zip(slots, weights, steps, strict=True):
            self.state[f"weight/{slot}"], self.state[f"step/{slot}"] = weight.clone(), step.clone()
        return p.tolist()


register_plugin(
    "fedheal", PluginDef(PluginClient, FedhealServer), FedhealParams,
    "FedHEAL: consistency masks from each client's update-sign history and fairness weights from update distances",
)

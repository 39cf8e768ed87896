"""Lookahead inter-task affinity (MAS, shared/specs/mas.md; TAG, Fifty et al. 2021), measured inside the trainer's
step with the forward pass it already did (`client/lookahead.py`, which also runs it batched over clients).

S_{i→j} = 1 − L_j(X, θ_s^{+i}, θ_j) / L_j(X, θ_s, θ_j), θ_s^{+i} = θ_s − lr·(∇_{θ_s} L_i + wd·θ_s): one plain SGD step
(weight decay, no momentum) of the shared encoder on task i's loss alone. The model after a measurement is the model
before it, bit for bit, and training takes exactly the steps it would without measuring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial

import torch
from torch import Tensor

from manytask.client.lookahead import LookaheadProbe

AFFINITY_PREFIX = "affinity/"  # reply scalars and server log: affinity/<i>/<j> = S_{i→j}


def affinity_scores(base: Tensor, after: Tensor, lr: float, per_lr: bool) -> Tensor:
    """S[i, j] = 1 − after[i, j] / base[j] (diagonal 0) from a lookahead's losses; `per_lr` divides by the step's lr
    (the reference code's normalization, comparable across the lr schedule)."""
    scores = 1 - after / base
    scores = torch.where(torch.eye(len(base), dtype=torch.bool, device=base.device), 0.0, scores)
    return scores / lr if per_lr else scores


def affinity_probe(specs: Mapping, every: int, weight_decay: float, per_lr: bool = True) -> LookaheadProbe:
    """A probe measuring S every `every` local steps (the first step included)."""
    return LookaheadProbe(specs, every, weight_decay, partial(affinity_scores, per_lr=per_lr))


def affinity_scalars(tasks: Sequence[str], mean: Tensor | None) -> dict[str, float]:
    """A client's mean S over its `tasks` as `affinity/<i>/<j>` scalars (none if nothing was measured)."""
    if mean is None:
        return {}
    values = mean.tolist()  # one read from the device
    return {f"{AFFINITY_PREFIX}{a}/{b}": values[i][j] for i, a in enumerate(tasks) for j, b in enumerate(tasks)
            if i != j}


def affinity_matrix(scalars: Mapping[str, float], tasks: Sequence[str]) -> Tensor | None:
    """S[i, j] from `affinity/<i>/<j>` scalars over `tasks` (None when any pair is missing)."""
    scores = torch.zeros(len(tasks), len(tasks), dtype=torch.float64)
    for i, a in enumerate(tasks):
        for j, b in enumerate(tasks):
            if i != j:
                key = f"{AFFINITY_PREFIX}{a}/{b}"
                if key not in scalars:
                    return None
                scores[i, j] = float(scalars[key])
    return scores

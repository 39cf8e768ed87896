"""The graph-Laplacian step of federated multi-task learning, as one pure function over named tensors.

FedU (Dinh et al., 2021, Algorithm 1, server update) moves every participant's whole model; SFMTL-Graph
(spec step 6) only its head, inside its community. Both are
    w_i ← w_i − η·λ·Σ_{j ∈ G(i), j ≠ i} a_ij (w_i − w_j),
one gradient step of size η on the regularizer (λ/2)·Σ_{i<j} a_ij ‖w_i − w_j‖² (symmetric a), taken from the old
models for every i at once (a Jacobi step).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor


def pull_matrix(count: int, weights: Tensor, groups: Sequence[Sequence[int]], steps: Sequence[float], lam: float
                ) -> Tensor:
    """P with P[i, j] = η_i·λ·weights[i, j] for i ≠ j of one group, 0 elsewhere (float64), so that the step is
    w_i ← w_i − Σ_j P[i, j]·(w_i − w_j) = (1 − Σ_j P[i, j])·w_i + Σ_j P[i, j]·w_j."""
    pull = torch.zeros(count, count, dtype=torch.float64)
    for group in groups:
        index = torch.tensor(list(group), dtype=torch.long)
        pull[index.unsqueeze(1), index] = weights.detach().cpu().double()[index.unsqueeze(1), index]
    pull.fill_diagonal_(0.0)
    return pull * (lam * torch.tensor(list(steps), dtype=torch.float64)).unsqueeze(1)


def laplacian_step(
    models: Sequence[Mapping[str, Tensor]], weights: Tensor, groups: Sequence[Sequence[int]],
    step: float | Sequence[float], lam: float,
) -> list[dict[str, Tensor]]:
    """w_i ← w_i − η_i·λ·Σ_{j ∈ G(i), j ≠ i} weights[i, j]·(w_i − w_j) for every floating-point key, every i of
    every group G, with η_i = `step`, or `step[i]` when each model has its own step size. Integer tensors (a
    BatchNorm's batch counter) keep each model's own value.

    One matrix product per key over the stacked models of the groups, whatever their number (`pull_matrix`). The
    models of the groups must have the same keys; a model in no group is returned unchanged. Inputs are never
    modified; what the step leaves as it was is returned as the input tensor itself, not a copy."""
    steps = [float(step)] * len(models) if isinstance(step, int | float) else list(step)
    new = [dict(model) for model in models]
    members = sorted({i for group in groups for i in group})
    if not members:
        return new
    pull = pull_matrix(len(models), weights, groups, steps, lam)[members][:, members]
    for key, first in models[members[0]].items():
        if not first.is_floating_point():
            continue
        stacked = torch.stack([models[i][key] for i in members]).reshape(len(members), -1)
        matrix = pull.to(dtype=stacked.dtype, device=stacked.device)
        moved = stacked * (1 - matrix.sum(dim=1, keepdim=True)) + matrix @ stacked
        for row, i in enumerate(members):
            new[i][key] = moved[row].view_as(first)
    return new

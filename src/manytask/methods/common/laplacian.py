"""The graph-Laplacian step of federated multi-task learning, as one pure function over named tensors.

FedU (Dinh et al., 2021, Algorithm 1, server update) moves every participant's whole model; SFMTL-Graph
(spec step 6) only its head, inside its community. Both are
    w_i ← w_i − η·λ·Σ_{j ∈ G(i), j ≠ i} a_ij (w_i − w_j),
one gradient step of size η on the regularizer (λ/2)·Σ_{i<j} a_ij ‖w_i − w_j‖² (symmetric a), taken from the old
models for every i at once (a Jacobi step).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import Tensor


def laplacian_step(
    models: Sequence[Mapping[str, Tensor]], weights: Tensor, groups: Sequence[Sequence[int]],
    step: float | Sequence[float], lam: float,
) -> list[dict[str, Tensor]]:
    """w_i ← w_i − η_i·λ·Σ_{j ∈ G(i), j ≠ i} weights[i, j]·(w_i − w_j) for every key, every i of every group G,
    with η_i = `step`, or `step[i]` when each model has its own step size.

    The models of a group must have the same keys; a model in no group is returned unchanged (as a copy). Inputs
    are never modified."""
    steps = [float(step)] * len(models) if isinstance(step, int | float) else list(step)
    new = [{k: v.clone() for k, v in model.items()} for model in models]
    for group in groups:
        for i in group:
            for j in group:
                if j == i:
                    continue
                pull = steps[i] * lam * float(weights[i, j])
                for key, value in models[i].items():
                    new[i][key].sub_(pull * (value - models[j][key]))
    return new

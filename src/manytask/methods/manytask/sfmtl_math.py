"""SFMTL-Graph's server math as pure tensor functions (spec: shared/specs/sfmtl_graph.md, "Server").

A client's head is a linear map h(z) = W z + b over features z ∈ R^k; its anchors are one feature vector per class
(C × k) of which it holds the rows in its label set."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate

import torch
import torch.nn.functional as F
from torch import Tensor

Head = tuple[Tensor, Tensor]  # (W [C, k], b [C])


def anchor_step(features: Tensor, labels: Tensor, mask: Tensor, anchors: Tensor, momentum: float
                ) -> tuple[Tensor, Tensor]:
    """The client's anchor loss on one batch and its anchors after it (spec step 3, the client's objective): over
    the classes C_b of the batch's real samples (mask 1), with n_c of them in class c and k feature dimensions,

        ℓ = (1/|C_b|) Σ_{c ∈ C_b} (1/(n_c·k)) Σ_{n: y_n = c} ‖f(x_n) − a_c‖²,
        a_c ← m·a_c + (1 − m)·(1/n_c) Σ_{n: y_n = c} f(x_n) for c ∈ C_b, the other anchors unchanged.

    Classes are a one-hot matrix, so nothing is read back to the host (no `unique`, no boolean indexing) and the
    same function runs on one client's batch or, under `vmap`, on every client's at once. A batch with no real
    sample gives 0 and leaves the anchors as they were."""
    classes = anchors.shape[0]
    onehot = (labels.unsqueeze(-1) == torch.arange(classes, device=labels.device)).to(features.dtype)
    onehot = onehot * mask.unsqueeze(-1)  # (batch, classes)
    counts = onehot.sum(0)
    present = (counts > 0).to(features.dtype)
    own = onehot @ anchors  # each sample's class anchor (exact: one term of the sum is not zero)
    per_sample = (features - own).pow(2).mean(dim=-1)
    per_class = (onehot.T @ per_sample) / counts.clamp(min=1)
    loss = (per_class * present).sum() / present.sum().clamp(min=1)
    means = (onehot.T @ features.detach()) / counts.clamp(min=1).unsqueeze(-1)
    moved = torch.where(present.unsqueeze(-1) > 0, momentum * anchors + (1 - momentum) * means, anchors)
    return loss, moved


def _apply(head: Head, features: Tensor) -> Tensor:
    weight, bias = head
    return features @ weight.T + bias


def head_similarity(head_i: Head, head_j: Head, anchors_i: Tensor, anchors_j: Tensor) -> float:
    """Functional head similarity (step 1): both heads on the same inputs, the anchors of i and of j,
    w_head = ½ Σ_{A ∈ {a_i, a_j}} mean over rows of cos(h_i(A), h_j(A))."""
    total = 0.0
    for inputs in (anchors_i, anchors_j):
        total += float(F.cosine_similarity(_apply(head_i, inputs), _apply(head_j, inputs), dim=1).mean())
    return total / 2


def anchor_similarity(anchors_i: Tensor, anchors_j: Tensor) -> float:
    """Step 2: mean over i's anchors of the best cosine with any of j's, symmetrized (mean of both directions)."""
    cos = F.cosine_similarity(anchors_i[:, None, :], anchors_j[None, :, :], dim=2)  # [|C_i|, |C_j|]
    return float((cos.max(dim=1).values.mean() + cos.max(dim=0).values.mean()) / 2)


def similarity_graph(
    heads: Sequence[Head], anchors: Sequence[Tensor], label_sets: Sequence[Sequence[int]], alpha: float = 0.49,
    head_input: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """Step 3: w_ij = max(0, α·w_head(i,j) + (1 − α)·w_anchor(i,j)) over the held classes' anchors; symmetric,
    zero diagonal (a complete graph over the participants). `head_input` is what the model applies to features
    before its heads (the ReLU, for signed features): the heads are compared as the model runs them, on
    head_input(anchors), while the anchors are compared as they are.

    Computed for all pairs at once, the same numbers as :func:`head_similarity` and :func:`anchor_similarity` pair by
    pair: every head runs once on every client's held anchors (:func:`_head_outputs`), each row is normalized once
    (as ``F.cosine_similarity`` does: x / max(‖x‖, 1e-8), then the sum of products), the anchor cosines come as one
    [M, M] matrix over all M held anchors, and the row maxima and means, the float64 mixing and the clip at 0 follow
    the per-pair formulas step for step."""
    held = [a[list(labels)] for a, labels in zip(anchors, label_sets, strict=True)]
    n = len(heads)
    weights = torch.zeros(n, n)
    if n < 2:
        return weights
    if any(h.shape[0] == 0 for h in held):
        raise ValueError("every client must hold at least one class to compare anchors")
    opened = held if head_input is None else [head_input(h) for h in held]
    head = _head_means(heads, opened).to(torch.float64)  # [i, j]: mean over i's anchors of cos(h_i, h_j)
    anchor = _anchor_means(held)  # [i, j]: mean over i's anchors of the best cosine with j's
    i, j = torch.triu_indices(n, n, 1)
    w_head = ((head[i, j] + 0.0) + head[j, i]) / 2  # head_similarity: total = 0.0; total += v1; total += v2; / 2
    w_anchor = ((anchor[i, j] + anchor[j, i]) / 2).to(torch.float64)
    mixed = alpha * w_head + (1 - alpha) * w_anchor
    clipped = torch.where(mixed > 0.0, mixed, 0.0).to(weights.dtype)  # max(0.0, mixed), NaN included
    weights[i, j] = clipped
    weights[j, i] = clipped
    return weights


def _normalized(rows: Tensor) -> Tensor:
    """Rows divided by max(‖row‖₂, 1e-8), as inside ``F.cosine_similarity`` (same ops, same values)."""
    return rows / torch.linalg.vector_norm(rows, 2, dim=-1, keepdim=True).clamp_min(1e-8)


def _head_outputs(anchors: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """Every head on the same anchors: ``[N, r, C]``, row j the output of ``_apply((weight[j], bias[j]), anchors)``.
    One batched matmul where torch sends it to MKL's batched GEMM, whose per-matrix kernels are those of the single
    GEMMs (checked in tests/test_server_hotspots.py); single GEMMs where torch would take another path: one row or
    column (GEMV) or a product under 400 multiply-adds (torch's own loop)."""
    rows, features = anchors.shape
    count, classes = weight.shape[0], weight.shape[1]
    if rows >= 2 and classes >= 2 and rows * classes * features >= 400:
        products = torch.bmm(anchors.expand(count, rows, features), weight.transpose(1, 2))
        return products + bias[:, None, :]
    return torch.stack([_apply((weight[k], bias[k]), anchors) for k in range(count)])


def _head_means(heads: Sequence[Head], held: list[Tensor]) -> Tensor:
    """[i, j] = mean over the rows A of i's held anchors of cos(h_i(A), h_j(A)) (float32; the diagonal is unused)."""
    weight = torch.stack([w for w, _ in heads])
    bias = torch.stack([b for _, b in heads])
    means = []
    for i, anchors in enumerate(held):
        outputs = _normalized(_head_outputs(anchors, weight, bias))  # [N, r, C]
        means.append((outputs[i] * outputs).sum(dim=-1).mean(dim=-1))
    return torch.stack(means)


def _anchor_means(held: list[Tensor]) -> Tensor:
    """[i, j] = mean over i's held anchors of the best cosine with any of j's (float32): the first term of
    :func:`anchor_similarity`; its second term for (i, j) is this for (j, i)."""
    rows = torch.cat(held)
    normalized = _normalized(rows)
    sizes = [len(h) for h in held]
    starts = [0, *accumulate(sizes[:-1])]
    widest = max(sizes)
    # Each client's anchor rows, padded to the widest by repeating its last row (a repeat does not change a max).
    columns = torch.tensor([[start + min(r, size - 1) for r in range(widest)] for start, size in zip(starts, sizes,
                                                                                                    strict=True)],
                           device=rows.device)
    best = torch.empty(rows.shape[0], len(held), dtype=rows.dtype, device=rows.device)  # [a, j]: max cos(a, j's)
    chunk = max(1, (1 << 22) // max(1, rows.shape[0] * rows.shape[1]))
    for first in range(0, rows.shape[0], chunk):
        cos = (normalized[first : first + chunk, None, :] * normalized[None, :, :]).sum(dim=-1)  # [c, M]
        best[first : first + chunk] = cos[:, columns].amax(dim=-1)
    means = torch.empty(len(held), len(held), dtype=rows.dtype, device=rows.device)
    for size in sorted(set(sizes)):
        clients = [i for i, s in enumerate(sizes) if s == size]
        index = torch.tensor([starts[i] + r for i in clients for r in range(size)], device=rows.device)
        # [G, N, size] contiguous, so each mean runs over a contiguous row like the per-pair 1-D mean.
        picked = best.index_select(0, index).view(len(clients), size, -1).transpose(1, 2).contiguous()
        means[clients] = picked.mean(dim=-1)
    return means


def random_graph(n: int, generator: torch.Generator) -> Tensor:
    """A control for the learned graph: w_ij ~ U(0, 1) for i < j, drawn from `generator`; symmetric, zero diagonal.
    Communities found on it carry no information about the clients, so what the learned graph adds is the gap."""
    weights = torch.zeros(n, n)
    i, j = torch.triu_indices(n, n, 1)
    drawn = torch.rand(len(i), generator=generator)
    weights[i, j] = drawn
    weights[j, i] = drawn
    return weights


def communities(weights: Tensor, seed: int, resolution: float = 1.0) -> list[list[int]]:
    """Step 4: Louvain communities maximizing weighted modularity (networkx's implementation), seeded; each
    community sorted, communities ordered by their smallest member."""
    import networkx as nx  # here: every process that imports the methods would pay for it otherwise

    graph = nx.Graph()
    graph.add_nodes_from(range(len(weights)))
    rows = weights.tolist()  # the same float values as float(weights[i, j]), without a tensor index per pair
    graph.add_edges_from((i, j, {"weight": rows[i][j]}) for i in range(len(rows)) for j in range(i + 1, len(rows))
                         if rows[i][j] > 0)
    found = nx.community.louvain_communities(graph, weight="weight", resolution=resolution, seed=seed)
    return sorted((sorted(c) for c in found), key=lambda c: c[0])


def community_anchors(anchors: Sequence[Tensor], sizes: Sequence[int], community: Sequence[int]) -> Tensor:
    """Step 5: ā_C = Σ_{k∈C} (n_k / Σ_{l∈C} n_l) · a_k."""
    total = sum(sizes[k] for k in community)
    return sum((sizes[k] / total) * anchors[k] for k in community)

"""SFMTL-Graph's server math as pure tensor functions (spec: shared/specs/sfmtl_graph.md, "Server").

A client's head is a linear map h(z) = W z + b over features z ∈ R^k; its anchors are one feature vector per class
(C × k) of which it holds the rows in its label set."""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx
import torch
import torch.nn.functional as F
from torch import Tensor

Head = tuple[Tensor, Tensor]  # (W [C, k], b [C])


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
    heads: Sequence[Head], anchors: Sequence[Tensor], label_sets: Sequence[Sequence[int]], alpha: float = 0.49
) -> Tensor:
    """Step 3: w_ij = max(0, α·w_head(i,j) + (1 − α)·w_anchor(i,j)) over the held classes' anchors; symmetric,
    zero diagonal (a complete graph over the participants)."""
    held = [a[list(labels)] for a, labels in zip(anchors, label_sets, strict=True)]
    n = len(heads)
    weights = torch.zeros(n, n)
    for i in range(n):
        for j in range(i + 1, n):
            mixed = alpha * head_similarity(heads[i], heads[j], held[i], held[j])
            mixed += (1 - alpha) * anchor_similarity(held[i], held[j])
            weights[i, j] = weights[j, i] = max(0.0, mixed)
    return weights


def communities(weights: Tensor, seed: int, resolution: float = 1.0) -> list[list[int]]:
    """Step 4: Louvain communities maximizing weighted modularity (networkx's implementation), seeded; each
    community sorted, communities ordered by their smallest member."""
    graph = nx.Graph()
    graph.add_nodes_from(range(len(weights)))
    for i in range(len(weights)):
        for j in range(i + 1, len(weights)):
            if weights[i, j] > 0:
                graph.add_edge(i, j, weight=float(weights[i, j]))
    found = nx.community.louvain_communities(graph, weight="weight", resolution=resolution, seed=seed)
    return sorted((sorted(c) for c in found), key=lambda c: c[0])


def community_anchors(anchors: Sequence[Tensor], sizes: Sequence[int], community: Sequence[int]) -> Tensor:
    """Step 5: ā_C = Σ_{k∈C} (n_k / Σ_{l∈C} n_l) · a_k."""
    total = sum(sizes[k] for k in community)
    return sum((sizes[k] / total) * anchors[k] for k in community)

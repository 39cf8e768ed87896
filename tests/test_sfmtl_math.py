"""SFMTL-Graph's server math on hand-made heads and anchors."""

import math

import pytest
import torch

from manytask.methods.common.laplacian import laplacian_step
from manytask.methods.manytask.sfmtl_math import (
    anchor_similarity,
    communities,
    community_anchors,
    head_similarity,
    similarity_graph,
)

I2 = torch.eye(2)


def _head(weight, bias=(0.0, 0.0)):
    return torch.tensor(weight, dtype=torch.float32), torch.tensor(bias, dtype=torch.float32)


def test_head_similarity_is_functional_cosine_on_both_anchor_sets():
    anchors = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    same = head_similarity(_head([[1, 0], [0, 1]]), _head([[2, 0], [0, 2]]), anchors, anchors)
    assert same == pytest.approx(1.0)  # scaled heads give the same directions
    opposite = head_similarity(_head([[1, 0], [0, 1]]), _head([[-1, 0], [0, -1]]), anchors, anchors)
    assert opposite == pytest.approx(-1.0)
    # h_i = identity, h_j swaps the two logits: on [1,0] outputs [1,0] vs [0,1] -> cos 0; on [1,1] -> cos 1.
    swapped = head_similarity(_head([[1, 0], [0, 1]]), _head([[0, 1], [1, 0]]), torch.tensor([[1.0, 0.0]]),
                              torch.tensor([[1.0, 1.0]]))
    assert swapped == pytest.approx(0.5)


def test_anchor_similarity_best_match_symmetrized():
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    b = torch.tensor([[1.0, 1.0]])
    # i -> j: each of a's rows matches b with cos 1/sqrt2; j -> i: b's best match is 1/sqrt2.
    assert anchor_similarity(a, b) == pytest.approx(1 / math.sqrt(2))
    assert anchor_similarity(a, b) == pytest.approx(anchor_similarity(b, a))


def test_similarity_graph_mixes_clips_at_zero_and_is_symmetric():
    anchors = [torch.tensor([[1.0, 0.0], [0.0, 1.0]])] * 3
    heads = [_head([[1, 0], [0, 1]]), _head([[1, 0], [0, 1]]), _head([[-1, 0], [0, -1]])]
    weights = similarity_graph(heads, anchors, [[0, 1], [0, 1], [0, 1]], alpha=0.5)
    # 0-1: head 1, anchors 1 -> 1.0; 0-2: head -1, anchors 1 -> 0.5*(-1) + 0.5*1 = 0 (clipped at 0 either way)
    assert weights[0, 1] == pytest.approx(1.0) and weights[0, 2] == pytest.approx(0.0)
    assert torch.equal(weights, weights.T) and torch.all(weights.diagonal() == 0)
    clipped = similarity_graph(heads, anchors, [[0, 1]] * 3, alpha=0.9)  # 0.9*(-1) + 0.1*1 < 0
    assert clipped[0, 2] == 0 and clipped.min() >= 0


def test_head_step_on_three_clients_by_hand():
    heads = [_head([[1.0, 0.0]], [0.0]), _head([[0.0, 1.0]], [1.0]), _head([[3.0, 3.0]], [2.0])]
    weights = torch.tensor([[0.0, 0.5, 0.2], [0.5, 0.0, 0.0], [0.2, 0.0, 0.0]])
    named = [{"weight": w, "bias": b} for w, b in heads]
    new = laplacian_step(named, weights, [[0, 1], [2]], step=0.1, lam=2.0)  # SFMTL step 6 inside communities
    # client 0 in {0,1}: W0 - 0.1*2*0.5*(W0 - W1) = [1,0] - 0.1*([1,-1]) = [0.9, 0.1]; b0 = 0 - 0.1*(0-1) = 0.1
    assert torch.allclose(new[0]["weight"], torch.tensor([[0.9, 0.1]]))
    assert torch.allclose(new[0]["bias"], torch.tensor([0.1]))
    # client 1: [0,1] - 0.1*([-1, 1]) = [0.1, 0.9]; b1 = 1 - 0.1*(1-0) = 0.9
    assert torch.allclose(new[1]["weight"], torch.tensor([[0.1, 0.9]]))
    assert torch.allclose(new[1]["bias"], torch.tensor([0.9]))
    # client 2 is alone in its community: unchanged, although w_02 > 0 (communities bound the step)
    assert torch.equal(new[2]["weight"], heads[2][0]) and torch.equal(heads[0][0], torch.tensor([[1.0, 0.0]]))


def test_louvain_finds_two_cliques_reproducibly_and_community_anchors_weigh_by_size():
    weights = torch.zeros(6, 6)
    for group in ([0, 1, 2], [3, 4, 5]):
        for i in group:
            for j in group:
                if i != j:
                    weights[i, j] = 1.0
    weights[2, 3] = weights[3, 2] = 0.05
    assert communities(weights, seed=0) == [[0, 1, 2], [3, 4, 5]] == communities(weights, seed=0)
    anchors = [torch.full((2, 2), float(k)) for k in range(6)]
    merged = community_anchors(anchors, sizes=[10, 30, 60, 1, 1, 1], community=[0, 1, 2])
    assert torch.allclose(merged, torch.full((2, 2), (0 * 10 + 1 * 30 + 2 * 60) / 100))


def test_signed_features_open_the_heads_with_their_relu_and_anchors_compare_as_they_are():
    # Anchors [[1, -1], [-1, 1]] of both clients; heads h0 = identity and h1 = swap. On relu(anchors) = I the heads
    # disagree on both rows: cos 0 each, so w_head = 0. The anchors themselves match: w_anchor = 1.
    anchors = [torch.tensor([[1.0, -1.0], [-1.0, 1.0]])] * 2
    heads = [_head([[1, 0], [0, 1]]), _head([[0, 1], [1, 0]])]
    opened = similarity_graph(heads, anchors, [[0, 1], [0, 1]], alpha=0.5, head_input=torch.relu)
    assert opened[0, 1] == pytest.approx(0.5 * 0.0 + 0.5 * 1.0)
    raw = similarity_graph(heads, anchors, [[0, 1], [0, 1]], alpha=0.5)  # on the raw anchors the swap is -1
    assert raw[0, 1] == pytest.approx(0.0)  # 0.5 * (-1) + 0.5 * 1
    relu = torch.relu(anchors[0])
    assert head_similarity(*heads, relu, relu) == pytest.approx(0.0)

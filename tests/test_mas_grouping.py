"""MAS's task grouping: self-affinity and the split score on hand-computed examples, the exact searches (MAS, HOA,
TAG's cover) against brute force over every partition or combination, and the refusals."""

import itertools

import pytest
import torch

from manytask.methods.mas.grouping import (
    best_cover,
    best_grouping,
    best_hoa_partition,
    best_partition,
    cover_is_exact,
    group_values,
    partition_score,
    partitions_into,
    self_affinity,
    set_partitions,
)

# S[i, j] = S_{i→j}; the diagonal (9) is ignored.
S3 = torch.tensor([[9.0, 1.0, 2.0], [3.0, 9.0, 4.0], [5.0, 6.0, 9.0]])


def _random(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _canonical(partition: list[list[int]]) -> bool:
    return partition == sorted(sorted(group) for group in partition)


def _is_partition(partition: list[list[int]], n: int) -> bool:
    return all(partition) and sorted(t for group in partition for t in group) == list(range(n))


def test_self_affinity_by_hand():
    # S_{0→0} = (1 + 3 + 2 + 5) / 4, S_{1→1} = (3 + 1 + 4 + 6) / 4, S_{2→2} = (5 + 2 + 6 + 4) / 4
    assert torch.equal(self_affinity(S3), torch.tensor([2.75, 3.5, 4.25]))
    assert self_affinity(S3).dtype == torch.float32
    assert torch.equal(self_affinity(torch.tensor([[7.0]])), torch.tensor([0.0]))


def test_partition_score_by_hand():
    # {0, 1}: Ŝ_0 = S_{1→0} = 3, Ŝ_1 = S_{0→1} = 1; {2}: Ŝ_2 = S_{2→2} = 4.25
    assert partition_score(S3, [[0, 1], [2]]) == 8.25
    # {0, 1, 2}: Ŝ_0 = (3 + 5) / 2, Ŝ_1 = (1 + 6) / 2, Ŝ_2 = (2 + 4) / 2
    assert partition_score(S3, [[2, 0, 1]]) == 10.5
    assert partition_score(S3, [[1], [0], [2]]) == 2.75 + 3.5 + 4.25


def test_group_values_match_their_definition():
    M = _random(5, seed=3)
    values = group_values(M)
    for mask in range(1, 32):
        group = [i for i in range(5) if mask >> i & 1]
        if len(group) == 1:
            expected = float(M[group[0], group[0]])
        else:
            expected = sum(float(M[j, i]) for i in group for j in group if j != i) / (len(group) - 1)
        assert values[mask] == pytest.approx(expected, abs=1e-12)
    assert values[0] == 0


def _check_against_brute_force(n, search, objective, best):
    """`search(groups, exact)` returns a valid partition whose objective is the `best` over every partition of
    range(n) with exactly (exact) or at most `groups` groups, for every group count."""
    valued = [(objective(p), p) for p in set_partitions(n)]
    for groups in range(1, n + 1):
        for exact in (True, False):
            found = search(groups, exact)
            allowed = [value for value, p in valued if (len(p) == groups if exact else len(p) <= groups)]
            assert _is_partition(found, n) and _canonical(found)
            assert len(found) == groups if exact else len(found) <= groups
            assert objective(found) == pytest.approx(best(allowed), abs=1e-9)


@pytest.mark.parametrize("n", range(1, 8))
def test_best_partition_matches_brute_force(n):
    S = _random(n, seed=n)
    _check_against_brute_force(n, lambda groups, exact: best_partition(S, groups, exact=exact),
                               lambda p: partition_score(S, p), max)


def _hoa_loss(L: torch.Tensor, partition: list[list[int]]) -> float:
    """Σ_i mean_{j∈G∖{i}} L[i, j] (L[i, i] alone)."""
    total = 0.0
    for group in partition:
        for i in group:
            others = [j for j in group if j != i] or [i]
            total += sum(float(L[i, j]) for j in others) / len(others)
    return total


@pytest.mark.parametrize("n", range(1, 7))
def test_best_hoa_partition_matches_brute_force(n):
    L = _random(n, seed=10 + n).abs()
    _check_against_brute_force(n, lambda groups, exact: best_hoa_partition(L, groups, exact=exact),
                               lambda p: _hoa_loss(L, p), min)


def test_at_most_breaks_ties_towards_fewer_groups():
    assert best_partition(torch.zeros(4, 4), 3, exact=False) == [[0, 1, 2, 3]]
    assert best_grouping(torch.zeros(4, 4), 3) != best_grouping(torch.zeros(4, 4), 3, exact=False)


def _task_value(S: torch.Tensor, group: list[int], i: int, lone: str = "tag") -> float:
    """Ŝ_i(G): mean_{j∈G, j≠i} S_{j→i}; alone, TAG's 1e-6 (or MAS eq. 4's self-affinity with `lone="mas"`)."""
    if len(group) == 1:
        return 1e-6 if lone == "tag" else float(self_affinity(S)[i])
    return sum(float(S[j, i]) for j in group if j != i) / (len(group) - 1)


def _cover_score(S: torch.Tensor, groups: list[list[int]], lone: str = "tag") -> float:
    n = len(S)
    return sum(max(_task_value(S, g, i, lone) for g in groups if i in g) for i in range(n))


@pytest.mark.parametrize("n", range(1, 5))
def test_best_cover_matches_brute_force(n):
    S = _random(n, seed=20 + n)
    subsets = [[i for i in range(n) if mask >> i & 1] for mask in range(1, 1 << n)]
    for groups in range(1, 4):
        assert cover_is_exact(n, groups)
        best = max(
            _cover_score(S, list(combo))
            for size in range(1, groups + 1)
            for combo in itertools.combinations(subsets, size)
            if {t for g in combo for t in g} == set(range(n))
        )
        chosen, serving = best_cover(S, groups)
        assert 1 <= len(chosen) <= groups and all(chosen) and len({tuple(g) for g in chosen}) == len(chosen)
        assert {t for g in chosen for t in g} == set(range(n))
        assert _cover_score(S, chosen) == pytest.approx(best, abs=1e-9)
        for i, g in enumerate(serving):
            assert i in chosen[g]
            assert _task_value(S, chosen[g], i) == max(_task_value(S, c, i) for c in chosen if i in c)


def test_tag_scores_a_lone_task_as_1e_minus_6_not_by_mas_eq_4():
    """Task 2 helps the others (0.9) but gains little from them (0.3): MAS's eq. 4 gives it a self-affinity of 0.6,
    so its own group would beat every shared one (cover {0,1}, {2}: 1 + 1 + 0.6); TAG scores it alone 1e-6, so it
    joins a group with others (1 + 1 + 0.3)."""
    S = torch.tensor([[0.0, 1.0, 0.3], [1.0, 0.0, 0.3], [0.9, 0.9, 0.0]])
    assert float(self_affinity(S)[2]) == pytest.approx(0.6)
    assert _cover_score(S, [[0, 1], [2]], lone="mas") == pytest.approx(2.6)
    chosen, _ = best_cover(S, 2)
    assert all(len(group) > 1 for group in chosen), chosen
    assert _cover_score(S, chosen) == pytest.approx(2.3)
    assert best_cover(torch.zeros(1, 1), 1) == ([[0]], [0])  # one task: alone, as nothing else can serve it


def test_greedy_cover_covers_and_beats_one_group():
    S = _random(12, seed=5)
    assert not cover_is_exact(12, 3)
    chosen, serving = best_cover(S, 3)
    assert 1 <= len(chosen) <= 3 and {t for g in chosen for t in g} == set(range(12))
    assert all(i in chosen[g] for i, g in enumerate(serving))
    assert _cover_score(S, chosen) >= _cover_score(S, [list(range(12))])


def test_partition_counts_are_bell_and_stirling_numbers():
    assert [len(list(set_partitions(n))) for n in range(7)] == [1, 1, 2, 5, 15, 52, 203]
    assert len(partitions_into(9, 3)) == 3025
    fours = partitions_into(6, 4)
    assert len(fours) == 65 and len({str(p) for p in fours}) == 65
    assert all(len(p) == 4 and _is_partition(p, 6) and _canonical(p) for p in fours)


@pytest.mark.parametrize("search", [best_partition, best_grouping, best_hoa_partition])
def test_group_counts_that_cannot_be_met_are_refused(search):
    with pytest.raises(ValueError, match="exactly 4"):
        search(S3, 4)
    with pytest.raises(ValueError, match="at least 1"):
        search(S3, 0, exact=False)
    assert len(search(S3, 4, exact=False)) <= 3


def test_bad_matrices_and_partitions_are_refused():
    with pytest.raises(ValueError, match="square"):
        best_partition(torch.zeros(2, 3), 1)
    with pytest.raises(ValueError, match="square"):
        self_affinity(torch.zeros(3))
    with pytest.raises(ValueError, match="at most 20"):
        best_partition(torch.zeros(21, 21), 2)
    with pytest.raises(ValueError, match="at least 1"):
        best_cover(S3, 0)
    for bad in ([[0, 1]], [[0, 1], [1, 2]], [[0, 1, 2, 3]], [[0, 1, 2], []]):
        with pytest.raises(ValueError, match="partition"):
            partition_score(S3, bad)

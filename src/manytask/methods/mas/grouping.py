"""Task grouping for MAS's split and its baselines (shared/specs/mas.md), as pure functions.

Conventions: a matrix is an [n, n] tensor (any float dtype, computed in float64); `S[i, j]` is the affinity of task i
onto task j, S_{i→j} (MAS eq. 3). A subset of tasks is a bitmask, bit i standing for task i, so tables over all
subsets have 2^n entries; that caps the subset functions at `MAX_TASKS` tasks.

- `self_affinity`: MAS eq. 4, which replaces S_{i→i} when splitting.
- `group_values` / `best_grouping`: the generic exact search. M[j, i] is what task j brings task i in a group, M[i, i]
  task i's value alone; the best partition comes from a dynamic program over subsets, O(3^n · groups) at worst.
- `partition_score` / `best_partition`: MAS's split score Σ_i Ŝ_αi (MAS §3, "Score of a partition" in the spec) and
  its maximizer, into exactly x groups or at most x.
- `best_hoa_partition`: Standley et al. 2020's higher-order approximation from single and pairwise losses.
- `best_cover`: TAG's network selection (Fifty et al. 2021): overlapping groups, each task served by its best one.
- `set_partitions` / `partitions_into`: brute-force enumeration, for tests and for "every split into x groups".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

MAX_TASKS = 20
COVER_EXACT_LIMIT = 2_000_000
_BLOCK = 1 << 20  # elements per vectorized block: bounds the DP's and the cover search's temporaries


def _square(M: Tensor) -> np.ndarray:
    """M as a float64 array, checked to be a finite, non-empty square matrix."""
    if M.ndim != 2 or M.shape[0] != M.shape[1]:
        raise ValueError(f"expected a square [n, n] matrix; got shape {tuple(M.shape)}")
    if M.shape[0] < 1:
        raise ValueError("expected at least one task; got a 0 × 0 matrix")
    array = M.detach().to("cpu", torch.float64).numpy()
    if not np.isfinite(array).all():
        raise ValueError("the matrix has non-finite entries")
    return array


def _check_size(n: int) -> None:
    """Refuse more tasks than tables over all 2^n subsets can hold in memory."""
    if n > MAX_TASKS:
        raise ValueError(f"tables over all subsets of {n} tasks would need 2^{n} entries each; "
                         f"at most {MAX_TASKS} tasks are supported")


def _subset_matrix(M: Tensor) -> np.ndarray:
    """`_square(M)`, refusing more tasks than the 2^n subset tables can hold."""
    array = _square(M)
    _check_size(len(array))
    return array


def _popcounts(n: int) -> np.ndarray:
    """The number of tasks in every subset of n tasks, indexed by bitmask."""
    counts = np.zeros(1, dtype=np.int64)
    for _ in range(n):
        counts = np.concatenate([counts, counts + 1])
    return counts


def _members(mask: int) -> list[int]:
    """The tasks in a bitmask, ascending."""
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def _self_affinity(A: np.ndarray) -> np.ndarray:
    """MAS eq. 4: S_{i→i} = Σ_{j≠i} (S_{i→j} + S_{j→i}) / (2n − 2); 0 for a single task."""
    n = len(A)
    if n == 1:
        return np.zeros(1)
    off = A - np.diag(np.diag(A))
    return (off.sum(axis=1) + off.sum(axis=0)) / (2 * n - 2)


def self_affinity(S: Tensor) -> Tensor:
    """MAS eq. 4, the self-affinity of every task: S_{i→i} = Σ_{j≠i} (S_{i→j} + S_{j→i}) / (2n − 2), [n].

    The diagonal of S is ignored; a single task gets 0. Returned in S's dtype (the default dtype for integer S)."""
    dtype = S.dtype if S.is_floating_point() else torch.get_default_dtype()
    return torch.from_numpy(_self_affinity(_square(S))).to(dtype=dtype, device=S.device)


def _with_self_affinity(A: np.ndarray) -> np.ndarray:
    """A with its diagonal replaced by MAS eq. 4."""
    out = A.copy()
    np.fill_diagonal(out, _self_affinity(A))
    return out


def _values(M: np.ndarray) -> np.ndarray:
    """`group_values` on a checked array: value[G] = Σ_{i≠j ∈ G} M[j, i] / (|G| − 1), M[i, i] for G = {i}."""
    n = len(M)
    off = M - np.diag(np.diag(M))
    pair = off + off.T
    within = np.zeros(1)  # within[G] = Σ over unordered pairs {j, k} ⊆ G of M[j, k] + M[k, j]
    for k in range(n):
        row = np.zeros(1)  # row[G] = Σ_{j ∈ G} pair[k, j] for G ⊆ {0..k−1}
        for j in range(k):
            row = np.concatenate([row, row + pair[k, j]])
        within = np.concatenate([within, within + row])
    values = within / np.maximum(_popcounts(n) - 1, 1)
    values[1 << np.arange(n)] = np.diag(M)
    return values


def group_values(M: Tensor) -> np.ndarray:
    """The value of every subset G of tasks, [2^n] float64 indexed by bitmask (bit i = task i; value[0] = 0).

    Task i's value in G is mean_{j∈G, j≠i} M[j, i] if |G| > 1, else M[i, i]; G's value is the sum over its tasks,
    which for |G| > 1 is the sum of M's off-diagonal entries within G divided by |G| − 1. Built in O(2^n)."""
    return _values(_subset_matrix(M))


def _check_groups(n: int, groups: int, exact: bool) -> None:
    """Refuse a group count no partition of n tasks can have."""
    if groups < 1:
        raise ValueError(f"the number of groups must be at least 1; got {groups}")
    if exact and groups > n:
        raise ValueError(f"{n} tasks cannot be split into exactly {groups} non-empty groups")


def _submasks(masks: np.ndarray, size: int, patterns: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """For masks of `size` tasks: the submasks that hold the mask's lowest task plus, of its other size − 1 tasks,
    those picked by each bit pattern in `patterns`, [m, len(patterns)]; and what each leaves of its mask."""
    bits = (masks[:, None] >> np.arange(n)) & 1
    positions = np.nonzero(bits)[1].reshape(len(masks), size)
    picked = np.zeros((len(masks), 1), dtype=np.int64)
    for j in range(1, size):
        picked = np.concatenate([picked, picked | (1 << positions[:, j : j + 1])], axis=1)
    if len(patterns) < picked.shape[1]:
        picked = picked[:, patterns]
    lowest = 1 << positions[:, :1]
    return picked | lowest, (masks[:, None] ^ lowest) ^ picked


def _relax(masks: np.ndarray, size: int, ks: range, patterns: np.ndarray, values: np.ndarray, best: np.ndarray,
           choice: np.ndarray) -> None:
    """f_k[mask] = max over submasks s ∋ lowest(mask) of value[s] + f_{k−1}[mask ^ s] for every k in `ks`,
    vectorized over masks and submasks; the first maximizing s (in `patterns` order) is kept in `choice`."""
    parts, rests = _submasks(masks, size, patterns, best.shape[1].bit_length() - 1)
    gains = values[parts]
    rows = np.arange(len(masks))
    for k in ks:
        candidates = np.take(best[k - 1], rests, mode="clip")  # indices are in range; "clip" skips the check
        candidates += gains
        arg = candidates.argmax(axis=1)
        best[k, masks] = candidates[rows, arg]
        choice[k, masks] = parts[rows, arg]


def _subset_dp(values: np.ndarray, n: int, groups: int, exact: bool) -> tuple[np.ndarray, np.ndarray]:
    """The tables best[k, mask] (best value of `mask` split into exactly k groups) and choice[k, mask] (the group
    holding mask's lowest task in that split), for k ≤ min(groups, n), by increasing subset size.

    When `exact`, only the k that can still end in exactly `groups` groups overall are filled: a subset of p tasks,
    whose n − p others hold at most n − p groups, needs k ≥ groups − (n − p). Split into k or more groups, a subset's
    lowest task's group has at most p − k + 1 tasks, so only submasks that small are enumerated."""
    top = min(groups, n)
    best = np.full((top + 1, 1 << n), -np.inf)
    best[0, 0] = 0.0
    choice = np.zeros((top + 1, 1 << n), dtype=np.int32)
    sizes = _popcounts(n)
    for size in range(1, n + 1):
        ks = range(max(1, groups - n + size) if exact else 1, min(size, top) + 1)
        if not ks:
            continue
        patterns = np.flatnonzero(sizes[: 1 << (size - 1)] <= size - ks.start)
        masks = np.flatnonzero(sizes == size)
        per_block = max(1, _BLOCK // len(patterns))
        for start in range(0, len(masks), per_block):
            _relax(masks[start : start + per_block], size, ks, patterns, values, best, choice)
    return best, choice


def _best_grouping(M: np.ndarray, groups: int, exact: bool) -> list[list[int]]:
    """`best_grouping` on a checked array."""
    n = len(M)
    _check_size(n)
    _check_groups(n, groups, exact)
    best, choice = _subset_dp(_values(M), n, groups, exact)
    mask = (1 << n) - 1
    k = groups if exact else 1 + int(np.argmax(best[1:, mask]))  # ties: the fewest groups
    partition = []
    while mask:
        part = int(choice[k, mask])
        partition.append(_members(part))
        mask, k = mask ^ part, k - 1
    return sorted(partition)


def best_grouping(M: Tensor, groups: int, exact: bool = True) -> list[list[int]]:
    """The partition of range(n) into exactly `groups` non-empty disjoint groups (at most `groups` when not `exact`)
    maximizing Σ_G value(G), with value as in `group_values`; exact, by dynamic programming over subsets:

        f_k[mask] = max over s ⊆ mask with lowest(mask) ∈ s of value[s] + f_{k−1}[mask ^ s],  f_0[∅] = 0,

    vectorized over all masks of one size and their submasks, one k at a time (gathering from one row of the table
    per k measured 2.5–3× faster than gathering a [mask, submask, k] block). Ties go to the first submask in a fixed
    enumeration order (and, when not `exact`, to the fewest groups). Groups come sorted, each ascending, ordered by
    first task. Time O(3^n · groups) at worst, memory O(2^n · groups)."""
    return _best_grouping(_square(M), groups, exact)


def _check_partition(partition: Sequence[Sequence[int]], n: int) -> None:
    """Refuse anything but a partition of range(n) into non-empty groups."""
    tasks = sorted(task for group in partition for task in group)
    if tasks != list(range(n)) or not all(partition):
        raise ValueError(f"expected a partition of range({n}) into non-empty groups, every task exactly once; "
                         f"got {partition}")


def partition_score(S: Tensor, partition: Sequence[Sequence[int]]) -> float:
    """MAS's split score Σ_i Ŝ_αi (MAS §3): Ŝ_i = mean_{j∈G, j≠i} S_{j→i} for i's group G if |G| > 1, else the
    self-affinity S_{i→i} of MAS eq. 4."""
    A = _square(S)
    _check_partition(partition, len(A))
    alone = _self_affinity(A)
    score = 0.0
    for group in partition:
        members = list(group)
        if len(members) == 1:
            score += alone[members[0]]
        else:
            block = A[np.ix_(members, members)]
            score += (block.sum() - np.trace(block)) / (len(members) - 1)
    return float(score)


def best_partition(S: Tensor, groups: int, exact: bool = True) -> list[list[int]]:
    """MAS's split (Algorithm 1, line 14): the partition into exactly `groups` groups (at most, when not `exact`)
    maximizing `partition_score`, i.e. `best_grouping` of S with its diagonal replaced by MAS eq. 4. Exact."""
    return _best_grouping(_with_self_affinity(_square(S)), groups, exact)


def best_hoa_partition(L: Tensor, groups: int, exact: bool = True) -> list[list[int]]:
    """HOA's grouping (Standley et al. 2020, higher-order approximation): with L[i, i] the loss of task i trained
    alone and L[i, j] its loss trained in the pair {i, j}, task i's estimated loss in G is mean_{j∈G∖{i}} L[i, j]
    (L[i, i] alone); the partition minimizing the summed estimate, i.e. `best_grouping` of M = −Lᵀ. Exact."""
    return _best_grouping(-_square(L).T, groups, exact)


def cover_is_exact(n: int, groups: int) -> bool:
    """Whether `best_cover` searches exhaustively: C(2^n − 1, groups) combinations of candidate groups at most
    `COVER_EXACT_LIMIT` (otherwise it runs its greedy search)."""
    candidates = (1 << n) - 1
    return math.comb(candidates, min(groups, candidates)) <= COVER_EXACT_LIMIT


LONE_TASK = 1e-6  # TAG's affinity of a task trained alone: a lone task is chosen only where nothing else serves it


def _task_values(S: np.ndarray) -> np.ndarray:
    """V[G, i] = Ŝ_i(G) for every subset G (bitmask) and task i ∈ G, −inf for i ∉ G: mean_{j∈G, j≠i} S_{j→i} if
    |G| > 1, else `LONE_TASK` (TAG's score of a task alone)."""
    n = len(S)
    off = S - np.diag(np.diag(S))
    onto = np.zeros((1, n))  # onto[G, i] = Σ_{j∈G, j≠i} S[j, i]
    for k in range(n):
        onto = np.concatenate([onto, onto + off[k]])
    V = onto / np.maximum(_popcounts(n) - 1, 1)[:, None]
    V[1 << np.arange(n), np.arange(n)] = LONE_TASK
    inside = (np.arange(1 << n)[:, None] >> np.arange(n)) & 1
    V[inside == 0] = -np.inf
    return V


def _exhaustive_cover(V: np.ndarray, count: int) -> list[int]:
    """The `count` candidate groups (bitmasks) maximizing Σ_i max_{G ∋ i} V[G, i], over all combinations; those that
    leave a task uncovered score −inf and are skipped. The first best combination in lexicographic order wins."""
    combos = itertools.combinations(range(1, len(V)), count)
    per_block = max(1, _BLOCK // (count * V.shape[1]))
    best_score, best_combo = -np.inf, None
    while block := list(itertools.islice(combos, per_block)):
        chosen = np.array(block)
        scores = V[chosen].max(axis=1).sum(axis=1)
        top = int(np.argmax(scores))
        if scores[top] > best_score:
            best_score, best_combo = scores[top], block[top]
    return list(best_combo)


def _serving(V: np.ndarray, chosen: list[int]) -> np.ndarray:
    """For each task, the index in `chosen` of the first group giving it its largest value."""
    return V[chosen].argmax(axis=0)


def _greedy_cover(V: np.ndarray, groups: int) -> list[int]:
    """`best_cover`'s greedy search over V (`_task_values`); every step strictly raises the score, so it ends."""
    chosen = [len(V) - 1]
    current = V[-1]
    while len(chosen) < groups:
        gains = np.maximum(V - current, 0.0).sum(axis=1)
        pick = int(np.argmax(gains))
        if gains[pick] <= 0:
            break
        chosen.append(pick)
        current = np.maximum(current, V[pick])
        chosen = [chosen[i] for i in sorted(set(_serving(V, chosen).tolist()))]
    return chosen


def best_cover(S: Tensor, groups: int) -> tuple[list[list[int]], list[int]]:
    """TAG's network selection (Fifty et al. 2021): up to `groups` possibly overlapping non-empty groups covering all
    tasks, maximizing Σ_i max_{G ∋ i} Ŝ_i(G) with Ŝ_i(G) = mean_{j∈G, j≠i} S_{j→i}, and a task alone scored
    `LONE_TASK` as TAG scores it ("resulting in no group contains only a single task"), not by MAS's eq. 4.

    Exhaustive over all combinations of `groups` candidate subsets when `cover_is_exact(n, groups)` (at most
    `COVER_EXACT_LIMIT` combinations; adding a group never lowers the score, so exactly `groups` suffice).
    Otherwise greedy, not guaranteed optimal: start from the all-tasks group (the only single group covering every
    task), then repeatedly add the group with the largest gain Σ_i max(0, Ŝ_i(G) − current_i), dropping groups that
    no longer serve any task, until `groups` are chosen or nothing gains. Groups serving no task are left out.
    Returns (the groups, sorted, each ascending; for each task the index of the group serving it, the first argmax)."""
    A = _subset_matrix(S)
    _check_groups(len(A), groups, exact=False)
    V = _task_values(A)
    if cover_is_exact(len(A), groups):
        chosen = _exhaustive_cover(V, min(groups, len(V) - 1))
    else:
        chosen = _greedy_cover(V, groups)
    used = sorted({chosen[i] for i in _serving(V, chosen).tolist()}, key=_members)
    return [_members(mask) for mask in used], _serving(V, used).tolist()


def _partitions(n: int, least: int, most: int, blocks: list[list[int]], task: int) -> Iterator[list[list[int]]]:
    """Partitions of range(n) extending `blocks` (a partition of range(task)) with least..most blocks, each new task
    going into every existing block in turn, then into a new block (restricted-growth order)."""
    if len(blocks) + (n - task) < least:
        return
    if task == n:
        yield [list(block) for block in blocks]
        return
    for block in blocks:
        block.append(task)
        yield from _partitions(n, least, most, blocks, task + 1)
        block.pop()
    if len(blocks) < most:
        blocks.append([task])
        yield from _partitions(n, least, most, blocks, task + 1)
        blocks.pop()


def set_partitions(n: int) -> Iterator[list[list[int]]]:
    """Every partition of range(n) (Bell(n) of them), each group ascending, groups ordered by first task."""
    return _partitions(n, 0, n, [], 0)


def partitions_into(n: int, groups: int) -> list[list[list[int]]]:
    """Every partition of range(n) into exactly `groups` non-empty groups (Stirling number S(n, groups) of them), in
    restricted-growth order: task t's group index sequence, read left to right, is lexicographically increasing."""
    return list(_partitions(n, groups, groups, [], 0))

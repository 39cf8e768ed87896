"""Time MAS's exact split search (`best_partition`) on random affinities (seed 0).

    .venv/bin/python scripts/bench_partition.py

Prints the wall time of every group count for n = 9, then, for n = 10, 11, ..., the time of the slowest group count,
stopping at the first n that takes more than 5 s."""

from __future__ import annotations

import time

import torch

from manytask.methods.mas.grouping import MAX_TASKS, best_partition

LIMIT_S = 5.0


def seconds(n: int, groups: int) -> float:
    """Wall time of one `best_partition` call on a random n × n affinity matrix."""
    S = torch.randn(n, n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    start = time.perf_counter()
    best_partition(S, groups)
    return time.perf_counter() - start


def main() -> None:
    for groups in range(1, 10):
        print(f"n = 9, groups = {groups}: {seconds(9, groups) * 1e3:.1f} ms")
    within = 9
    for n in range(10, MAX_TASKS + 1):
        times = {groups: seconds(n, groups) for groups in range(1, n + 1)}
        slowest = max(times, key=times.__getitem__)
        print(f"n = {n}: slowest groups = {slowest}, {times[slowest]:.3f} s")
        if times[slowest] > LIMIT_S:
            break
        within = n
    print(f"exact within {LIMIT_S:g} s up to n = {within}")


if __name__ == "__main__":
    main()

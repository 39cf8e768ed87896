"""MAS and the methods it is compared with (shared/specs/mas.md): task grouping as pure functions (`grouping`),
lookahead affinities (`lookahead`), and the staged programs that train models one after another (`stages`:
`mas`, `one-by-one`, `tag`, `hoa`)."""

from manytask.methods.mas.grouping import (
    best_cover,
    best_grouping,
    best_hoa_partition,
    best_partition,
    partition_score,
    self_affinity,
)

__all__ = ["best_cover", "best_grouping", "best_hoa_partition", "best_partition", "partition_score", "self_affinity"]

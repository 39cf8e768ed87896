"""Byzantine-robust aggregation on the server, four plug-ins over any host: they rewrite or drop the host's
`Update`s in `adjust`, so the host's own rule (FedAvg's average, FedNova's normalization, FedACG's momentum, …)
still runs on top of them.

- `clip`: norm clipping, Δ_n ← Δ_n · min(1, C / ‖Δ_n‖) with ‖·‖ over all the update's parameter keys. C is
  `max_norm` when > 0; with `max_norm: 0` it is adaptive, the median of this round's update norms.
- `median`: coordinate-wise median (Yin et al., ICML 2018, "Byzantine-Robust Distributed Learning: Towards Optimal
  Statistical Rates"); for an even number of values, the mean of the two middle ones (`torch.median` would return
  the lower one).
- `trimmed-mean`: coordinate-wise β-trimmed mean (Yin et al., 2018): the ⌊β·m⌋ largest and ⌊β·m⌋ smallest of the
  m values at each coordinate are dropped, the rest averaged.
- `krum`: Krum / Multi-Krum (Blanchard et al., NeurIPS 2017, "Machine Learning with Adversaries: Byzantine Tolerant
  Gradient Descent"): score_i = Σ of the squared distances from Δ_i to its m − f − 2 nearest other deltas; the
  `select` updates of lowest score are kept, the others dropped.

Choices. Updates hold different keys (heads of different tasks; `per_task` copies count as updates of their own):
median and trimmed mean run per key over the updates that hold it, and Krum's distances over the keys both updates
hold (pcgrad's `common_keys`). Median and trimmed mean replace every holder's delta by the robust value, so the
host's weighted average of identical values is reference + that value: sample counts no longer steer it, which is
the point. Krum keeps the host's weights for the selected updates, where the paper averages Multi-Krum's selection
uniformly, so that Krum composes with any host (sample counts are already capped by screening at each client's
registered holding); Multi-Krum's scores are computed once, as in the paper, not again after each pick. Where
m − f − 2 < 1, one neighbour is used; ties keep the lower index. A key held by no kept update keeps its global value
this round. Only parameter deltas change (`Update.deltas()` leaves buffers and integers out): buffers keep the
host's averaging (over the kept updates, for Krum). The math runs in float64; `Update.with_deltas` casts back.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import Generic

import torch
from pydantic import Field
from torch import Tensor

from manytask.methods.common.updates import Update
from manytask.methods.common.updates import delta_norm as norm
from manytask.methods.plugins.base import P, PluginClient, PluginServer
from manytask.methods.plugins.pcgrad import common_keys
from manytask.methods.registry import PluginDef, register_plugin
from manytask.registry import Params

Deltas = dict[str, Tensor]


class ClipParams(Params):
    max_norm: float = Field(
        default=0.0, ge=0, description="clipping bound C on each update's norm; 0: the median of the round's norms")


class TrimmedMeanParams(Params):
    trim: float = Field(default=0.1, ge=0, lt=0.5, description="fraction β trimmed at each end of every coordinate")


class KrumParams(Params):
    byzantine: int = Field(default=1, ge=0, description="number f of Byzantine updates tolerated")
    select: int = Field(default=1, ge=1, description="updates kept: 1 is Krum, more is Multi-Krum")


# --- the math, on lists of deltas ----------------------------------------------------------------------------


def sorted_mean(values: Tensor, drop: int) -> Tensor:
    """Along dim 0 of the m stacked values: sort, drop the `drop` smallest and `drop` largest, mean of the rest."""
    ordered = values.double().sort(dim=0).values
    return ordered[drop : len(ordered) - drop].mean(dim=0)


def median(values: Tensor) -> Tensor:
    """Median along dim 0: the middle value for odd m, the mean of the two middle ones for even m (a trimmed mean
    that drops ⌊(m − 1)/2⌋ values at each end)."""
    return sorted_mean(values, (len(values) - 1) // 2)


def per_key(deltas: list[Deltas], reduce: Callable[[Tensor], Tensor]) -> Deltas:
    """{k: reduce(stack of Δ_n,k over the updates n that hold k)}, keys in order of first appearance."""
    keys = list(dict.fromkeys(k for d in deltas for k in d))
    return {k: reduce(torch.stack([d[k].double() for d in deltas if k in d])) for k in keys}


def coordinate_median(deltas: list[Deltas]) -> Deltas:
    """Coordinate-wise median (Yin et al., 2018, Definition 1) per key over its holders; even counts take the mean
    of the two middle values."""
    return per_key(deltas, median)


def trim_count(trim: float, count: int) -> int:
    """⌊β·m⌋, robust to β·m landing just below an integer in floating point (0.29·100 = 28.999…)."""
    return math.floor(trim * count + 1e-9)


def coordinate_trimmed_mean(deltas: list[Deltas], trim: float) -> Deltas:
    """Coordinate-wise β-trimmed mean (Yin et al., 2018, Definition 2) per key over its m holders: drop the ⌊β·m⌋
    largest and ⌊β·m⌋ smallest values, mean of the remaining m − 2⌊β·m⌋ (at least one, as β < 1/2)."""
    if not 0 <= trim < 0.5:
        raise ValueError(f"trim must lie in [0, 0.5), got {trim}")
    return per_key(deltas, lambda values: sorted_mean(values, trim_count(trim, len(values))))


def replaced(deltas: list[Deltas], robust: Deltas) -> list[Deltas]:
    """Every update's delta of every key it holds replaced by the robust value of that key."""
    return [{k: robust[k] for k in d} for d in deltas]


def clip_bound(norms: list[float], max_norm: float) -> float:
    """C: `max_norm` when > 0, else the median of the norms (adaptive)."""
    return max_norm if max_norm > 0 else float(median(torch.tensor(norms, dtype=torch.float64)))


def clip(deltas: list[Deltas], bound: float) -> list[Deltas]:
    """Norm clipping: Δ_n ← Δ_n · min(1, C / ‖Δ_n‖). Deltas within the bound are returned as they are (the same
    objects), so the caller can leave their updates untouched."""
    sizes = [norm(d) for d in deltas]
    return [d if size <= bound else {k: v.double() * (bound / size) for k, v in d.items()}
            for d, size in zip(deltas, sizes, strict=True)]


def squared_distance(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> float:
    """‖a − b‖² over the keys both hold, in float64."""
    return sum(float((a[k].double() - b[k].double()).square().sum()) for k in common_keys(a, b))


def krum_scores(deltas: list[Deltas], byzantine: int) -> Tensor:
    """Krum's score_i = Σ_{j ∈ N_i} ‖Δ_i − Δ_j‖² (Blanchard et al., 2017, Section 4), N_i the m − f − 2 nearest other
    deltas (one where m − f − 2 < 1; none for a single update, whose score is 0)."""
    m = len(deltas)
    distances = torch.zeros(m, m, dtype=torch.float64)
    for i in range(m):
        for j in range(i):
            distances[i, j] = distances[j, i] = squared_distance(deltas[i], deltas[j])
    neighbours = min(max(m - byzantine - 2, 1), m - 1)
    others = [torch.cat([distances[i, :i], distances[i, i + 1 :]]) for i in range(m)]
    return torch.stack([row.sort().values[:neighbours].sum() for row in others]) if m else distances.new_zeros(0)


def krum_select(deltas: list[Deltas], byzantine: int, select: int) -> list[int]:
    """The indices of the `select` lowest Krum scores (Multi-Krum; `select` = 1 is Krum), ties to the lower index,
    in increasing index order."""
    scores = krum_scores(deltas, byzantine).tolist()
    ranked = sorted(range(len(deltas)), key=lambda i: (scores[i], i))
    return sorted(ranked[:select])


# --- the servers -------------------------------------------------------------------------------------------


class ClipServer(PluginServer[ClipParams]):
    """Scales every update whose delta is longer than C down to norm C before the host's rule."""

    device_ready = True

    def adjust(self, round_index: int, updates: list[Update]) -> list[Update]:
        if not updates:
            return updates
        deltas = [u.deltas() for u in updates]
        bound = clip_bound([norm(d) for d in deltas], self.params.max_norm)
        clipped = clip(deltas, bound)
        self.log["robust/clipped"] = float(sum(c is not d for c, d in zip(clipped, deltas, strict=True)))
        # an update within the bound stays as it was: reference + delta could round differently from trained
        return [u if c is d else u.with_deltas(c) for u, c, d in zip(updates, clipped, deltas, strict=True)]


class CoordinateServer(PluginServer[P], Generic[P]):
    """Gives every update a coordinate-wise robust aggregate of the deltas, so the host's average of identical
    values is reference + that aggregate."""

    device_ready = True

    @abstractmethod
    def robust(self, deltas: list[Deltas]) -> Deltas:
        """The robust aggregate of the deltas, per key."""

    def adjust(self, round_index: int, updates: list[Update]) -> list[Update]:
        deltas = [u.deltas() for u in updates]
        new = replaced(deltas, self.robust(deltas))
        return [u.with_deltas(d) for u, d in zip(updates, new, strict=True)]


class MedianServer(CoordinateServer[Params]):
    """The coordinate-wise median."""

    def robust(self, deltas: list[Deltas]) -> Deltas:
        return coordinate_median(deltas)


class TrimmedMeanServer(CoordinateServer[TrimmedMeanParams]):
    """The coordinate-wise trimmed mean."""

    def robust(self, deltas: list[Deltas]) -> Deltas:
        return coordinate_trimmed_mean(deltas, self.params.trim)


class KrumServer(PluginServer[KrumParams]):
    """Keeps the updates of lowest Krum score, with the host's weights; the others are dropped."""

    device_ready = True

    def adjust(self, round_index: int, updates: list[Update]) -> list[Update]:
        kept = krum_select([u.deltas() for u in updates], self.params.byzantine, self.params.select)
        self.log["robust/kept"] = float(len(kept))
        return [updates[i] for i in kept]


ROBUST_PLUGINS: list[tuple[str, type[PluginServer], type[Params], str]] = [
    ("clip", ClipServer, ClipParams,
     "Norm clipping on the server: each update's delta scaled to norm at most C (fixed, or the round's median)"),
    ("median", MedianServer, Params,
     "Coordinate-wise median of the updates' deltas, per parameter over the updates that hold it"),
    ("trimmed-mean", TrimmedMeanServer, TrimmedMeanParams,
     "Coordinate-wise trimmed mean of the updates' deltas: the β largest and smallest values of each entry dropped"),
    ("krum", KrumServer, KrumParams,
     "Krum / Multi-Krum: keeps the updates closest to their m − f − 2 nearest others, with the host's weights"),
]
for name, server, params, description in ROBUST_PLUGINS:
    register_plugin(name, PluginDef(PluginClient, server), params, description)

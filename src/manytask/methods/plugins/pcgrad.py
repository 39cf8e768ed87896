"""PCGrad (Yu et al., NeurIPS 2020, "Gradient Surgery for Multi-Task Learning", Algorithm 1) applied on the server
to the clients' updates, a plug-in over any host (FedDEA's comparison).

Each update g_i meets every other update Δ_j in a random order; where they conflict (g_i·Δ_j < 0) the component of
g_i along Δ_j is removed: g_i ← g_i − (g_i·Δ_j / ‖Δ_j‖²) Δ_j, always against the ORIGINAL Δ_j, as in the paper.
Updates hold different parameters (heads of different tasks), so dot products and norms run over the keys both
updates hold, and only those keys are projected. The host then aggregates reference + projected g_i.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from manytask.methods.common.updates import Update
from manytask.methods.plugins.base import PluginClient, PluginServer
from manytask.methods.registry import PluginDef, register_plugin
from manytask.registry import Params
from manytask.seeding import numpy_rng


def dot_over(a: Mapping[str, Tensor], b: Mapping[str, Tensor], keys: list[str]) -> Tensor:
    """Σ_k a_k·b_k over `keys`, in float64."""
    return sum((torch.sum(a[k].double() * b[k].double()) for k in keys), torch.zeros((), dtype=torch.float64))


def common_keys(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> list[str]:
    """The keys of `a` that `b` also holds (parameters both updates trained), in `a`'s order."""
    return [k for k in a if k in b]


def project_conflicts(deltas: list[dict[str, Tensor]], orders: list[list[int]]) -> list[dict[str, Tensor]]:
    """PCGrad (Yu et al., 2020, Algorithm 1): for each i, for j in `orders[i]`, if g_i·Δ_j < 0 then
    g_i ← g_i − (g_i·Δ_j / ‖Δ_j‖²) Δ_j, with dot and norm over the keys both hold; Δ_j are the original deltas."""
    projected = []
    for i, order in enumerate(orders):
        g = dict(deltas[i])
        for j in order:
            other = deltas[j]
            keys = common_keys(g, other)
            dot = dot_over(g, other, keys)
            if dot < 0:
                scale = dot / dot_over(other, other, keys)
                g.update({k: g[k] - scale * other[k] for k in keys})
        projected.append(g)
    return projected


def conflicting_pairs(deltas: list[dict[str, Tensor]]) -> int:
    """How many unordered pairs of the original deltas conflict (negative dot product over their common keys)."""
    return sum(bool(dot_over(a, b, common_keys(a, b)) < 0) for i, a in enumerate(deltas) for b in deltas[:i])


class PcgradServer(PluginServer[Params]):
    """Projects every update against the others' conflicting directions before the host's rule."""

    device_ready = True

    def adjust(self, round_index: int, updates: list[Update]) -> list[Update]:
        deltas = [u.deltas() for u in updates]
        orders = [self.order(round_index, i, len(updates)) for i in range(len(updates))]
        self.log["pcgrad/conflicts"] = float(conflicting_pairs(deltas))
        return [u.with_deltas(g) for u, g in zip(updates, project_conflicts(deltas, orders), strict=True)]

    def order(self, round_index: int, i: int, count: int) -> list[int]:
        """The other updates in a random order seeded by (run seed, round, i)."""
        others = [j for j in range(count) if j != i]
        return [others[p] for p in numpy_rng(self.setup.seed, "pcgrad", round_index, i).permutation(len(others))]


register_plugin(
    "pcgrad", PluginDef(PluginClient, PcgradServer), Params,
    "PCGrad on the server: each client update loses its components along the updates it conflicts with",
)

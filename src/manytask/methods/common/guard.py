"""The divergence guard: a reply whose update is far larger than the round's others is refused before it is
aggregated. One client's ×1e3 update, or a client whose training blew up to a finite 1e24, otherwise moves the
global model by orders of magnitude more than every honest client together.

The rule: with norms u_n = max over the reply's trained copies of ‖θ_trained − θ_sent‖₂ (parameters only)
and m = median_n u_n (the mean of the two middle values for an even count), reply n is refused where
u_n > factor · m. It needs at least `MIN_REPLIES` replies, so that the median is one of the honest majority's."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping

import torch
from torch import Tensor

from manytask.methods.common.aggregation import stacked_chunks
from manytask.methods.common.updates import copy_groups, is_parameter, reference_key

MIN_REPLIES = 3


def update_norms(sent: Mapping[int, Mapping[str, Tensor]], replies: Mapping[int, Mapping[str, Tensor]]
                 ) -> dict[int, float]:
    """Per client, u_n = max over the trained copies of its reply (reply keys -> tensors) of ‖trained − sent‖₂ over
    their parameters. Every reply of every host round passes here, so the arrays whose references share memory are
    stacked and measured with one op per parameter, not one per reply (in the arrays' own dtype: a guard that compares
    against 100× the median needs no more precision)."""
    groups: dict[tuple, tuple[Tensor, list[Tensor], list[tuple[int, str | None]]]] = {}
    places: dict[int, tuple] = {}  # by the reference's id: clients of one task set share their references' objects
    for client, trained in replies.items():
        references = sent[client]
        for copy, keys in copy_groups(trained).items():
            for key in keys:
                reference = references.get(reference_key(key))
                if reference is not None and is_parameter(key, trained[key]):
                    place = places.get(id(reference))
                    if place is None:
                        place = places[id(reference)] = _memory(reference)
                    group = groups.setdefault(place, (reference, [], []))
                    group[1].append(trained[key])
                    group[2].append((client, copy))
    squares: dict[tuple[int, str | None], float] = {}
    for reference, arrays, owners in groups.values():
        for owner, square in zip(owners, _squared_distances(reference, arrays).tolist(), strict=True):
            squares[owner] = squares.get(owner, 0.0) + square
    norms = dict.fromkeys(replies, 0.0)
    for (client, _), square in squares.items():
        norms[client] = max(norms[client], math.sqrt(square))
    return norms


def _squared_distances(reference: Tensor, arrays: list[Tensor]) -> Tensor:
    """‖array − reference‖₂² of each array, in float64: stacked in chunks that stay in the cache
    (`stacked_chunks`), the reference subtracted in place, each chunk's norms squared and summed."""
    target = reference.reshape(-1)
    squares = torch.zeros(len(arrays), dtype=torch.float64)
    for columns, rows, block in stacked_chunks([a.reshape(-1) for a in arrays]):
        block.sub_(target[columns])
        squares[rows] += torch.linalg.vector_norm(block, dim=1).double().square()
    return squares


def _memory(tensor: Tensor) -> tuple:
    """Where a tensor's values lie: tensors that view the same memory the same way hold the same values (each
    task set's payload views the global state through arrays of its own)."""
    return tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride()


def far_beyond_median(norms: Mapping[int, float], factor: float) -> dict[int, str]:
    """The clients whose update norm exceeds `factor` × the median of `norms`, with the reason of each."""
    if factor <= 0 or len(norms) < MIN_REPLIES:
        return {}
    median = statistics.median(norms.values())
    return {c: f"update norm {u:.3g} is {u / median:.3g}× the round's median {median:.3g} (divergence guard: at "
               f"most {factor:g}×)" for c, u in norms.items() if u > factor * median}

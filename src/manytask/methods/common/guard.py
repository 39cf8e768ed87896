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

import numpy as np
import torch
from torch import Tensor

from manytask.methods.common import aggregation
from manytask.methods.common.updates import copy_groups, is_parameter, reference_key, squared_norm

MIN_REPLIES = 3


def update_norms(sent: Mapping[int, Mapping[str, Tensor]], replies: Mapping[int, Mapping[str, Tensor]]
                 ) -> dict[int, float]:
    """Per client, u_n = max over the trained copies of its reply (reply keys -> tensors) of ‖trained − sent‖₂ over
    their parameters: in numpy on the host (`squared_distance`), on the device where the replies lie there
    (`_device_norms`)."""
    pairs = {client: _compared(sent[client], trained) for client, trained in replies.items()}
    devices = {trained[k].device for client, trained in replies.items() for copy in pairs[client] for k, _ in copy}
    if devices - {torch.device("cpu")}:
        return _device_norms(replies, pairs, (devices - {torch.device("cpu")}).pop())
    norms = dict.fromkeys(replies, 0.0)
    for client, trained in replies.items():
        for copy in pairs[client]:
            square = sum(squared_distance(trained[k], reference) for k, reference in copy)
            norms[client] = max(norms[client], math.sqrt(square))
    return norms


Compared = list[list[tuple[str, Tensor]]]  # per trained copy, its parameters' (reply key, reference sent) pairs


def _compared(references: Mapping[str, Tensor], trained: Mapping[str, Tensor]) -> Compared:
    return [[(k, reference) for k in keys if (reference := references.get(reference_key(k))) is not None
             and is_parameter(k, trained[k])] for keys in copy_groups(trained).values()]


def _device_norms(replies: Mapping[int, Mapping[str, Tensor]], pairs: Mapping[int, Compared],
                  device: torch.device) -> dict[int, float]:
    """`update_norms` on `device` (a reply decoded on the host is brought there): each squared distance summed in
    float64 (a 5e24 update measures 5e24), the largest copy's read once for the whole round, its root taken on
    the host."""
    zero = torch.zeros((), dtype=torch.float64, device=device)
    squares = [torch.stack([torch.stack([squared_norm(trained[k].to(device) - reference.to(device))
                                         for k, reference in copy]).sum() for copy in pairs[client] if copy]).max()
               if any(pairs[client]) else zero for client, trained in replies.items()]
    return {c: math.sqrt(v) for c, v in zip(replies, torch.stack(squares).tolist(), strict=True)} if squares else {}


def squared_distance(array: Tensor, reference: Tensor) -> float:
    """‖array − reference‖₂², in float32 (a guard that compares against 100× the median needs no more precision;
    float64 arrays stay float64): numpy's difference and dot over column chunks of `SUM_COLUMNS` entries that stay
    in the cache, summed in float64. Every reply of every host round passes here, and a numpy call costs about a
    microsecond: a third less time than the stacked torch norms this replaced on the SFMTL CNN's 20-client round."""
    flat, target = _numpy_flat(array), _numpy_flat(reference)
    buffer = np.empty(min(flat.size, aggregation.SUM_COLUMNS), flat.dtype)
    total = 0.0
    for start in range(0, flat.size, aggregation.SUM_COLUMNS):
        columns = slice(start, start + aggregation.SUM_COLUMNS)
        difference = buffer[:min(flat.size - start, aggregation.SUM_COLUMNS)]
        np.subtract(flat[columns], target[columns], out=difference)
        with np.errstate(over="ignore"):
            square = float(np.dot(difference, difference))
        if math.isinf(square):  # past float32's range (a blown-up client): the chunk again in float64
            wide = difference.astype(np.float64)
            square = float(np.dot(wide, wide))
        total += square
    return total


def _numpy_flat(tensor: Tensor) -> np.ndarray:
    """A tensor's values as a flat numpy array on the CPU, in float32 unless they are float64."""
    tensor = tensor.detach().reshape(-1).cpu()
    return (tensor if tensor.dtype in (torch.float32, torch.float64) else tensor.float()).numpy()


def far_beyond_median(norms: Mapping[int, float], factor: float) -> dict[int, str]:
    """The clients whose update norm exceeds `factor` × the median of `norms`, with the reason of each."""
    if factor <= 0 or len(norms) < MIN_REPLIES:
        return {}
    median = statistics.median(norms.values())
    return {c: f"update norm {u:.3g} is {u / median:.3g}× the round's median {median:.3g} (divergence guard: at "
               f"most {factor:g}×)" for c, u in norms.items() if u > factor * median}

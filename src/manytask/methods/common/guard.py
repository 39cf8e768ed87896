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

from manytask.methods.common.updates import copy_groups, is_parameter, reference_key

MIN_REPLIES = 3


def update_norm(sent: Mapping[str, Tensor], trained: Mapping[str, Tensor]) -> float:
    """max over the trained copies in `trained` (reply keys) of ‖trained − sent‖₂ over their parameters. Every
    reply of every host round passes here, so it takes one op per array (in the arrays' own dtype: a guard that
    compares against 100× the median needs no more precision)."""
    norms = [0.0]
    for keys in copy_groups(trained).values():
        distances = [float(torch.dist(trained[k], sent[r])) for k in keys
                     if (r := reference_key(k)) in sent and is_parameter(k, trained[k])]
        norms.append(math.hypot(*distances))
    return max(norms)


def far_beyond_median(norms: Mapping[int, float], factor: float) -> dict[int, str]:
    """The clients whose update norm exceeds `factor` × the median of `norms`, with the reason of each."""
    if factor <= 0 or len(norms) < MIN_REPLIES:
        return {}
    median = statistics.median(norms.values())
    return {c: f"update norm {u:.3g} is {u / median:.3g}× the round's median {median:.3g} (divergence guard: at "
               f"most {factor:g}×)" for c, u in norms.items() if u > factor * median}

"""FL + TaLoS's disjoint-partition variant (shared/specs/talos_fl.md, variant A), as pure tensor functions:

1. votes: every client sends its mask once; entry j's score is the number of clients that call it least sensitive,
   and the server keeps the top (1 − ρ*) fraction by score (ties to the lower index);
2. partition: the kept entries, in a seeded pseudo-random order, split into one subset per client, mutually
   exclusive and together exhaustive (sizes differ by at most one);
3. upload: a client sends only the values of its update on its own subset, in the subset's order;
4. assembly: θ ← θ + ∪_k δ_k, every value placed where it came from (no averaging: the subsets do not overlap).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from manytask.methods.talos.mask import Masks, flatten, unflatten


def vote_kept(masks: Sequence[Mapping[str, Tensor]], sparsity: float) -> Masks:
    """The (1 − ρ*) fraction of entries most clients call least sensitive (True = kept), over all parameters."""
    if not masks:
        raise ValueError("voting needs at least one client mask")
    votes = torch.stack([flatten(m).to(torch.int64) for m in masks]).sum(dim=0)
    kept = torch.zeros(votes.numel(), dtype=torch.bool)
    kept[torch.sort(votes, descending=True, stable=True).indices[: round((1 - sparsity) * votes.numel())]] = True
    return unflatten(kept, masks[0])


def partition(kept: Mapping[str, Tensor], parts: int, seed: int) -> list[Masks]:
    """`parts` disjoint masks whose union is `kept`: its entries in a seeded random order, dealt in near-equal
    contiguous runs."""
    if parts < 1:
        raise ValueError(f"a partition needs at least one part; got {parts}")
    flat = flatten(kept)
    indices = flat.nonzero().squeeze(1)
    order = indices[torch.randperm(len(indices), generator=torch.Generator().manual_seed(seed))]
    owned = []
    for chunk in order.tensor_split(parts):
        mask = torch.zeros_like(flat, dtype=torch.bool)
        mask[chunk] = True
        owned.append(unflatten(mask, kept))
    return owned


def subset_values(values: Mapping[str, Tensor], owned: Mapping[str, Tensor]) -> Tensor:
    """The values on a client's subset, in the subset's (parameter, then row-major) order: of its update, its upload.
    Taken on the host in numpy, where messages lie (no op on the device, no host sync per parameter)."""
    return torch.from_numpy(np.concatenate([_host(values[name])[_host(mask)] for name, mask in owned.items()]))


def subset_size(owned: Mapping[str, Tensor]) -> int:
    """How many entries a client's subset holds."""
    return int(sum(_host(mask).sum() for mask in owned.values()))


def assemble(
    params: Mapping[str, Tensor], uploads: Mapping[int, Tensor], owned: Sequence[Mapping[str, Tensor]]
) -> dict[str, Tensor]:
    """θ + ∪_k δ_k: each client's uploaded values added at the entries of its subset; entries of clients that did
    not upload stay as they were (on the host, in numpy)."""
    out = {name: _host(value).copy() for name, value in params.items()}
    for client, values in uploads.items():
        masks = {name: _host(mask) for name, mask in owned[client].items()}
        pieces = np.split(_host(values), np.cumsum([mask.sum() for mask in masks.values()])[:-1])
        for (name, mask), piece in zip(masks.items(), pieces, strict=True):
            out[name][mask] += piece
    return {name: torch.from_numpy(value) for name, value in out.items()}


def _host(tensor: Tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy()

"""The partition variant's math: votes keep the most-voted entries, parts are disjoint and exhaustive, and
assembly places every uploaded value exactly where it came from."""

import pytest
import torch

from manytask.methods.talos.partition import assemble, partition, subset_values, vote_kept


def _masks(*rows):
    flat = [torch.tensor(r, dtype=torch.bool) for r in rows]
    return [{"a": f[:12].view(3, 4), "b": f[12:]} for f in flat]


def test_votes_keep_the_entries_most_clients_call_least_sensitive():
    ones, zeros = [1] * 17, [0] * 17
    first = [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0]
    masks = _masks(first, first, [1] * 3 + [0] * 14, ones, zeros)
    kept = vote_kept(masks, sparsity=1 - 3 / 17)  # keep 3 of 17 entries
    # votes: entries 0-2 get 4, entries 12-13 get 3, the rest 1 or 0 → entries 0, 1, 2
    assert kept["a"].flatten().nonzero().flatten().tolist() == [0, 1, 2] and not kept["b"].any()


@pytest.mark.parametrize("parts", [1, 3, 7])
def test_parts_are_disjoint_exhaustive_and_balanced(parts):
    kept = {"a": torch.rand(3, 4, generator=torch.Generator().manual_seed(0)) > 0.3,
            "b": torch.ones(5, dtype=torch.bool)}
    owned = partition(kept, parts, seed=4)
    total = sum(torch.cat([m.flatten().long() for m in part.values()]) for part in owned)
    assert torch.equal(total.bool(), torch.cat([kept["a"].flatten(), kept["b"]]))  # exhaustive ...
    assert int(total.max()) == 1  # ... and disjoint
    sizes = [int(sum(m.sum() for m in part.values())) for part in owned]
    assert max(sizes) - min(sizes) <= 1
    assert all(torch.equal(x[k], y[k]) for x, y in zip(owned, partition(kept, parts, 4), strict=True) for k in x)


def test_assembly_places_every_uploaded_value_exactly():
    kept = {"a": torch.ones(3, 4, dtype=torch.bool), "b": torch.ones(5, dtype=torch.bool)}
    owned = partition(kept, 3, seed=1)
    params = {"a": torch.zeros(3, 4), "b": torch.zeros(5)}
    deltas = [{"a": torch.full((3, 4), 10.0 * (k + 1)) + torch.arange(12.0).view(3, 4),
               "b": torch.full((5,), 10.0 * (k + 1)) + torch.arange(5.0)} for k in range(3)]
    uploads = {k: subset_values(deltas[k], owned[k]) for k in (0, 2)}  # client 1 did not upload
    assert len(uploads[0]) == sum(int(m.sum()) for m in owned[0].values())
    out = assemble(params, uploads, owned)
    for name in params:
        for k in range(3):
            expected = deltas[k][name][owned[k][name]] if k != 1 else torch.zeros(int(owned[k][name].sum()))
            assert torch.equal(out[name][owned[k][name]], expected), (name, k)
    assert torch.equal(params["a"], torch.zeros(3, 4))  # the input is left as it was

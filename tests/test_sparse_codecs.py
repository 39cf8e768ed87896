"""The sparse codecs of the update convention: bitmap and index forms, the cheaper chosen, round trips through the
wire, empty and full arrays, and densify against what was sent."""

import pytest
import torch

from manytask.messages import Message, decode, encode
from manytask.methods.common.updates import decode_sparse, densify, encode_sparse, sparse_names


def wire_round_trip(arrays: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return decode(encode(Message.from_tensors(arrays))).tensors()


def test_bitmap_form_holds_the_mask_and_the_kept_values_row_major():
    dense = torch.tensor([[0.0, 2.0, 0.0, 0.0], [-1.0, 0.0, 0.0, 3.0]])
    arrays = encode_sparse("w", dense)
    assert set(arrays) == {"sparse/w/mask", "sparse/w/values"}
    assert torch.equal(arrays["sparse/w/mask"], dense != 0)
    assert torch.equal(arrays["sparse/w/values"], torch.tensor([2.0, -1.0, 3.0]))
    assert torch.equal(decode_sparse(wire_round_trip(arrays), "w", dense.shape), dense)


def test_index_form_holds_int32_flat_positions():
    dense = torch.zeros(10, 100)
    dense[0, 7], dense[9, 99] = 1.5, -2.0
    arrays = encode_sparse("w", dense)
    assert set(arrays) == {"sparse/w/index", "sparse/w/values"}
    assert arrays["sparse/w/index"].dtype == torch.int32
    assert arrays["sparse/w/index"].tolist() == [7, 999]
    assert torch.equal(decode_sparse(wire_round_trip(arrays), "w", dense.shape), dense)


@pytest.mark.parametrize("kept, form", [(1, "index"), (2, "mask")])
def test_the_cheaper_form_on_the_wire_is_chosen(kept, form):
    # 64 entries: a packed mask costs 8 bytes, indices 4 per kept entry; a tie goes to the mask.
    dense = torch.zeros(64)
    dense[:kept] = 1.0
    arrays = encode_sparse("w", dense)
    assert f"sparse/w/{form}" in arrays
    forms = {"mask": {"m": dense != 0, "v": dense[:kept]},
             "index": {"m": torch.arange(kept, dtype=torch.int32), "v": dense[:kept]}}
    sizes = {name: len(encode(Message.from_tensors(arrays))) for name, arrays in forms.items()}
    assert sizes[form] == min(sizes.values())


def test_an_all_zero_array_travels_as_nothing_and_decodes_to_zeros():
    arrays = encode_sparse("w", torch.zeros(3, 5))
    assert arrays["sparse/w/values"].numel() == 0 and arrays["sparse/w/index"].numel() == 0
    assert torch.equal(decode_sparse(wire_round_trip(arrays), "w", torch.Size([3, 5])), torch.zeros(3, 5))


def test_a_full_array_round_trips_exactly_through_a_full_mask():
    dense = torch.arange(1.0, 13.0).reshape(3, 4)
    arrays = encode_sparse("w", dense)
    assert bool(arrays["sparse/w/mask"].all())
    assert torch.equal(decode_sparse(wire_round_trip(arrays), "w", dense.shape), dense)


def test_densify_adds_sparse_deltas_to_what_was_sent_and_keeps_dense_arrays():
    sent = {"backbone.w": torch.tensor([1.0, 1.0, 1.0]), "heads.a.w": torch.tensor([[0.5, 0.5]])}
    arrays = {
        **encode_sparse("copy/a/backbone.w", torch.tensor([0.0, 2.0, 0.0])),
        **encode_sparse("heads.a.w", torch.tensor([[0.0, -0.5]])),
        "buffer/bn.running_mean": torch.tensor([4.0]),
    }
    assert sparse_names(arrays) == ["copy/a/backbone.w", "heads.a.w"]
    out = densify(wire_round_trip(arrays), sent)
    assert set(out) == {"copy/a/backbone.w", "heads.a.w", "buffer/bn.running_mean"}
    assert torch.equal(out["copy/a/backbone.w"], torch.tensor([1.0, 3.0, 1.0]))
    assert torch.equal(out["heads.a.w"], torch.tensor([[0.5, 0.0]]))
    assert torch.equal(out["buffer/bn.running_mean"], torch.tensor([4.0]))


def test_malformed_sparse_arrays_are_rejected():
    with pytest.raises(ValueError, match=r"mask of torch.bool \(4,\), expected bool \(2, 3\)"):
        decode_sparse({"sparse/w/mask": torch.ones(4, dtype=torch.bool), "sparse/w/values": torch.ones(4)},
                      "w", torch.Size([2, 3]))
    with pytest.raises(ValueError, match=r"mask of torch.float32 \(2, 3\), expected bool"):
        decode_sparse({"sparse/w/mask": torch.ones(2, 3), "sparse/w/values": torch.ones(6)}, "w", torch.Size([2, 3]))
    with pytest.raises(ValueError, match=r"index of torch\.float32"):
        decode_sparse({"sparse/w/index": torch.ones(1), "sparse/w/values": torch.ones(1)}, "w", torch.Size([2, 3]))
    with pytest.raises(ValueError, match="values of shape"):
        decode_sparse({"sparse/w/index": torch.tensor([1], dtype=torch.int32), "sparse/w/values": torch.ones(1, 1)},
                      "w", torch.Size([2, 3]))
    with pytest.raises(ValueError, match="out of range"):
        decode_sparse({"sparse/w/index": torch.tensor([6], dtype=torch.int32), "sparse/w/values": torch.ones(1)},
                      "w", torch.Size([2, 3]))

import math

import numpy as np
import pytest
import torch

from manytask.messages import Message, MessageError, _dtype_name, decode, encode, encoded_size, snapshot


def test_round_trip_preserves_arrays_dtypes_and_scalars():
    msg = Message(
        {
            "w": torch.randn(3, 4),
            "idx": np.arange(5, dtype=np.int64),
            "mask": np.array([True, False, True, True, False, False, False, True, True]),
            "half": np.ones(2, dtype=np.float16),
        },
        {"n/digit": 12, "lr": 0.05, "tag": "x", "flag": True},
    )
    back = decode(encode(msg))
    assert set(back.arrays) == set(msg.arrays)
    for name, array in msg.arrays.items():
        assert back.arrays[name].dtype == array.dtype
        assert back.arrays[name].shape == array.shape
        np.testing.assert_array_equal(back.arrays[name], array)
    assert back.scalars == msg.scalars


def test_byte_count_is_header_plus_raw_payload_and_masks_travel_as_bits():
    d = 1000
    floats = Message({"v": np.zeros(d, dtype=np.float32)})
    masks = Message({"v": np.zeros(d, dtype=bool)})
    data_f, data_m = encode(floats), encode(masks)
    header_f = int.from_bytes(data_f[4:8], "little")
    header_m = int.from_bytes(data_m[4:8], "little")
    assert len(data_f) == 8 + header_f + 4 * d
    assert len(data_m) == 8 + header_m + math.ceil(d / 8)  # 125 bytes for 1000 mask entries


def test_bool_mask_with_odd_length_round_trips():
    mask = np.random.default_rng(0).random(13) > 0.5
    np.testing.assert_array_equal(decode(encode(Message({"m": mask}))).arrays["m"], mask)


def test_decode_rejects_foreign_and_truncated_bytes():
    with pytest.raises(ValueError, match="magic"):
        decode(b"\x80\x04pickle")
    data = encode(Message({"v": np.ones(10, dtype=np.float32)}))
    with pytest.raises(ValueError, match="truncated"):
        decode(data[:-3])
    with pytest.raises(ValueError, match="trailing"):
        decode(data + b"\x00")


def test_tensors_with_prefix():
    msg = Message.from_tensors({"a": torch.ones(2), "b": torch.zeros(1)}, prefix="head/")
    assert set(msg.tensors("head/")) == {"a", "b"}
    assert torch.equal(msg.tensor("head/a"), torch.ones(2))


def test_tensor_views_follow_the_arrays_they_view():
    message = Message.from_tensors({"a": torch.zeros(2), "b": torch.ones(3)})
    first = message.tensors()
    assert message.tensors()["a"] is first["a"]  # made once while the arrays stay the same objects
    message.arrays["a"] = np.full(2, 5.0, dtype=np.float32)  # replaced in place
    assert message.tensors()["a"].tolist() == [5.0, 5.0] and message.tensors()["b"].tolist() == [1.0] * 3
    message.arrays["c"] = np.zeros(1, dtype=np.float32)  # one more
    assert list(message.tensors()) == ["a", "b", "c"]
    message.arrays = {"b": message.arrays["b"], "a": message.arrays["a"]}  # the same objects, another order
    assert list(message.tensors()) == ["b", "a"]


def test_unsupported_dtype_is_refused():
    with pytest.raises(TypeError):
        Message({"c": np.array([1 + 2j])})


def test_wire_format_is_byte_for_byte_stable():
    # what every earlier version sent for this message: a change here breaks communication accounting and peers
    msg = Message({"w": torch.tensor([[1.5, -2.0]]), "i": np.array([3], dtype=np.int16),
                   "m": np.array([True, False, True]), "s": np.float64(0.25)}, {"n/digit": 12, "tag": "é", "lr": 0.05})
    header = (b'{"arrays":[{"name":"w","dtype":"float32","shape":[1,2],"nbytes":8},'
              b'{"name":"i","dtype":"int16","shape":[1],"nbytes":2},{"name":"m","dtype":"bool","shape":[3],"nbytes":1},'
              b'{"name":"s","dtype":"float64","shape":[1],"nbytes":8}],"scalars":{"n/digit":12,"tag":"\\u00e9","lr":0.05}}')
    payload = b"\x00\x00\xc0?\x00\x00\x00\xc0" + b"\x03\x00" + b"\xa0" + b"\x00\x00\x00\x00\x00\x00\xd0?"
    assert encode(msg) == b"MTK1" + len(header).to_bytes(4, "little") + header + payload
    assert encode(decode(encode(msg))) == encode(msg)


def test_dtype_lookup_names_every_dtype_as_numpy_does():
    # the dict that replaces `dtype.name` must agree with it everywhere, byte-swapped dtypes included
    for code in np.typecodes["All"]:
        for order in "<>=|":
            dtype = np.dtype(order + code)
            assert _dtype_name(dtype) == dtype.name


def test_decode_refuses_unknown_dtypes_and_truncation():
    data = encode(Message({"v": np.ones(2, dtype=np.float32)}))
    forged = data.replace(b'"float32"', b'"complex"')  # as long as the original: the header length still holds
    with pytest.raises(MessageError, match="array 'v' has an unknown dtype"):
        decode(forged)
    with pytest.raises(MessageError, match="array 'v' is truncated"):
        decode(data[:-1])


def test_tensors_in_autograd_or_strided_are_sent_as_their_values():
    param = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3))
    msg = Message.from_tensors({"p": param, "t": param.detach().t(), "s": torch.tensor(2.0)})
    back = decode(encode(msg)).tensors()
    assert torch.equal(back["p"], param.detach()) and torch.equal(back["t"], param.detach().t())
    assert back["s"].shape == (1,)  # a 0-d tensor travels as one entry, as it always has


def test_headers_parsed_in_two_parts_equal_the_whole_parse():
    from manytask.messages import _checked_header, _split_header

    tricky = ['a],"scalars":{', "b\\", 'c"}', "]", "scalars"]
    for names in (["w"], tricky, [f"heads.t{i}.weight" for i in range(5)]):
        for scalars in ({}, {"loss/t": 0.5, "n/t": 12}, {'x],"scalars":{': "y", "}": True}):
            raw = encode(Message({n: np.zeros(2, dtype=np.float32) for n in names}, scalars))
            header = raw[8 : 8 + int.from_bytes(raw[4:8], "little")]
            assert _split_header(header) == _checked_header(header)
            back = decode(raw)
            assert list(back.arrays) == names and back.scalars == scalars
    for other in (b'{"scalars":{},"arrays":[]}', b'{"arrays":[] ,"scalars":{}}', b'{"arrays":[],"scalars":{}} ',
                  b'{"arrays":[],"scalars":{},"arrays":[]}'):
        assert _split_header(other) is None or _split_header(other) == _checked_header(other)
    for parse in (_split_header, _checked_header):  # a bad entry is refused in the same words either way
        with pytest.raises(MessageError, match="array entry"):
            parse(b'{"arrays":[1],"scalars":{}}')


def test_encoded_headers_are_the_json_of_the_whole_header():
    import json

    for scalars in ({}, {"loss/t": 0.25, "n/t": 3, "é": "x", "flag": False}):
        for arrays in ({}, {"w": np.zeros((2, 3), np.float32), "m": np.ones(9, bool), 'a"]': np.arange(2)}):
            raw = encode(Message(arrays, scalars))
            header = raw[8 : 8 + int.from_bytes(raw[4:8], "little")]
            entries = [{"name": n, "dtype": a.dtype.name, "shape": list(a.shape),
                        "nbytes": (a.size + 7) // 8 if a.dtype == bool else a.nbytes} for n, a in arrays.items()]
            assert header == json.dumps({"arrays": entries, "scalars": scalars}, separators=(",", ":")).encode()


def test_decoding_bytes_views_them_and_a_mutable_buffer_is_copied():
    message = Message.from_tensors({"w": torch.arange(6.0).view(2, 3), "mask": torch.tensor([True, False, True])})
    data = encode(message)
    viewed = decode(data)
    w = viewed.arrays["w"]
    assert np.shares_memory(w, np.frombuffer(data, np.uint8)) and not w.flags.writeable  # no copy of a model
    assert torch.equal(viewed.tensors()["w"], torch.arange(6.0).view(2, 3))
    buffer = bytearray(data)
    copied = decode(buffer)
    buffer[:] = bytes(len(buffer))  # the sender reuses its buffer
    assert torch.equal(copied.tensors()["w"], torch.arange(6.0).view(2, 3))  # the message did not change with it
    assert copied.arrays["w"].flags.writeable and torch.equal(copied.tensors()["mask"], torch.tensor([1, 0, 1]) > 0)


def test_a_messages_size_from_its_shapes_is_the_length_the_serializer_writes():
    """`encoded_size` (the local engine's reply count) against `len(encode(m))`: every wire dtype, masks of every
    length modulo 8 (packed bits), empty and 0-d arrays, and scalars of every kind, non-ASCII text included."""
    from manytask.messages import encoded_size

    rng = np.random.default_rng(0)
    arrays = {f"mask/{n}": rng.random(n) < 0.5 for n in range(18)}
    arrays.update({f"{dtype}/{shape}": rng.random(shape).astype(dtype) for dtype in
                   ("float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8")
                   for shape in ((), (0,), (3, 5), (2, 0, 4))})
    scalars = {"n": 3, "loss/é": 0.12345678901234567, "flag": True, "name": "größe ✓", "big": 1e300, "neg": -7}
    for message in (Message(), Message(arrays), Message(scalars=scalars), Message(arrays, scalars)):
        assert encoded_size(message) == len(encode(message))


def test_a_message_keeps_device_tensors_there_and_writes_them_as_the_host_would():
    from tests.simulated_cuda import simulated_cuda

    host = {"w": torch.randn(3, 4), "mask": torch.rand(13) > 0.5, "n": torch.tensor(7), "half": torch.ones(5).half()}
    scalars = {"n/digit": 12, "loss/digit": 0.25}
    with simulated_cuda() as sim:
        message = Message.from_tensors({k: v.cuda() for k, v in host.items()}, scalars=scalars)
        assert message.on_device() and all(message.tensor(k).is_cuda for k in host)
        assert message.tensor("n").shape == (1,)  # a 0-d tensor travels as shape (1,), as numpy stores it
        copies = sim.to_host
        size = encoded_size(message)
        assert sim.to_host == copies  # counted from shapes and dtypes, nothing read back
        written = encode(message)
        assert written == encode(Message.from_tensors(host, scalars=scalars)) and size == len(written)
        sent = snapshot(message)
        sent.tensor("w").zero_()  # a client writing into what it received does not reach the sender
        assert torch.equal(message.tensor("w").cpu(), host["w"])
        back = message.on_host()
        assert not back.on_device() and np.array_equal(back.arrays["w"], host["w"].numpy())
        assert message.on(torch.device("cuda", 0)) is message and back.on(torch.device("cpu")) is back
        moved = back.on(torch.device("cuda", 0))
        assert moved.tensor("w").is_cuda and torch.equal(moved.tensor("w").cpu(), host["w"])

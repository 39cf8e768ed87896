"""`decode` on hostile bytes (issue 17): mutated, truncated and crafted messages either decode or raise
`MessageError`, never another exception, and never allocate much more than the message holds."""

import json
import random
import struct
import tracemalloc

import numpy as np
import pytest

from manytask.messages import MAGIC, Message, MessageError, decode, encode

# Peak memory of one decode, traced: at most this multiple of the message's bytes plus a fixed allowance. A packed mask
# unpacks to one byte per bit (8x its bytes); the parsed header's Python objects take up to about 24x its bytes (an
# empty list, 64 bytes, per "[]," of 3), which the header of empty lists below reaches.
MEMORY_FACTOR, MEMORY_ALLOWANCE = 32, 64 << 10


def seed_messages() -> list[bytes]:
    rng = np.random.default_rng(0)
    return [encode(m) for m in [
        Message(),
        Message({"w": rng.standard_normal((4, 3)).astype(np.float32)}, {"n/digit": 12, "loss": 0.5}),
        Message({"mask": rng.random(37) > 0.5, "b": rng.integers(0, 9, 5), "h": np.float16([1.5, -2])},
                {"tag": "x", "ok": True}),
        Message({"a.weight": np.zeros((2, 2, 2), np.float64), "s": np.int8([1, -1]), "e": np.zeros((0, 3))}),
    ]]


def crafted(header: object, payload: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(raw)) + raw + payload


def entry(name="a", dtype="float32", shape=(2,), nbytes=8) -> dict:
    return {"name": name, "dtype": dtype, "shape": list(shape) if isinstance(shape, tuple) else shape,
            "nbytes": nbytes}


CRAFTED = [
    crafted({"arrays": [entry("m", "bool", (1 << 33,), 1 << 30)], "scalars": {}}),  # a 1 GB mask claimed in ~100 B
    crafted({"arrays": [entry("m", "bool", (1 << 32,), 0)], "scalars": {}}),
    crafted({"arrays": [entry(shape=(1 << 62, 1 << 62), nbytes=16)], "scalars": {}}, bytes(16)),
    crafted({"arrays": [entry(shape=(-1,), nbytes=-4)], "scalars": {}}),
    crafted({"arrays": [entry(shape=(True, 2), nbytes=8)], "scalars": {}}, bytes(8)),
    crafted({"arrays": [entry(shape=(2.0,), nbytes=8)], "scalars": {}}, bytes(8)),
    crafted({"arrays": [entry(shape="2", nbytes=8)], "scalars": {}}, bytes(8)),
    crafted({"arrays": [entry(shape=[1] * 100, nbytes=4)], "scalars": {}}, bytes(4)),
    crafted({"arrays": [entry(dtype="object")], "scalars": {}}, bytes(8)),
    crafted({"arrays": [entry(dtype=["float32"])], "scalars": {}}, bytes(8)),
    crafted({"arrays": [entry(name=7)], "scalars": {}}, bytes(8)),
    crafted({"arrays": [entry(), entry()], "scalars": {}}, bytes(16)),
    crafted({"arrays": [{**entry(), "extra": 1}], "scalars": {}}, bytes(8)),
    crafted({"arrays": [["a", "float32", [2], 8]], "scalars": {}}, bytes(8)),
    crafted({"arrays": {}, "scalars": {}}),
    crafted({"arrays": [], "scalars": []}),
    crafted({"arrays": [], "scalars": {"x": {"nested": 1}}}),
    crafted({"arrays": [], "scalars": {"x": [1, 2]}}),
    crafted({"arrays": [], "scalars": {"x": None}}),
    crafted({"arrays": []}),
    crafted([1, 2, 3]),
    crafted({"arrays": [[]] * 300_000, "scalars": {}}),
    crafted("text"),
    MAGIC + struct.pack("<I", 20_000) + b"[" * 20_000,  # nesting past the recursion limit
    MAGIC + struct.pack("<I", 4) + b"\xff\xfe\xfd\xfc",  # not UTF-8
    MAGIC + struct.pack("<I", 0xFFFFFFFF),
    MAGIC + b"\x01\x00",
    b"MTK2" + bytes(20),
    b"",
]


def mutations(seed_bytes: list[bytes], count: int, rng: random.Random) -> list[bytes]:
    """`count` inputs: random bit flips, byte overwrites, truncations, extensions, spliced headers and slices."""
    out = []
    for _ in range(count):
        data = bytearray(rng.choice(seed_bytes))
        kind = rng.randrange(6)
        if kind == 0 and data:
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind == 1 and data:
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 2:
            data = data[: rng.randrange(len(data) + 1)]
        elif kind == 3:
            data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        elif kind == 4 and len(data) > 8:  # the length field rewritten
            data[4:8] = struct.pack("<I", rng.choice([0, 1, len(data), len(data) - 8, rng.randrange(1 << 32)]))
        else:  # digits in the header changed: shapes, byte counts and scalars take other values
            text = bytearray(data)
            digits = [i for i, b in enumerate(text) if 48 <= b <= 57]
            for i in rng.sample(digits, min(len(digits), rng.randint(1, 3))):
                text[i] = rng.choice(b"0123456789-e.")
            data = text
        out.append(bytes(data))
    return out


def test_valid_messages_round_trip():
    for data in seed_messages():
        assert encode(decode(data)) == data


@pytest.mark.parametrize("data", CRAFTED, ids=range(len(CRAFTED)))
def test_crafted_messages_raise_the_one_error(data):
    with pytest.raises(MessageError):
        decode(data)


def test_ten_thousand_mutated_messages_raise_only_message_error_within_bounded_memory():
    rng = random.Random(17)
    inputs = mutations(seed_messages(), 10_000, rng) + CRAFTED
    outcomes = {"decoded": 0, "rejected": 0}
    worst = 0.0
    tracemalloc.start()
    try:
        for data in inputs:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            try:
                decode(data)
                outcomes["decoded"] += 1
            except MessageError:
                outcomes["rejected"] += 1
            peak = tracemalloc.get_traced_memory()[1] - base
            assert peak <= MEMORY_FACTOR * len(data) + MEMORY_ALLOWANCE, (peak, len(data), data[:80])
            worst = max(worst, peak / max(len(data), 1))
    finally:
        tracemalloc.stop()
    assert outcomes["rejected"] > 5_000 and outcomes["decoded"] > 100, outcomes  # both paths exercised


def test_a_big_endian_array_is_sent_with_its_values():
    array = np.arange(6, dtype=">f4").reshape(2, 3)
    decoded = decode(encode(Message({"a": array}))).arrays["a"]
    assert decoded.dtype == np.float32 and (decoded == array).all()


def test_errors_do_not_echo_unbounded_input():
    with pytest.raises(MessageError) as caught:
        decode(crafted({"arrays": [entry(name="x" * 100_000, dtype="complex")], "scalars": {}}))
    assert len(str(caught.value)) < 200

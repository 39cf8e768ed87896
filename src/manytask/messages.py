"""What crosses the wire: a `Message` of named arrays and scalars, and the ONE serializer for it.

Both engines send exactly `encode(message)`; the byte counts reported as communication are `len(encode(m))`.
The format is a small self-describing binary layout, no pickle:

    b"MTK1" | uint32 little-endian header length | UTF-8 JSON header | array payloads, concatenated

The header lists each array's name, dtype, shape and byte length, plus the scalars. Boolean arrays (masks) are
packed to one bit per entry with `numpy.packbits`, so a mask of d entries costs ceil(d / 8) bytes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

MAGIC = b"MTK1"
Scalar = int | float | str | bool
_DTYPES = {"float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"}
_BY_NAME = {name: np.dtype(name) for name in _DTYPES}  # parsed once: `np.frombuffer` would parse a name per array
_NAMES = {dtype: name for name, dtype in _BY_NAME.items()}  # a dict hit instead of `dtype.name`, a slow property
_HEADER = json.JSONEncoder(separators=(",", ":"))  # what `json.dumps(..., separators=...)` builds on every call


@dataclass
class Message:
    """Named arrays plus JSON-able scalars. Arrays are stored as numpy; `tensor()` gives a torch view."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    scalars: dict[str, Scalar] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.arrays = {name: _to_numpy(value) for name, value in self.arrays.items()}

    def tensor(self, name: str) -> Tensor:
        return torch.from_numpy(self.arrays[name])

    def tensors(self, prefix: str = "") -> dict[str, Tensor]:
        """All arrays whose name starts with `prefix`, with the prefix stripped."""
        return {n[len(prefix) :]: torch.from_numpy(a) for n, a in self.arrays.items() if n.startswith(prefix)}

    @classmethod
    def from_tensors(
        cls, tensors: Mapping[str, Tensor], prefix: str = "", scalars: Mapping[str, Scalar] | None = None
    ) -> Message:
        return cls({prefix + n: t for n, t in tensors.items()}, dict(scalars or {}))


def _dtype_name(dtype: np.dtype) -> str:
    """`dtype.name`, looked up: the wire's native dtypes hit the dict; others (a byte-swapped float32 is also
    named "float32") take the property."""
    return _NAMES.get(dtype) or dtype.name


def _to_numpy(value: np.ndarray | Tensor) -> np.ndarray:
    array = _tensor_to_numpy(value) if isinstance(value, Tensor) else np.asarray(value)
    if _dtype_name(array.dtype) not in _DTYPES:
        raise TypeError(f"array dtype {array.dtype} cannot be sent; use one of {sorted(_DTYPES)}")
    return np.ascontiguousarray(array)


def _tensor_to_numpy(tensor: Tensor) -> np.ndarray:
    """`tensor.detach().cpu().numpy()`; a CPU tensor outside autograd (the usual case) needs neither call, and
    skipping their two intermediate tensors halves the cost. The array and any error are the same."""
    if tensor.requires_grad or not tensor.is_cpu:
        tensor = tensor.detach().cpu()
    return tensor.numpy()


def encode(message: Message) -> bytes:
    """Serialize a message; the result's length is its communication cost."""
    entries, payloads = [], []
    for name, array in message.arrays.items():
        dtype = _dtype_name(array.dtype)
        raw = np.packbits(array.reshape(-1)).tobytes() if dtype == "bool" else array.tobytes()
        entries.append({"name": name, "dtype": dtype, "shape": list(array.shape), "nbytes": len(raw)})
        payloads.append(raw)
    header = _HEADER.encode({"arrays": entries, "scalars": message.scalars}).encode()
    return b"".join([MAGIC, struct.pack("<I", len(header)), header, *payloads])


def decode(data: bytes) -> Message:
    """Inverse of `encode`; rejects anything that is not a well-formed manytask message."""
    if data[:4] != MAGIC:
        raise ValueError("not a manytask message (bad magic bytes)")
    (header_len,) = struct.unpack("<I", data[4:8])
    header = json.loads(data[8 : 8 + header_len])
    offset, arrays, view = 8 + header_len, {}, memoryview(data)
    for entry in header["arrays"]:
        raw = view[offset : offset + entry["nbytes"]]  # a view: each array is copied once, into its own buffer
        if len(raw) != entry["nbytes"] or (dtype := _BY_NAME.get(entry["dtype"])) is None:
            raise ValueError(f"corrupt message: array '{entry['name']}' is truncated or has a bad dtype")
        offset += entry["nbytes"]
        arrays[entry["name"]] = _array_from_bytes(raw, dtype, tuple(entry["shape"]))
    if offset != len(data):
        raise ValueError("corrupt message: trailing bytes after the last array")
    message = Message.__new__(Message)  # the arrays are checked and contiguous already: no second conversion
    message.arrays, message.scalars = arrays, header["scalars"]
    return message


def _array_from_bytes(raw: bytes | memoryview, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    if dtype == np.bool_:  # only a mask needs its entry count (to drop the padding bits); np.prod is slow
        flat = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), count=int(np.prod(shape, dtype=np.int64)))
        flat = flat.astype(np.bool_)
    else:
        flat = np.frombuffer(raw, dtype=dtype).copy()
    return flat.reshape(shape)

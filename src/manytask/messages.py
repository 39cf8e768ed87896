"""What crosses the wire: a `Message` of named arrays and scalars, and the ONE serializer for it.

Flower and the worker processes send exactly `encode(message)`; the byte counts reported as communication are
`len(encode(m))`. In the local engine a client's reply goes to the server as the message itself, counted by
`encoded_size` (the same number: tests/test_messages.py), so no reply is written out and read back.
The format is a small self-describing binary layout, no pickle:

    b"MTK1" | uint32 little-endian header length | UTF-8 JSON header | array payloads, concatenated

The header lists each array's name, dtype, shape and byte length, plus the scalars. Boolean arrays (masks) are
packed to one bit per entry with `numpy.packbits`, so a mask of d entries costs ceil(d / 8) bytes.

A message holds host arrays as numpy. A tensor on an accelerator stays there, as the tensor it was given: in-process,
a reply made on the device reaches the server's aggregation on the device, and a payload made from a server state on
the device reaches the clients there. It crosses to the host only where the message is written out (`encode`);
`encoded_size` counts it from its shape and dtype.
"""

from __future__ import annotations

import json
import math
import struct
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from manytask.errors import clipped

MAGIC = b"MTK1"
Scalar = int | float | str | bool
_DTYPES = {"float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"}
_BY_NAME = {name: np.dtype(name) for name in _DTYPES}  # parsed once: `np.frombuffer` would parse a name per array
_BOOL = _BY_NAME["bool"]
_NAMES = {dtype: name for name, dtype in _BY_NAME.items()}  # a dict hit instead of `dtype.name`, a slow property
_HEADER = json.JSONEncoder(separators=(",", ":"))  # what `json.dumps(..., separators=...)` builds on every call
_OPEN, _JOIN = b'{"arrays":', b'],"scalars":'  # how `encode` lays out every header
_WIRE_NAMES = {getattr(torch, name): name for name in _DTYPES}  # torch dtype -> its wire name

Array = np.ndarray | Tensor  # a host array, or a tensor left on the accelerator it was made on


@dataclass
class Message:
    """Named arrays plus JSON-able scalars. Host arrays are stored as numpy (`tensor()` gives a torch view); a tensor
    on an accelerator is stored as itself, detached (see the module)."""

    arrays: dict[str, Array] = field(default_factory=dict)
    scalars: dict[str, Scalar] = field(default_factory=dict)
    _views: tuple[tuple[int, ...], tuple[str, ...], dict[str, Tensor], tuple[Array, ...]] | None = field(
        default=None, init=False, repr=False, compare=False)  # (the arrays' ids, their names, their views, the arrays)

    def __post_init__(self) -> None:
        self.arrays = {name: _stored(value) for name, value in self.arrays.items()}

    def tensor(self, name: str) -> Tensor:
        return _as_tensor(self.arrays[name])

    def on_device(self) -> bool:
        """Whether any array is a tensor kept on its device."""
        return any(isinstance(array, Tensor) for array in self.arrays.values())

    def host_arrays(self) -> dict[str, np.ndarray]:
        """Every array as numpy on the host (a device tensor copied there): for code that reads values as numpy."""
        return {name: _host_array(array) for name, array in self.arrays.items()}

    def on(self, device: torch.device) -> Message:
        """This message with every array on `device` (itself where they all are there)."""
        if device.type == "cpu":
            return self.on_host()
        if all(isinstance(a, Tensor) and _is_on(a, device) for a in self.arrays.values()):
            return self
        return Message({n: _as_tensor(a).to(device) for n, a in self.arrays.items()}, self.scalars)

    def on_host(self) -> Message:
        """This message with every array on the host (itself where they all are there)."""
        return Message(self.host_arrays(), self.scalars) if self.on_device() else self

    def tensors(self, prefix: str = "") -> dict[str, Tensor]:
        """All arrays whose name starts with `prefix`, with the prefix stripped, as tensors sharing their memory.
        The views are made once while the arrays stay the same objects: a server reads each reply several times
        (screening, the divergence guard, aggregation)."""
        views = self._all_views()
        if not prefix:
            return dict(views)
        return {n[len(prefix) :]: t for n, t in views.items() if n.startswith(prefix)}

    def _all_views(self) -> dict[str, Tensor]:
        arrays = self.arrays
        cached = self._views
        # the same array objects under the same names, compared in C by identity (the cache holds the arrays, so
        # their ids cannot be reused while it stands)
        ids = tuple(map(id, arrays.values()))
        if cached is None or cached[0] != ids or cached[1] != tuple(arrays):
            cached = self._views = (ids, tuple(arrays), {n: _as_tensor(a) for n, a in arrays.items()},
                                    tuple(arrays.values()))
        return cached[2]

    @classmethod
    def from_tensors(
        cls, tensors: Mapping[str, Tensor], prefix: str = "", scalars: Mapping[str, Scalar] | None = None
    ) -> Message:
        return cls({prefix + n: t for n, t in tensors.items()}, dict(scalars or {}))


def _is_on(tensor: Tensor, device: torch.device) -> bool:
    """Whether `tensor` lies on `device` ("cuda" meaning the current GPU, as `.to` takes it)."""
    index = torch.cuda.current_device() if device.index is None and device.type == "cuda" else device.index
    return tensor.device.type == device.type and tensor.device.index == index


def _as_tensor(array: Array) -> Tensor:
    return array if isinstance(array, Tensor) else _view(array)


def _view(array: np.ndarray) -> Tensor:
    """`torch.from_numpy(array)`, also for the read-only arrays `decode` makes over immutable bytes: what is received
    is only read (`decode`), so torch's warning that writing into such a tensor is undefined is not for the user.
    Torch gives it once a process; the first read-only view is made with it silenced."""
    if array.flags.writeable or _READ_ONLY_SEEN:
        return torch.from_numpy(array)
    return _first_read_only_view(array)


_READ_ONLY_SEEN = False


def _first_read_only_view(array: np.ndarray) -> Tensor:
    global _READ_ONLY_SEEN
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)
        view = torch.from_numpy(array)
    _READ_ONLY_SEEN = True
    return view


def _dtype_name(dtype: np.dtype) -> str:
    """`dtype.name`, looked up: the wire's native dtypes hit the dict; others (a byte-swapped float32 is also
    named "float32") take the property."""
    return _NAMES.get(dtype) or dtype.name


def _stored(value: Array) -> Array:
    """How a message holds a value: a tensor on an accelerator as a detached contiguous tensor of a wire dtype (0-d
    as shape (1,), as numpy stores it); anything else as a contiguous little-endian numpy array."""
    if not isinstance(value, Tensor) or value.is_cpu:
        return _to_numpy(value)
    if value.dtype not in _WIRE_NAMES:
        raise TypeError(f"array dtype {value.dtype} cannot be sent; use one of {sorted(_DTYPES)}")
    return value.detach().reshape(value.shape or (1,)).contiguous()


def _host_array(array: Array) -> np.ndarray:
    return _tensor_to_numpy(array) if isinstance(array, Tensor) else array


def _to_numpy(value: np.ndarray | Tensor) -> np.ndarray:
    array = _tensor_to_numpy(value) if isinstance(value, Tensor) else np.asarray(value)
    if _dtype_name(array.dtype) not in _DTYPES:
        raise TypeError(f"array dtype {array.dtype} cannot be sent; use one of {sorted(_DTYPES)}")
    if array.dtype.str[0] == ">":  # the wire is little-endian: a big-endian array is converted, not mislabelled
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array)


def _tensor_to_numpy(tensor: Tensor) -> np.ndarray:
    """`tensor.detach().cpu().numpy()`; a CPU tensor outside autograd (the usual case) needs neither call, and
    skipping their two intermediate tensors halves the cost. The array and any error are the same."""
    if tensor.requires_grad or not tensor.is_cpu:
        tensor = tensor.detach().cpu()
    return tensor.numpy()


def snapshot(message: Message) -> Message:
    """A copy of `message` whose device tensors are copies on the device: what a client reads in-process, as a
    decoded payload is, fixed when it is sent and separate from the sender's tensors (host arrays are shared: no
    message with device tensors holds host arrays the server changes)."""
    copy = Message.__new__(Message)
    copy.arrays = {n: a.clone() if isinstance(a, Tensor) else a for n, a in message.arrays.items()}
    copy.scalars = dict(message.scalars)
    return copy


def encode(message: Message) -> bytes:
    """Serialize a message; the result's length is its communication cost."""
    layout, payloads = [], []
    for name, stored in message.arrays.items():
        array = _host_array(stored)
        dtype = _dtype_name(array.dtype)
        # a byte view of the (contiguous) array: the join below is its only copy
        raw = np.packbits(array.reshape(-1)) if dtype == "bool" else array.reshape(-1).view(np.uint8)
        layout.append((name, dtype, array.shape, raw.nbytes))
        payloads.append(raw)
    header = _header(tuple(layout), message.scalars)
    return b"".join([MAGIC, struct.pack("<I", len(header)), header, *payloads])


def encoded_size(message: Message) -> int:
    """`len(encode(message))` from the arrays' shapes and dtypes and the framing, without writing the bytes: what
    a message costs where it does not cross a process (the local engine's replies)."""
    layout = []
    for name, array in message.arrays.items():
        if isinstance(array, Tensor):
            dtype, size, shape = _WIRE_NAMES[array.dtype], array.numel(), tuple(array.shape)
            nbytes = (size + 7) // 8 if dtype == "bool" else size * array.element_size()
        else:
            dtype, shape = _dtype_name(array.dtype), array.shape
            nbytes = (array.size + 7) // 8 if dtype == "bool" else array.nbytes
        layout.append((name, dtype, shape, nbytes))
    return len(MAGIC) + 4 + len(_header(tuple(layout), message.scalars)) + sum(entry[3] for entry in layout)


def _header(layout: tuple[tuple[str, str, tuple[int, ...], int], ...], scalars: Mapping[str, Scalar]) -> bytes:
    """`_HEADER.encode({"arrays": entries, "scalars": scalars})`, byte for byte, its arrays' part written once per
    layout."""
    return b"".join([_OPEN, _arrays_json(layout), _JOIN[1:], _HEADER.encode(scalars).encode(), b"}"])


Sent = bytes | Message  # what crossed (bytes), or in-process the message itself, never written out


def sent_size(sent: Sent) -> int:
    """The bytes a sent message costs on the wire."""
    return encoded_size(sent) if isinstance(sent, Message) else len(sent)


def as_bytes(sent: Sent) -> bytes:
    """A sent message as the bytes that cross a process or a wire."""
    return encode(sent) if isinstance(sent, Message) else sent


def as_message(sent: Sent) -> Message:
    """A sent message as the receiver reads it: decoded (`MessageError` on malformed bytes), or itself."""
    return sent if isinstance(sent, Message) else decode(sent)


@lru_cache(maxsize=64)
def _arrays_json(layout: tuple[tuple[str, str, tuple[int, ...], int], ...]) -> bytes:
    """The header's list of array entries (name, dtype, shape, byte count), as JSON."""
    entries = [{"name": name, "dtype": dtype, "shape": list(shape), "nbytes": nbytes}
               for name, dtype, shape, nbytes in layout]
    return _HEADER.encode(entries).encode()


class MessageError(ValueError):
    """Bytes that are not a well-formed manytask message: the one error `decode` raises for anything malformed."""


MAX_MESSAGE_BYTES = 1 << 32  # 4 GiB: a model larger than this does not travel as one message
MAX_HEADER_BYTES = 16 << 20  # a header lists arrays and scalars: 16 MiB is about 150 000 arrays
MAX_DIMS = 32
_ENTRY_KEYS = {"name", "dtype", "shape", "nbytes"}
_SCALAR_TYPES = {int, float, str, bool}  # what JSON parses a flat value into


def decode(data: bytes) -> Message:
    """Inverse of `encode`, safe on untrusted bytes: raises `MessageError`, and nothing else, for anything that is
    not a well-formed manytask message. Every size the header declares is checked against the bytes present before
    anything is allocated, so decoding costs at most the message's size in arrays (eight times a packed mask's
    bytes, one byte per entry) plus the parsed header.

    From immutable `bytes` the arrays are read-only views into them, not copies (a round decodes every payload and
    every reply, a model's size each): what a client or a server receives is only ever read, as `fit_many` already
    relies on when it hands one decoded payload to every client of a task set. A write through a torch view would
    change the bytes (tests/test_received_unchanged.py runs every method to check that none does). From a mutable buffer
    (bytearray, memoryview) the arrays are copies, so a later change to the buffer cannot reach them."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise MessageError(f"a message is bytes, not {type(data).__name__}")
    if len(data) > MAX_MESSAGE_BYTES:
        raise MessageError(f"message of {len(data)} bytes exceeds the maximum of {MAX_MESSAGE_BYTES}")
    if len(data) < 8 or bytes(data[:4]) != MAGIC:
        raise MessageError("not a manytask message (bad magic bytes)")
    (header_len,) = struct.unpack("<I", data[4:8])
    if header_len > min(MAX_HEADER_BYTES, len(data) - 8):
        raise MessageError(f"corrupt message: header of {header_len} bytes in a message of {len(data)}")
    entries, scalars = _parse_header(bytes(data[8 : 8 + header_len]))
    offset, arrays, view, shared = 8 + header_len, {}, memoryview(data), type(data) is bytes
    for name, dtype, shape, nbytes in entries:
        if offset + nbytes > len(data):
            raise MessageError(f"corrupt message: array '{clipped(name)}' is truncated")
        arrays[name] = _array_from_bytes(view[offset : offset + nbytes], dtype, shape, copy=not shared)
        offset += nbytes
    if offset != len(data):
        raise MessageError("corrupt message: trailing bytes after the last array")
    message = Message.__new__(Message)  # the arrays are checked and contiguous already: no second conversion
    message.arrays, message.scalars = arrays, scalars
    return message


Entry = tuple[str, np.dtype, tuple[int, ...], int]


def _parse_header(raw: bytes) -> tuple[tuple[Entry, ...], dict[str, Scalar]]:
    """The header's array entries (name, dtype, shape, byte count) and its scalars, each checked: known keys only,
    names unique, dtypes from the wire's list, shapes of non-negative ints whose byte count is exactly the one
    declared (⌈n/8⌉ for a packed mask), scalars flat. Small headers are parsed once (a round sends the same payload
    to many clients); the cache is bounded by `_CACHED_HEADERS` × `_CACHED_HEADER_BYTES`."""
    if len(raw) > _CACHED_HEADER_BYTES:
        return _checked_header(raw)
    parts = _split_header(raw)
    if parts is not None:
        return parts
    entries, scalars = _cached_header(raw)
    return entries, dict(scalars)  # the caller owns its scalars


_CACHED_HEADERS, _CACHED_HEADER_BYTES = 32, 16 << 10


def _split_header(raw: bytes) -> tuple[tuple[Entry, ...], dict[str, Scalar]] | None:
    """A header laid out as `encode` writes it, `{"arrays":A,"scalars":S}`, parsed in two parts: the arrays' part
    once per distinct A (replies of the same task set share it, their scalars differ), the scalars every time. None
    (the caller parses the whole) where the layout differs or a part is not the JSON it must be. Where both parts
    parse, the whole is exactly that object, so nothing is accepted that the whole parse refuses."""
    cut = raw.find(_JOIN)
    if not raw.startswith(_OPEN) or not raw.endswith(b"}") or cut < 0:
        return None
    scalars = _json(raw[cut + len(_JOIN) : -1])
    if type(scalars) is not dict:
        return None
    entries = _cached_entries(raw[len(_OPEN) : cut + 1])
    return None if entries is None else (entries, _checked_scalars(scalars))  # checked in the whole parse's order


def _json(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


@lru_cache(maxsize=_CACHED_HEADERS)
def _cached_entries(raw: bytes) -> tuple[Entry, ...] | None:
    arrays = _json(raw)
    return _checked_entries(arrays) if type(arrays) is list else None


def _checked_header(raw: bytes) -> tuple[tuple[Entry, ...], dict[str, Scalar]]:
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as err:  # bad UTF-8 or JSON; nesting deep enough to exhaust the stack
        raise MessageError(f"corrupt message: the header is not JSON ({type(err).__name__})") from None
    if not isinstance(header, dict) or set(header) != {"arrays", "scalars"}:
        raise MessageError("corrupt message: the header must hold exactly 'arrays' and 'scalars'")
    arrays, scalars = header["arrays"], header["scalars"]
    if not isinstance(arrays, list) or not isinstance(scalars, dict):
        raise MessageError("corrupt message: 'arrays' must be a list and 'scalars' an object")
    return _checked_entries(arrays), _checked_scalars(scalars)


def _checked_scalars(scalars: dict[str, object]) -> dict[str, Scalar]:
    for key, value in scalars.items():
        if type(value) not in _SCALAR_TYPES:
            raise MessageError(f"corrupt message: scalar '{clipped(key)}' is not a number, string or boolean")
    return scalars  # type: ignore[return-value]


def _checked_entries(arrays: list[object]) -> tuple[Entry, ...]:
    entries = tuple(_entry(entry) for entry in arrays)
    if len({name for name, *_ in entries}) != len(entries):
        raise MessageError("corrupt message: two arrays share a name")
    return entries


@lru_cache(maxsize=_CACHED_HEADERS)
def _cached_header(raw: bytes) -> tuple[tuple[Entry, ...], dict[str, Scalar]]:
    return _checked_header(raw)  # its scalars are shared by every hit: `_parse_header` hands out copies


def _entry(entry: object) -> Entry:
    """One array entry, checked (written for speed: every payload and reply of a round passes here)."""
    if type(entry) is not dict or entry.keys() != _ENTRY_KEYS:
        raise MessageError(f"corrupt message: an array entry must hold exactly {sorted(_ENTRY_KEYS)}")
    name, dtype, shape, nbytes = entry["name"], entry["dtype"], entry["shape"], entry["nbytes"]
    dtype = _BY_NAME.get(dtype) if type(dtype) is str else None
    if type(name) is not str:
        raise MessageError("corrupt message: an array's name must be a string")
    if dtype is None:
        raise MessageError(f"corrupt message: array '{clipped(name)}' has an unknown dtype")
    if type(shape) is not list or len(shape) > MAX_DIMS:
        raise MessageError(f"corrupt message: array '{clipped(name)}' has a bad shape")
    count = 1
    for size in shape:
        if type(size) is not int or size < 0:
            raise MessageError(f"corrupt message: array '{clipped(name)}' has a bad shape")
        count *= size
    expected = (count + 7) // 8 if dtype is _BOOL else count * dtype.itemsize
    if type(nbytes) is not int or nbytes != expected:
        raise MessageError(f"corrupt message: array '{clipped(name)}' declares {clipped(nbytes)} bytes for its shape")
    return name, dtype, tuple(shape), nbytes


def _array_from_bytes(raw: bytes | memoryview, dtype: np.dtype, shape: tuple[int, ...], copy: bool) -> np.ndarray:
    if dtype is _BOOL:  # only a mask needs its entry count (to drop the padding bits); unpacking copies
        flat = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), count=math.prod(shape)).view(np.bool_)
    else:
        flat = np.frombuffer(raw, dtype=dtype)  # read-only where `raw` views immutable bytes
        if copy:
            flat = flat.copy()
    return flat.reshape(shape)

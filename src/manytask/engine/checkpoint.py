"""Checkpoints: server state, client states, RNG state and round in ONE safetensors file, replaced atomically.

Tensors are stored under `server/<name>`, `client/<id>/<name>` and `rng/torch`; the round and other JSON-able
facts go in the file's metadata under "manytask", as JSON. Writing goes to a temporary file that `os.replace` swaps
in, so a crash leaves either the previous checkpoint or the new one, never a torn file.

Integrity (issue 17). The metadata also holds, under "manytask-checksum", a SHA-256 over every tensor's record (in
sorted name order: its name, dtype, shape, byte count and the CRC-32 of its bytes) and over the "manytask" JSON text
itself, and that JSON names the run the checkpoint belongs to (`RunIdentity`: a hash of the run's config, its method
and label, its total rounds). Loading verifies the checksum; given the identity of the run that loads it, it also
refuses a checkpoint of another run, a round outside 0..total rounds, and NaN or infinite values in the server
state. Every failure is a `ManytaskError` of one sentence naming the file and what to do, never a library traceback.

The config hash leaves out `PLACEMENT_FIELDS` (where and how fast clients train, which the numbers do not depend
on); `manytask run --resume` reuses config.yaml as it is, so only a hand edit can change any field.

The checksum guards against accidents (bit rot, a torn or truncated copy, another file), not against an adversary:
anyone who can write the file can recompute any unkeyed digest. CRC-32 catches every burst of up to 32 flipped
bits and misses random damage with probability 2^-32 per tensor, at about 7 GB/s where SHA-256 hashes 1 GB/s on
this project's VM: over a whole checkpoint SHA-256 was the larger part of a checkpoint's time. Checkpoints of the
earlier format carry, under "manytask-digest", a SHA-256 over the tensors' bytes themselves, and are verified by it.

Checkpoints written before digests (neither key in their metadata, hence no identity either) are still
accepted: they are checked for readability, structure, round bounds and finite server values, but not for bit rot,
nor for which run wrote them (one copied from another run may load and fail rounds later). A checkpoint saved with
`Checkpoint.run` None has a digest but is not matched to a run."""

from __future__ import annotations

import hashlib
import json
import math
import os
import zlib
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from torch import Tensor

from manytask.errors import ManytaskError, clipped
from manytask.input_limits import shown_path

if TYPE_CHECKING:
    from manytask.config import RunConfig
    from manytask.experiment import Experiment

META_KEY = "manytask"
CHECKSUM_KEY = "manytask-checksum"
DIGEST_KEY = "manytask-digest"  # the earlier format's SHA-256 over the bytes themselves: verified, no longer written
LATE_WIDTH = 64  # characters of a metadata value written after the data: a SHA-256 in hex

# Config fields that say where and how fast a run's clients train, not what they compute (the config documents the
# numbers as independent of them): a run directory whose config.yaml was edited in these alone still resumes.
PLACEMENT_FIELDS = ("threads", "workers", "execution", "vector_clients", "memory_budget_gb", "device",
                    "checkpoint_every", "checkpoint_background")


@dataclass(frozen=True)
class RunIdentity:
    """Which run a checkpoint belongs to."""

    config_hash: str  # `config_hash` of the run's single-method config
    method: str  # the method's registry name
    label: str  # the run's label (its sub-directory in a comparison)
    total_rounds: int
    data: str | None = None  # `Experiment.data_fingerprint`; None in checkpoints written before data identity

    def to_json(self) -> dict[str, Any]:
        data = {"config_hash": self.config_hash, "method": self.method, "label": self.label,
                "total_rounds": self.total_rounds}
        return data if self.data is None else {**data, "data": self.data}

    def same_run(self, other: RunIdentity) -> bool:
        """The same config, method, label and rounds (the data are compared on their own, by `_check_belongs`)."""
        return (self.config_hash, self.method, self.label, self.total_rounds) == (
            other.config_hash, other.method, other.label, other.total_rounds)

    def describe(self) -> str:
        """For an error message (the values may come from a damaged file: each is clipped)."""
        method = _shown(self.method, 30)
        named = method if self.label == self.method else f"{method} labelled {_shown(self.label, 30)}"
        return f"method {named}, {_shown(self.total_rounds, 12)} rounds, config {_shown(self.config_hash[:12], 12)}"


@dataclass
class Checkpoint:
    round: int  # rounds completed
    server: dict[str, Tensor]
    clients: dict[int, dict[str, Tensor]]
    extra: dict = field(default_factory=dict)
    torch_rng: Tensor | None = None
    run: RunIdentity | None = None  # None: a checkpoint written before checkpoints named their run


def config_hash(config: RunConfig) -> str:
    """SHA-256 of the run's validated config as canonical JSON, without the `PLACEMENT_FIELDS`."""
    data = config.model_dump(mode="json")
    for name in PLACEMENT_FIELDS:
        data.pop(name, None)
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def identity_of(experiment: Experiment) -> RunIdentity:
    return RunIdentity(config_hash(experiment.config), experiment.method_name, experiment.label,
                       experiment.total_rounds, experiment.data_fingerprint)


def save_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    tensors = {f"server/{k}": v for k, v in checkpoint.server.items()}
    for client, state in checkpoint.clients.items():
        tensors.update({f"client/{client}/{k}": v for k, v in state.items()})
    if checkpoint.torch_rng is not None:
        tensors["rng/torch"] = checkpoint.torch_rng
    # written from where they lie: a copy only of a tensor that is not a packed CPU tensor (on a device, or strided)
    tensors = {k: packed(v.detach()) for k, v in tensors.items()}
    meta: dict[str, Any] = {"round": checkpoint.round, "clients": sorted(checkpoint.clients),
                            "extra": checkpoint.extra}
    if checkpoint.run is not None:
        meta["run"] = checkpoint.run.to_json()
    text = json.dumps(meta)
    tmp = path.with_name(path.name + ".tmp")
    # the checksum is taken on a second thread while this one writes the same bytes (both release the GIL), and
    # goes into the header last; the file holds the same bytes as when it was summed first
    with ThreadPoolExecutor(1) as summer:
        checksum = summer.submit(_checksum, tensors, text)
        write_safetensors(tmp, tensors, {META_KEY: text}, {CHECKSUM_KEY: checksum})
    os.replace(tmp, path)


# the safetensors names of the dtypes a checkpoint stores
SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                      torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                      torch.uint8: "U8", torch.bool: "BOOL"}


def write_safetensors(path: Path, tensors: dict[str, Tensor], metadata: dict[str, str],
                      late: Mapping[str, Future[str]] | None = None) -> None:
    """A safetensors file of packed CPU tensors, written from their memory (no copy, views of one stack included):
    the 8-byte header length, the JSON header (compact, keys sorted, padded with spaces to a multiple of 8), then
    the data, larger items first so every tensor lies at a multiple of its item size. The same tensors and metadata
    always give the same bytes. `late` metadata values (each `LATE_WIDTH` characters: a digest) are awaited while
    the data is written, and the header is then written again with them."""
    unknown = sorted({str(v.dtype) for v in tensors.values() if v.dtype not in SAFETENSORS_DTYPES})
    if unknown:
        raise TypeError(f"a checkpoint cannot store {unknown[0]} tensors")
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    late = late or {}
    with path.open("wb") as handle:
        handle.write(_header(tensors, order, {**metadata, **dict.fromkeys(late, "0" * LATE_WIDTH)}))
        for key in order:
            if tensors[key].numel():
                handle.write(_raw_bytes(tensors[key]))
        if late:
            values = {key: future.result() for key, future in late.items()}
            if any(len(value) != LATE_WIDTH for value in values.values()):
                raise ValueError(f"late metadata must be {LATE_WIDTH} characters long")
            handle.seek(0)
            handle.write(_header(tensors, order, {**metadata, **values}))


def _header(tensors: dict[str, Tensor], order: list[str], metadata: dict[str, str]) -> bytes:
    """The header length and the header of a safetensors file of `tensors` in `order`."""
    header: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    for key in order:
        value = tensors[key]
        end = offset + value.numel() * value.element_size()
        header[key] = {"dtype": SAFETENSORS_DTYPES[value.dtype], "shape": list(value.shape),
                       "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(dict(sorted(header.items())), separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def packed(value: Tensor) -> Tensor:
    """`value` as a packed CPU tensor: itself where it is one already, else a copy."""
    return value.to("cpu").contiguous()  # each returns `value` itself where it is already so


def load_checkpoint(path: Path, expected: RunIdentity | None = None) -> Checkpoint:
    """Read and verify the checkpoint at `path`. With `expected` (the identity of the run loading it), also refuse a
    checkpoint of another run, a round outside 0..`expected.total_rounds` and non-finite server values."""
    tensors, metadata = _read(path)
    text = metadata.get(META_KEY)
    if not isinstance(text, str):
        raise _corrupt(path, "it has no manytask metadata")
    try:
        meta = json.loads(text)
    except ValueError:
        raise _corrupt(path, "its metadata is not valid JSON") from None
    if not isinstance(meta, dict):
        raise _corrupt(path, "its metadata is not a JSON object")
    checks = {key: summary for key, summary in ((CHECKSUM_KEY, _checksum), (DIGEST_KEY, _digest))
              if metadata.get(key) is not None}
    if not checks and "run" in meta:  # only a damaged file names its run without a digest
        raise _corrupt(path, "its metadata names its run but has no digest")
    if any(metadata[key] != summary(tensors, text) for key, summary in checks.items()):
        raise _corrupt(path, "its tensors do not match their digest")
    checkpoint = _parse(path, meta, tensors)
    if expected is not None:
        _check_belongs(path, checkpoint, expected)
    return checkpoint


def checkpoint_error(path: Path, problem: str) -> ManytaskError:
    """'checkpoint P is corrupt (problem); delete it …', for a problem found after loading (a state that misfits)."""
    return _corrupt(path, problem)


def _read(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    try:
        if path.stat().st_size == 0:
            raise _unreadable(path, "it is empty")
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 (not a dict)
    except ManytaskError:
        raise
    except OSError as err:
        raise _unreadable(path, err.strerror or type(err).__name__) from None
    except Exception as err:  # SafetensorError (a bare Exception subclass), or torch refusing a dtype or shape
        reason = " ".join(str(err).split()).removeprefix("Error while deserializing header: ") or type(err).__name__
        raise _unreadable(path, f"it is truncated or not a safetensors file: {_shown(reason, 50)}") from None
    return tensors, metadata


def _parse(path: Path, meta: dict[str, Any], tensors: dict[str, Tensor]) -> Checkpoint:
    round_, ids, extra = meta.get("round"), meta.get("clients"), meta.get("extra", {})
    if not _is_int(round_):
        raise _corrupt(path, "its round is not a whole number")
    if round_ < 0:
        raise _invalid(path, f"it claims {_shown(round_, 12)} completed rounds")
    if not isinstance(ids, list) or not all(_is_int(c) and c >= 0 for c in ids) or len(set(ids)) != len(ids):
        raise _corrupt(path, "its client list is not a list of distinct client numbers")
    if not isinstance(extra, dict):
        raise _corrupt(path, "its extra facts are not a JSON object")
    elapsed = extra.get("elapsed", 0.0)
    if not (isinstance(elapsed, (int, float)) and not isinstance(elapsed, bool) and math.isfinite(elapsed)
            and elapsed >= 0):
        raise _corrupt(path, "its elapsed time is not a non-negative number")
    clients: dict[int, dict[str, Tensor]] = {c: {} for c in ids}
    server: dict[str, Tensor] = {}
    rng = None
    for key, value in tensors.items():
        scope, _, rest = key.partition("/")
        client, _, name = rest.partition("/")
        if scope == "server" and rest:
            server[rest] = value
        elif scope == "client" and name and client.isdigit() and int(client) in clients:
            clients[int(client)][name] = value
        elif key == "rng/torch" and value.dtype == torch.uint8 and value.dim() == 1:
            rng = value
        else:
            raise _corrupt(path, f"it holds an unexpected tensor '{_shown(key, 40)}'")
    run = None
    if "run" in meta:
        run = _identity(path, meta["run"])
    return Checkpoint(round_, server, clients, extra, rng, run)


def _identity(path: Path, data: Any) -> RunIdentity:
    fields = ("config_hash", "method", "label")
    if (not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in fields)
            or not _is_int(data.get("total_rounds"))):
        raise _corrupt(path, "its run identity is malformed")
    if not isinstance(data.get("data", ""), str):
        raise _corrupt(path, "its data fingerprint is malformed")
    return RunIdentity(data["config_hash"], data["method"], data["label"], data["total_rounds"], data.get("data"))


def _check_belongs(path: Path, checkpoint: Checkpoint, expected: RunIdentity) -> None:
    if checkpoint.run is not None and not checkpoint.run.same_run(expected):
        raise ManytaskError(
            f"checkpoint '{shown_path(path)}' belongs to another run ({checkpoint.run.describe()}; this run is "
            f"{expected.describe()}); resume the run it came from, or delete it to restart this run from round 1."
        )
    if checkpoint.run is not None and None not in (checkpoint.run.data, expected.data) and (
            checkpoint.run.data != expected.data):
        raise ManytaskError(
            f"checkpoint '{shown_path(path)}' was written on other data than this run now has (data fingerprint "
            f"{_shown(checkpoint.run.data, 16)}, now {expected.data}): its benchmark gave other samples or another "
            "partition (unseeded data, or files changed under its root); restore the data, or delete the checkpoint "
            "to restart this run from round 1."
        )
    if checkpoint.round > expected.total_rounds:
        claimed = _shown(checkpoint.round, 12)
        raise _invalid(path, f"it claims {claimed} completed rounds of this run's {expected.total_rounds}")
    for name, value in checkpoint.server.items():
        if (value.is_floating_point() or value.is_complex()) and not bool(torch.isfinite(value).all()):
            raise _corrupt(path, f"server tensor '{_shown(name, 40)}' holds NaN or infinite values")


def _checksum(tensors: dict[str, Tensor], meta_text: str) -> str:
    """SHA-256 over each tensor's record in sorted name order, [name, dtype, shape, bytes, CRC-32 of its bytes]
    (the bytes summed where they lie: no copy), then the metadata JSON text."""
    records = []
    for name in sorted(tensors):
        value = tensors[name]
        data = _raw_bytes(packed(value))
        records.append([name, str(value.dtype), list(value.shape), len(data), zlib.crc32(data)])
    return hashlib.sha256(json.dumps([records, meta_text]).encode()).hexdigest()


def _digest(tensors: dict[str, Tensor], meta_text: str) -> str:
    """The earlier format's digest: SHA-256 over the tensors in sorted name order (name, dtype, shape, then the
    bytes, each length-prefixed) and the metadata JSON text. The bytes are hashed where they lie: no copy."""
    sha = hashlib.sha256()

    def chunk(data: bytes | memoryview) -> None:
        sha.update(len(data).to_bytes(8, "little"))
        sha.update(data)

    for name in sorted(tensors):
        value = packed(tensors[name])
        chunk(json.dumps([name, str(value.dtype), list(value.shape)]).encode())
        chunk(_raw_bytes(value))
    chunk(meta_text.encode())
    return sha.hexdigest()


def _raw_bytes(value: Tensor) -> memoryview:
    """The bytes of a packed CPU tensor, viewed where they lie (a uint8 view through numpy: no copy)."""
    return memoryview(value.reshape(-1).view(torch.uint8).numpy())


def _shown(value: object, limit: int) -> str:
    """A value read from the file, for an error message: one line, at most `limit` characters."""
    return clipped("".join(c if c.isprintable() else "?" for c in str(value)), limit)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _what_to_do() -> str:
    return "delete it to restart this run from round 1, or restore it from a backup."


def _unreadable(path: Path, reason: str) -> ManytaskError:
    return ManytaskError(f"checkpoint '{shown_path(path)}' cannot be read ({_shown(reason, 100)}); {_what_to_do()}")


def _corrupt(path: Path, problem: str) -> ManytaskError:
    return ManytaskError(f"checkpoint '{shown_path(path)}' is corrupt ({problem}); {_what_to_do()}")


def _invalid(path: Path, problem: str) -> ManytaskError:
    return ManytaskError(f"checkpoint '{shown_path(path)}' is invalid ({problem}); {_what_to_do()}")

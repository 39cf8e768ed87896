"""Checkpoints written on a background thread, while the next round trains.

`CheckpointWriter.save` copies the state (the run goes on changing its tensors, some in place) and hands the copy to
a thread that writes it (`save_checkpoint`: a temporary file swapped in, so a crash leaves the previous checkpoint
or the new one). The round loop waits only for that copy, and for a write still in flight when it saves again or
stops. A crash while round r's checkpoint is being written leaves round r − 1's, and the resumed run redoes round r
from it, to the same numbers (the loop removes metric rows written after the checkpoint on disk).

On a 2-core VM whose training takes one thread (the bench), the write takes the other; a copy in memory runs at
several GB/s, where writing and summing the same bytes is several times slower."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from manytask.engine.checkpoint import Checkpoint, packed, save_checkpoint

Key = tuple[str, str]  # (scope: "server", a client's number or "rng"; the tensor's name)
ALIGN = 64  # bytes: every copy starts on a cache line, at a multiple of any item size


class CheckpointWriter:
    """At most one checkpoint in flight; an error in writing it is raised by the next `save` or `wait`. Not
    `background` (`checkpoint_background: false`, as the strace kill campaign runs, whose kill points are counted
    per thread): `save` writes the checkpoint itself, from the tensors where they lie."""

    def __init__(self, background: bool = True) -> None:
        self.background = background
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._buffer = np.empty(0, dtype=np.uint8)  # the copies of the checkpoint in flight, reused by the next

    def save(self, path: Path, checkpoint: Checkpoint) -> None:
        """Copy `checkpoint`'s tensors and start writing the copy to `path` (after the write in flight, if any)."""
        self.wait()
        if not self.background:
            save_checkpoint(path, checkpoint)
            return
        copy, self._buffer = _detached(checkpoint, self._buffer)  # the last write is done: its buffer is free
        # not a daemon: an interpreter that exits after the last round still finishes the checkpoint
        self._thread = threading.Thread(target=self._write, args=(path, copy), name="manytask-checkpoint")
        self._thread.start()

    def wait(self) -> None:
        """Return once the last checkpoint saved is on disk; raise the error that stopped it, if one did."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _write(self, path: Path, checkpoint: Checkpoint) -> None:
        try:
            save_checkpoint(path, checkpoint)
        except BaseException as error:  # raised again on the loop's thread, by `wait`
            self._error = error


def _detached(checkpoint: Checkpoint, buffer: np.ndarray) -> tuple[Checkpoint, np.ndarray]:
    """`checkpoint` with every tensor a packed CPU copy that nothing else changes, and the buffer holding the copies
    (`buffer` itself where it is large enough)."""
    named = {("server", k): v for k, v in checkpoint.server.items()}
    named.update({(str(c), k): v for c, state in checkpoint.clients.items() for k, v in state.items()})
    if checkpoint.torch_rng is not None:
        named["rng", ""] = checkpoint.torch_rng
    copies, buffer = _host_copies(named, buffer)
    return Checkpoint(
        checkpoint.round, {k: copies["server", k] for k in checkpoint.server},
        {c: {k: copies[str(c), k] for k in state} for c, state in checkpoint.clients.items()},
        dict(checkpoint.extra), copies.get(("rng", "")), checkpoint.run,
    ), buffer


def _host_copies(tensors: dict[Key, Tensor], buffer: np.ndarray) -> tuple[dict[Key, Tensor], np.ndarray]:
    """Each tensor copied into one byte buffer by numpy: no aten op per tensor (a round's kernel count, which holds
    its checkpoint, then does not grow with the clients' states), and the buffer is reused from one checkpoint to
    the next (no fresh memory to fault in each round). A tensor on a device comes to the host as its copy (its
    one transfer)."""
    host = {key: packed(value.detach()) for key, value in tensors.items()}
    offsets, end = {}, 0
    for key, value in host.items():
        offsets[key] = end
        end += -(-value.numel() * value.element_size() // ALIGN) * ALIGN
    if buffer.nbytes < end:
        buffer = np.empty(end, dtype=np.uint8)
    copies = {}
    for key, value in host.items():
        size = value.numel() * value.element_size()
        target = buffer[offsets[key]:offsets[key] + size]
        np.copyto(target, value.reshape(-1).view(torch.uint8).numpy())
        copies[key] = torch.from_numpy(target).view(value.dtype).reshape(value.shape)
    return copies, buffer


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

import torch
from torch import Tensor

from manytask.engine.checkpoint import Checkpoint, save_checkpoint


class CheckpointWriter:
    """At most one checkpoint in flight; an error in writing it is raised by the next `save` or `wait`. Not
    `background` (`checkpoint_background: false`, as the strace kill campaign runs, whose kill points are counted
    per thread): `save` writes the checkpoint itself, from the tensors where they lie."""

    def __init__(self, background: bool = True) -> None:
        self.background = background
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(self, path: Path, checkpoint: Checkpoint) -> None:
        """Copy `checkpoint`'s tensors and start writing the copy to `path` (after the write in flight, if any)."""
        self.wait()
        if not self.background:
            save_checkpoint(path, checkpoint)
            return
        copy = _detached(checkpoint)
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


def _detached(checkpoint: Checkpoint) -> Checkpoint:
    """`checkpoint` with every tensor a packed CPU copy of its own, which nothing else changes."""
    return Checkpoint(
        checkpoint.round, _copies(checkpoint.server),
        {client: _copies(state) for client, state in checkpoint.clients.items()}, dict(checkpoint.extra),
        None if checkpoint.torch_rng is None else _copy(checkpoint.torch_rng), checkpoint.run,
    )


def _copies(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {name: _copy(value) for name, value in tensors.items()}


def _copy(value: Tensor) -> Tensor:
    return value.detach().to("cpu", memory_format=torch.contiguous_format, copy=True)

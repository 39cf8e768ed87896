"""Checkpoints written on a second thread while the next round trains (`engine/checkpoint_writer.py`): what is written
is the state when it was saved, a write's failure reaches the round loop, and a crash during a write resumes to the
uninterrupted numbers. Every interleaving is forced from the code (events, a failing write), never a clock."""

import json
import threading

import pytest
import torch

from manytask.config import validate
from manytask.engine import checkpoint_writer
from manytask.engine.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from manytask.engine.checkpoint_writer import CheckpointWriter
from manytask.launch import resume, run_config
from tests.conftest import small_config_dict


class SimulatedCrash(Exception):
    pass


def test_the_written_checkpoint_is_the_state_when_saved_though_the_run_changes_it_in_place(tmp_path, monkeypatch):
    release, started = threading.Event(), threading.Event()

    def held_save(path, checkpoint):
        started.set()
        release.wait()  # the loop's thread changes the state meanwhile
        save_checkpoint(path, checkpoint)

    monkeypatch.setattr(checkpoint_writer, "save_checkpoint", held_save)
    server, client = torch.arange(6.0), {"m": torch.ones(2, 3)}
    writer = CheckpointWriter()
    writer.save(tmp_path / "c", Checkpoint(3, {"w": server}, {1: client}, {"elapsed": 1.5}, torch.get_rng_state()))
    assert started.wait(timeout=60)
    server.add_(100.0)
    client["m"].mul_(-1.0)
    release.set()
    writer.wait()
    written = load_checkpoint(tmp_path / "c")
    assert written.round == 3 and written.extra == {"elapsed": 1.5}
    assert torch.equal(written.server["w"], torch.arange(6.0))
    assert torch.equal(written.clients[1]["m"], torch.ones(2, 3))


def test_copies_of_every_dtype_in_a_reused_buffer_dispatch_no_op_per_tensor(tmp_path):
    """Successive checkpoints, larger and smaller, of every stored dtype and an empty tensor, each read back as saved
    though they share one buffer; copying CPU tensors dispatches no aten op, so a round's kernel count (which holds
    its checkpoint) does not grow with the clients' states."""
    from manytask.bench.kernels import counted

    def state(seed: int, clients: int) -> Checkpoint:
        g = torch.Generator().manual_seed(seed)
        per_client = {c: {"w": torch.randn(3, 5, generator=g), "half": torch.randn(7, generator=g).bfloat16(),
                          "mask": torch.rand(4, generator=g) > 0.5, "steps": torch.tensor([seed, c]),
                          "wide": torch.randn(2, generator=g).double(), "none": torch.zeros(0, 3)}
                      for c in range(clients)}
        return Checkpoint(seed, {"w": torch.randn(9, generator=g)}, per_client, {}, torch.get_rng_state())

    writer = CheckpointWriter()
    for seed, clients in ((1, 6), (2, 2), (3, 9)):
        saved = state(seed, clients)
        counter = counted(lambda saved=saved, seed=seed: writer.save(tmp_path / f"c{seed}", saved))
        assert counter.ops == 0, counter.by_op
        writer.wait()
        back = load_checkpoint(tmp_path / f"c{seed}")
        assert back.round == seed and torch.equal(back.server["w"], saved.server["w"])
        assert torch.equal(back.torch_rng, saved.torch_rng)
        for c, tensors in saved.clients.items():
            for name, value in tensors.items():
                assert back.clients[c][name].dtype == value.dtype and torch.equal(back.clients[c][name], value)


def test_a_failed_write_is_raised_by_the_next_save_and_by_wait(tmp_path, monkeypatch):
    def failing(path, checkpoint):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_writer, "save_checkpoint", failing)
    writer = CheckpointWriter()
    writer.save(tmp_path / "c", Checkpoint(1, {"w": torch.zeros(2)}, {}))
    with pytest.raises(OSError, match="No space left"):
        writer.save(tmp_path / "c", Checkpoint(2, {"w": torch.zeros(2)}, {}))
    writer.save(tmp_path / "c", Checkpoint(3, {"w": torch.zeros(2)}, {}))
    with pytest.raises(OSError, match="No space left"):
        writer.wait()
    writer.wait()  # raised once


CRASHED = small_config_dict(method=["fedavg", "local"], rounds=4, participation=0.5, dropout=0.2)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("full") / "run"
    return run_config(validate(CRASHED), out), out


@pytest.mark.parametrize("background", [True, False])
def test_a_crash_while_a_checkpoint_is_written_resumes_to_the_uninterrupted_numbers(tmp_path, monkeypatch,
                                                                                    uninterrupted, background):
    """Round 2's write dies after leaving a torn temporary; in the background the loop learns of it when it saves
    round 3, whose metrics row is already written. The directory then holds round 1's checkpoint and rows of rounds
    1–3 (1–2 when the round waits for its write); the resumed run drops the later rows and ends with the numbers of
    a run never stopped."""
    full, full_dir = uninterrupted

    def dying_save(path, checkpoint):
        if checkpoint.round == 2:
            path.with_name(path.name + ".tmp").write_bytes(b"torn")
            raise SimulatedCrash
        save_checkpoint(path, checkpoint)

    monkeypatch.setattr(checkpoint_writer, "save_checkpoint", dying_save)
    with pytest.raises(SimulatedCrash):
        run_config(validate({**CRASHED, "checkpoint_background": background}), tmp_path / "cut")
    monkeypatch.undo()
    cut = tmp_path / "cut" / "fedavg"
    assert load_checkpoint(cut / "checkpoint.safetensors").round == 1
    rows = [json.loads(r)["round"] for r in (cut / "metrics.jsonl").read_text().splitlines()]
    assert rows == ([1, 2, 3] if background else [1, 2])
    resumed = resume(tmp_path / "cut")
    for label in ("fedavg", "local"):  # the server's state, and the clients' own models
        assert resumed[label]["tasks"] == full[label]["tasks"], label
        assert _numbers(tmp_path / "cut" / label) == _numbers(full_dir / label), label
    assert not (cut / "checkpoint.safetensors.tmp").exists()


def _numbers(run_dir):
    """The metric rows without what a clock measured."""
    timed = ("wall_seconds", "client_seconds", "energy_joules")
    return [{k: v for k, v in json.loads(line).items() if k not in timed}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

"""Checkpoints carry a digest of their tensors and the identity of their run (issue 17): an unreadable, corrupt,
out-of-range or foreign checkpoint stops a resume with one sentence that names the file and what to do, and leaves
the run directory as it was; an intact one resumes to the uninterrupted numbers."""

import json
import random
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from typer.testing import CliRunner

from manytask.cli import app
from manytask.config import validate
from manytask.engine.checkpoint import CHECKSUM_KEY, DIGEST_KEY, META_KEY, load_checkpoint, save_checkpoint
from manytask.errors import ManytaskError
from manytask.input_limits import shown_path
from manytask.launch import resume, run_config
from tests.conftest import small_config_dict
from tests.simulated_cuda import a_gpu

CONFIG = small_config_dict(rounds=3)
TIMED = ("wall_seconds", "client_seconds", "energy_joules")
DELETE = "; delete it to restart this run from round 1, or restore it from a backup."
FOREIGN = "; resume the run it came from, or delete it to restart this run from round 1."


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("full") / "run"
    return run_config(validate(CONFIG), out), out


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A run stopped (checkpointed) after round 1 of 3, to copy from."""
    out = tmp_path_factory.mktemp("stopped") / "run"
    assert run_config(validate(CONFIG), out, stop_after=1) is None
    return out


@pytest.fixture
def run(tmp_path, stopped):
    out = tmp_path / "run"
    shutil.copytree(stopped, out)
    return out


def _rows(path):
    return [{k: v for k, v in json.loads(line).items() if k not in TIMED}
            for line in (path / "metrics.jsonl").read_text().splitlines()]


def _snapshot(out):
    return {str(p.relative_to(out)): p.read_bytes() if p.is_file() else None for p in sorted(out.rglob("*"))}


def _foreign(tmp_path, **overrides):
    """The checkpoint of another run, stopped after round 1."""
    other = tmp_path / "other"
    run_config(validate(small_config_dict(**{"rounds": 3, **overrides})), other, stop_after=1)
    return (other / "checkpoint.safetensors").read_bytes()


def _edited(path, edit):
    checkpoint = load_checkpoint(path)
    edit(checkpoint)
    save_checkpoint(path, checkpoint)  # a well-formed file with a matching digest: only the content is wrong


def _nan(checkpoint):
    name = next(k for k, v in checkpoint.server.items() if v.is_floating_point())
    checkpoint.server[name].view(-1)[0] = float("nan")


def _set_round(value):
    return lambda checkpoint: setattr(checkpoint, "round", value)


def _flip_data_byte(path):
    data = bytearray(path.read_bytes())
    header = int.from_bytes(data[:8], "little")
    start = 8 + header  # the tensor data region
    data[start + (len(data) - start) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def _old_format(path, **meta_changes):
    """Rewrite the checkpoint as one from before digests and run identities, with its metadata changed."""
    with safe_open(str(path), framework="pt") as handle:
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
        meta = json.loads(handle.metadata()[META_KEY])
    del meta["run"]
    meta.update(meta_changes)
    save_file(tensors, str(path), metadata={META_KEY: json.dumps(meta)})


def _not_json(path):
    with safe_open(str(path), framework="pt") as handle:
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
    save_file(tensors, str(path), metadata={META_KEY: '{"round": 1, "clients": ['})


DAMAGES = {
    "empty": (lambda p, t: p.write_bytes(b""), r"cannot be read \(it is empty\)" + DELETE),
    "truncated": (lambda p, t: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
                  r"cannot be read \(it is truncated or not a safetensors file: [^()]+\)" + DELETE),
    "garbage": (lambda p, t: p.write_bytes(random.Random(0).randbytes(5000)),
                r"cannot be read \(it is truncated or not a safetensors file: header too large\)" + DELETE),
    "flipped data byte": (lambda p, t: _flip_data_byte(p), r"is corrupt \(its tensors do not match their digest\)"
                          + DELETE),
    "flipped metadata": (lambda p, t: p.write_bytes(p.read_bytes().replace(b'\\"round\\": 1', b'\\"round\\": 2')),
                         r"is corrupt \(its tensors do not match their digest\)" + DELETE),
    "NaN server weight": (lambda p, t: _edited(p, _nan),
                          r"is corrupt \(server tensor '[^']+' holds NaN or infinite values\)" + DELETE),
    "round 99": (lambda p, t: _edited(p, _set_round(99)),
                 r"is invalid \(it claims 99 completed rounds of this run's 3\)" + DELETE),
    "round -1": (lambda p, t: _edited(p, _set_round(-1)), r"is invalid \(it claims -1 completed rounds\)" + DELETE),
    "other method": (lambda p, t: p.write_bytes(_foreign(t, method="fedprox")),
                     r"belongs to another run \(method fedprox, 3 rounds, config \w{12}; this run is method fedavg, "
                     r"3 rounds, config \w{12}\)" + FOREIGN),
    "other seed": (lambda p, t: p.write_bytes(_foreign(t, seed=8)),
                   r"belongs to another run \(method fedavg, 3 rounds, config \w{12}; this run is method fedavg, "
                   r"3 rounds, config \w{12}\)" + FOREIGN),
    "old, round a string": (lambda p, t: _old_format(p, round="1"), r"is corrupt \(its round is not a whole number\)"
                            + DELETE),
    "old, clients not a list": (lambda p, t: _old_format(p, clients=3),
                                r"is corrupt \(its client list is not a list of distinct client numbers\)" + DELETE),
    "old, metadata not JSON": (lambda p, t: _not_json(p), r"is corrupt \(its metadata is not valid JSON\)" + DELETE),
    "old, round 99": (lambda p, t: _old_format(p, round=99),
                      r"is invalid \(it claims 99 completed rounds of this run's 3\)" + DELETE),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_or_foreign_checkpoint_is_refused_in_one_sentence_and_nothing_changes(run, tmp_path, damage):
    checkpoint = run / "checkpoint.safetensors"
    make, expected = DAMAGES[damage]
    make(checkpoint, tmp_path)
    before = _snapshot(run)
    with pytest.raises(ManytaskError) as caught:
        resume(run)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400, message
    assert message.startswith(f"checkpoint '{shown_path(checkpoint)}' "), message
    assert caught.match(expected + "$")
    assert _snapshot(run) == before


def test_a_state_the_method_cannot_take_is_refused_in_one_sentence(tmp_path):
    out = tmp_path / "local"
    run_config(validate(small_config_dict(rounds=3, method="local")), out, stop_after=1)
    checkpoint = out / "checkpoint.safetensors"
    _edited(checkpoint, lambda c: c.server.update(stray=torch.zeros(2)))  # intact digest, identity of this run
    before = _snapshot(out)
    with pytest.raises(ManytaskError, match=r"is corrupt \(its state does not fit method local: [^()]+\)" + DELETE):
        resume(out)
    assert _snapshot(out) == before


def test_no_single_flipped_byte_goes_unnoticed(run, tmp_path):
    """Every byte of the header (tensor table and metadata) and every 16th byte of the tensor data, flipped in turn:
    each one is refused as a ManytaskError, never loaded, never a library exception."""
    intact = (run / "checkpoint.safetensors").read_bytes()
    identity = load_checkpoint(run / "checkpoint.safetensors").run
    data_start = 8 + int.from_bytes(intact[:8], "little")
    path = tmp_path / "flipped.safetensors"
    for position in [*range(data_start), *range(data_start, len(intact), 16)]:
        flipped = bytearray(intact)
        flipped[position] ^= 0x01
        path.write_bytes(bytes(flipped))
        with pytest.raises(ManytaskError):
            load_checkpoint(path, identity)
            pytest.fail(f"byte {position} flipped went unnoticed")


def test_an_intact_checkpoint_resumes_to_the_uninterrupted_numbers(run, uninterrupted):
    summaries, full = uninterrupted
    with safe_open(str(run / "checkpoint.safetensors"), framework="pt") as handle:
        meta = json.loads(handle.metadata()[META_KEY])
        assert len(handle.metadata()[CHECKSUM_KEY]) == 64 and DIGEST_KEY not in handle.metadata()
    assert meta["run"]["method"] == "fedavg" and meta["run"]["total_rounds"] == 3
    resumed = resume(run)
    assert resumed["fedavg"]["tasks"] == summaries["fedavg"]["tasks"]
    assert _rows(run) == _rows(full)


def test_an_old_checkpoint_without_digest_or_identity_still_resumes(run, uninterrupted):
    _old_format(run / "checkpoint.safetensors")
    assert load_checkpoint(run / "checkpoint.safetensors").run is None
    resume(run)
    assert _rows(run) == _rows(uninterrupted[1])


def _sha256_format(path):
    """Rewrite the checkpoint as the format before checksums wrote it: its SHA-256 digest over the bytes themselves."""
    from manytask.engine.checkpoint import _digest, write_safetensors

    with safe_open(str(path), framework="pt") as handle:
        tensors = {k: handle.get_tensor(k).clone() for k in handle.keys()}  # noqa: SIM118 (not mapped: rewritten)
        text = handle.metadata()[META_KEY]
    write_safetensors(path, tensors, {META_KEY: text, DIGEST_KEY: _digest(tensors, text)})


def test_a_checkpoint_with_the_earlier_sha256_digest_is_verified_by_it_and_resumes(run, uninterrupted):
    path = run / "checkpoint.safetensors"
    _sha256_format(path)
    assert load_checkpoint(path).run is not None
    intact = path.read_bytes()
    _flip_data_byte(path)
    with pytest.raises(ManytaskError, match="do not match their digest"):
        load_checkpoint(path)
    path.write_bytes(intact)
    resume(run)
    assert _rows(run) == _rows(uninterrupted[1])


def test_a_changed_placement_setting_does_not_make_a_checkpoint_foreign(run, uninterrupted):
    """threads, workers, execution, vector_clients and device say where clients train, not what they compute."""
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("threads: 1", "threads: 2"))
    resume(run)
    assert _rows(run) == _rows(uninterrupted[1])


def test_the_cli_refuses_a_garbled_checkpoint_in_one_line_with_exit_code_2(run):
    checkpoint = run / "checkpoint.safetensors"
    checkpoint.write_bytes(checkpoint.read_bytes()[:100])
    before = _snapshot(run)
    result = CliRunner().invoke(app, ["run", "--resume", str(run), "--quiet"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: checkpoint '"), result.stderr
    assert shown_path(checkpoint) in lines[0] and lines[0].endswith(DELETE)
    assert _snapshot(run) == before


def test_a_checkpoint_written_on_the_gpu_is_hashed_like_one_written_on_the_cpu(tmp_path):
    """On the GPU where there is one, else on the simulated one (`simulated_cuda.py`)."""
    from manytask.engine.checkpoint import Checkpoint

    state = {"w": torch.randn(3, 4), "b": torch.arange(5)}
    save_checkpoint(tmp_path / "cpu", Checkpoint(1, state, {}))
    with a_gpu():
        save_checkpoint(tmp_path / "gpu", Checkpoint(1, {k: v.cuda() for k, v in state.items()}, {}))
    assert (tmp_path / "cpu").read_bytes() == (tmp_path / "gpu").read_bytes()


def test_the_same_checkpoint_always_gives_the_same_bytes(tmp_path):
    # the writer's header is compact JSON with sorted keys (safetensors' own writer puts the metadata in a hash map's
    # order, different from one save to the next)
    from manytask.engine.checkpoint import Checkpoint

    state = {"w": torch.randn(3, 4, generator=torch.Generator().manual_seed(0)), "b": torch.arange(5)}
    saved = set()
    for attempt in range(8):
        save_checkpoint(tmp_path / f"c{attempt}", Checkpoint(1, state, {}, extra={"note": "é"}))
        saved.add((tmp_path / f"c{attempt}").read_bytes())
    assert len(saved) == 1
    header = (tmp_path / "c0").read_bytes()[8:]
    assert header.index(f'"{META_KEY}"'.encode()) < header.index(f'"{CHECKSUM_KEY}"'.encode())
    assert load_checkpoint(tmp_path / "c0").extra == {"note": "é"}


def test_states_that_are_rows_of_one_stack_are_written_from_where_they_lie(tmp_path):
    """A batched round leaves client states as views of stacked tensors: they are written without one aten copy
    (safetensors' own writer refuses tensors sharing memory), read back equal, with every dtype a checkpoint holds;
    only a strided tensor is packed."""
    from manytask.bench.kernels import counted
    from manytask.engine.checkpoint import Checkpoint

    stack = torch.randn(4, 3, 2, generator=torch.Generator().manual_seed(0))
    clients = {c: {"w": stack[c], "n": torch.tensor(c), "h": stack[c].to(torch.bfloat16), "on": torch.tensor(c > 1)}
               for c in range(4)}
    strided = torch.arange(12.0).view(3, 4).t()
    counter = counted(lambda: save_checkpoint(tmp_path / "c", Checkpoint(2, {"s": strided}, clients)))
    assert counter.by_op == {"clone": 1}, counter.by_op  # the strided tensor's packing, and nothing else
    loaded = load_checkpoint(tmp_path / "c")
    assert torch.equal(loaded.server["s"], strided)
    for c, state in clients.items():
        assert set(loaded.clients[c]) == set(state)
        for key, value in state.items():
            assert loaded.clients[c][key].dtype == value.dtype and torch.equal(loaded.clients[c][key], value)

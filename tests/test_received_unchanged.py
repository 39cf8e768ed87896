"""What a client or a server receives is only read: `decode` hands out read-only views into the received bytes
instead of copies (messages.py), so a method that wrote into what it was sent would change those bytes; in-process
a server reads each client's reply message itself, whose arrays may be views of the client's tensors, so neither
the server nor the client may change them afterwards. Every
registered method that sends messages, and every plug-in over FedAvg, runs four rounds here with every decoded
message's bytes checked against their digest after the run."""

import hashlib
from collections.abc import Callable

import pytest

from manytask.config import validate
from manytask.launch import run_config
from manytask.messages import Message, as_message, encode, encoded_size
from manytask.methods.registry import METHODS, PLUGINS
from tests.conftest import small_config_dict

TALOS = {"calibration_rounds": 1, "calibration_examples": 20, "sparsity": 0.8}
PARAMS = {"fixed-split": {"partition": [["digit", "parity"], ["rotated"]]},
          **dict.fromkeys(["talos", "talos-partition", "talos-oneshot", "centralized-talos"], TALOS)}
ONE_TASK_EACH = {"benchmark": {"name": "digits-tasks", "tasks": ["digit", "rotated"]},  # as many outputs each
                 "federation": {"num_clients": 4, "tasks": {"kind": "one-per-client"}, "samples": {"kind": "iid"}}}
OVERRIDES = {
    **dict.fromkeys(["fedu", "pfedme", "sfmtl-graph"], ONE_TASK_EACH),
    "fedbn": {"model": {"backbone": "cnn", "channels": [4, 8], "norm": "batch"}},
    **{name: {  # affinities need tasks that label the same images
        "benchmark": {"name": "scenes", "tasks": "sdn", "size": 16, "train_per_task": 48, "test_size": 8,
                      "buildings": 4, "styles": 2},
        "federation": {"num_clients": 4, "tasks": {"kind": "all"}, "samples": {"kind": "natural"}},
        "model": {"backbone": "cnn", "channels": [4, 8], "norm": "batch", "decoder": {"width": 4}},
        "train": {"lr": 0.05, "batch_size": 8, "local_steps": 2}} for name in ("mas", "tag")},
}
SILENT = {"centralized", "individual", "local"}  # they train without messages: nothing is received


def _digest(message: Message) -> str:
    """SHA-256 over a message's arrays' bytes, in order."""
    sha = hashlib.sha256()
    for array in message.arrays.values():
        sha.update(array.tobytes())
    return sha.hexdigest()


@pytest.fixture
def decoded(monkeypatch) -> list[tuple[Callable[[], str], str]]:
    """Every message the local engine hands a client (bytes, decoded) or the server (a client's reply message
    itself, in-process): a way to digest it again, and its digest when received."""
    seen: list[tuple[Callable[[], str], str]] = []

    def watching(data):
        if type(data) is bytes:
            seen.append((lambda: hashlib.sha256(data).hexdigest(), hashlib.sha256(data).hexdigest()))
        return as_message(data)

    def watching_reply(sent):
        if isinstance(sent, Message):  # the client's own arrays: the server only reads them, nobody changes them
            seen.append((lambda: _digest(sent), _digest(sent)))
            # counted without writing it out: exactly what the serializer writes (issue 34)
            assert encoded_size(sent) == len(encode(sent))
        return as_message(sent)

    monkeypatch.setattr("manytask.engine.client_runner.as_message", watching)
    monkeypatch.setattr("manytask.engine.screening.as_message", watching_reply)
    return seen


def _run(tmp_path, method) -> None:
    name = method if isinstance(method, str) else method["name"]
    if isinstance(method, str) and name in PARAMS:
        method = {"name": name, **PARAMS[name]}
    # TaLoS: head-only, calibration and fine-tuning rounds; MAS: all-in-one, affinity and group rounds
    config = small_config_dict(method=method, rounds=4, eval_every=4, reference=None, **OVERRIDES.get(name, {}))
    run_config(validate(config), tmp_path / "run")


def _unchanged(decoded) -> None:
    assert len(decoded) >= 8, len(decoded)  # payloads and replies of four rounds
    changed = [i for i, (again, digest) in enumerate(decoded) if again() != digest]
    assert not changed, f"{len(changed)} of {len(decoded)} received messages were written into"


@pytest.mark.parametrize("method", sorted(set(METHODS.names()) - SILENT))
def test_no_method_writes_into_what_it_received(tmp_path, decoded, method):
    _run(tmp_path, method)
    _unchanged(decoded)


@pytest.mark.parametrize("plugin", sorted(PLUGINS.names()))
def test_no_plugin_writes_into_what_it_received(tmp_path, decoded, plugin):
    _run(tmp_path, {"name": "fedavg", "plugin": {"name": plugin}})
    _unchanged(decoded)


@pytest.mark.parametrize("rho", [0.05, 0.6])
def test_both_sparse_codecs_are_counted_as_the_serializer_writes_them(tmp_path, decoded, rho):
    """DEA's uploads at a small ρ (flat indices for the large arrays) and a large one (bitmaps): their in-process
    byte counts are what `encode` writes (checked on every reply)."""
    codecs = set()

    def noting(sent):
        codecs.update(k.rsplit("/", 1)[1] for k in as_message(sent).arrays if k.startswith("sparse/"))
        return received(sent)

    import manytask.engine.screening as screening

    received = screening.as_message
    screening.as_message = noting
    try:
        _run(tmp_path, {"name": "fedavg", "plugin": {"name": "dea", "rho": rho}})
    finally:
        screening.as_message = received
    # per array, the cheaper: a large array's few kept entries as indices; at ρ 0.6 a bitmap always
    assert ("index" in codecs) if rho < 0.1 else codecs == {"mask", "values"}, codecs
    _unchanged(decoded)

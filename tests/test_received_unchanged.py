"""What a client or a server receives is only read: `decode` hands out read-only views into the received bytes
instead of copies (messages.py), so a method that wrote into what it was sent would change those bytes. Every
registered method that sends messages, and every plug-in over FedAvg, runs four rounds here with every decoded
message's bytes checked against their digest after the run."""

import hashlib

import pytest

from manytask.config import validate
from manytask.messages import decode
from manytask.methods.registry import METHODS, PLUGINS
from manytask.run import run_config
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


@pytest.fixture
def decoded(monkeypatch) -> list[tuple[bytes, str]]:
    """Every (bytes, its digest when decoded) the local engine decodes, on either side."""
    seen: list[tuple[bytes, str]] = []

    def watching(data):
        if type(data) is bytes:
            seen.append((data, hashlib.sha256(data).hexdigest()))
        return decode(data)

    for module in ("manytask.engine.client_runner", "manytask.engine.screening"):
        monkeypatch.setattr(f"{module}.decode", watching)
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
    changed = [i for i, (data, digest) in enumerate(decoded) if hashlib.sha256(data).hexdigest() != digest]
    assert not changed, f"{len(changed)} of {len(decoded)} received messages were written into"


@pytest.mark.parametrize("method", sorted(set(METHODS.names()) - SILENT))
def test_no_method_writes_into_what_it_received(tmp_path, decoded, method):
    _run(tmp_path, method)
    _unchanged(decoded)


@pytest.mark.parametrize("plugin", sorted(PLUGINS.names()))
def test_no_plugin_writes_into_what_it_received(tmp_path, decoded, plugin):
    _run(tmp_path, {"name": "fedavg", "plugin": {"name": plugin}})
    _unchanged(decoded)

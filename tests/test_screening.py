"""Screening replies (issue 17): a reply that does not decode or breaks its rules is a failed client with its reason,
never a crash, and the server ends exactly where it would have had that client dropped out."""

from collections.abc import Callable

import numpy as np
import pytest
import torch

from manytask.config import validate
from manytask.engine.client_runner import ClientRunner
from manytask.engine.local import InProcessTransport
from manytask.engine.loop import FitOutcome, RoundLoop
from manytask.engine.screening import DIVERGED, _all_finite, common_problem, screen
from manytask.experiment import Experiment
from manytask.federation.federation import Federation
from manytask.messages import Message, as_bytes, decode, encode
from manytask.rundir import RunDir
from tests.conftest import small_config_dict
from tests.simulated_cuda import simulated_cuda

FEDERATION = Federation([{"a": np.arange(10), "b": np.arange(4)}, {"b": np.arange(7)}])


def message(scalars, arrays=None):
    return Message(arrays or {"w": np.zeros(3, np.float32)}, scalars)


@pytest.mark.parametrize("scalars, reason", [
    ({"n/a": 10, "loss/a": 0.3, "n/b": 4}, None),
    ({"n/a": 10.0}, None),  # a whole float is a count
    ({"n/a": 11}, "claims 11 samples of task 'a', where client 0 holds 10"),
    ({"n/a": 1e12}, "claims 1000000000000.0 samples"),
    ({"n/a": 0}, "claims 0 samples"),
    ({"n/a": 2.5}, "claims 2.5 samples"),
    ({"n/a": True}, "claims True samples"),
    ({"n/a": "10"}, "scalar 'n/a' is text"),
    ({"n/c": 1}, "task 'c', which client 0 does not hold"),
    ({"loss/a": 0.3}, "a loss for task 'a' without its sample count"),
    ({"n/a": 10, "loss/a": float("nan")}, DIVERGED),
    ({"n/a": 10, "tau": float("inf")}, DIVERGED),
    ({"n/a": 10, "loss/a": "0.3"}, "scalar 'loss/a' is text"),
    ({"n/a": 10, "affinity/a/b": "high"}, "scalar 'affinity/a/b' is text"),
])
def test_what_every_reply_must_satisfy(scalars, reason):
    problem = common_problem(0, message(scalars), FEDERATION)
    assert problem is None if reason is None else reason in problem


def test_non_finite_arrays_are_divergence():
    assert common_problem(1, message({"n/b": 7}, {"w": np.float32([1, np.inf])}), FEDERATION) == DIVERGED


@pytest.mark.parametrize("array, finite", [
    (np.float32([1e20, -1e20, 3]), True),  # Σ a² overflows: the entry-wise check decides
    (np.float64([1e200, 1e200]), True),
    (np.float32([[0, 1], [2, np.nan]]), False),
    (np.float32([-np.inf, 1]), False),
    (np.float64([np.inf, -np.inf]), False),
    (np.float16([60000, 60000]), True),  # no BLAS dot for half precision
    (np.float16([1, np.inf]), False),
    (np.zeros(0, np.float32), True),
    (np.float32([7]).astype(">f4"), True),
    (np.float32([np.nan]).astype(">f4"), False),
])
def test_the_finite_check_is_exactly_numpys(array, finite):
    received = decode(encode(Message({"a": array}))).arrays["a"]  # as `screen` sees it, wherever it lies
    with np.errstate(over="ignore"):  # as `screen` calls it
        assert _all_finite(received) is finite is bool(np.isfinite(array).all())


class Poisoning:
    """The local transport, with one client's reply in round `poisoned` (0-based) replaced by `poison(reply
    bytes)`, or dropped when `poison` is None."""

    def __init__(self, experiment: Experiment, client: int, poisoned: int,
                 poison: Callable[[bytes], bytes] | None) -> None:
        self.inner = InProcessTransport(ClientRunner(experiment))
        self.client, self.poisoned, self.poison = client, poisoned, poison

    def fit(self, round_index, payloads, simulated_drops) -> FitOutcome:
        outcome = self.inner.fit(round_index, payloads, simulated_drops)
        if round_index == self.poisoned and self.client in outcome.replies:
            if self.poison is None:
                del outcome.replies[self.client]
                outcome.failures[self.client] = "dropped"
            else:
                outcome.replies[self.client] = self.poison(as_bytes(outcome.replies[self.client]))
        return outcome

    def __getattr__(self, name):
        return getattr(self.inner, name)


def rewritten(change: Callable[[Message], None]) -> Callable[[bytes], bytes]:
    def poison(data: bytes) -> bytes:
        reply = decode(data)
        change(reply)
        return encode(reply)
    return poison


def _first_array(reply: Message) -> str:
    return next(iter(reply.arrays))


POISONS = {
    "garbage": lambda data: b"\x00" * 40,
    "truncated": lambda data: data[: len(data) // 2],
    "not a message": lambda data: b"MTK1" + data[8:],
    "wrong shape": rewritten(lambda r: r.arrays.update({(k := _first_array(r)): r.arrays[k].reshape(-1)[:-1]})),
    "wrong dtype": rewritten(lambda r: r.arrays.update({(k := _first_array(r)): r.arrays[k].astype(np.float64)})),
    "extra array": rewritten(lambda r: r.arrays.update({"backbone.extra": np.zeros((1000, 1000), np.float32)})),
    "missing size": rewritten(lambda r: r.scalars.pop(next(k for k in r.scalars if k.startswith("n/")))),
    "no scalars": rewritten(lambda r: r.scalars.clear()),
    "inflated size": rewritten(lambda r: r.scalars.update({next(k for k in r.scalars if k.startswith("n/")): 1e12})),
    "non-finite": rewritten(lambda r: _not_finite(r)),
}


def _not_finite(reply: Message) -> None:
    """NaN in the first float array; in the first float scalar when the reply has none (a mask)."""
    floats = [k for k, a in reply.arrays.items() if a.dtype.kind == "f"]
    if floats:
        reply.arrays[floats[0]] = np.full_like(reply.arrays[floats[0]], np.nan)  # decoded arrays are read-only
    else:
        reply.scalars[next(k for k, v in reply.scalars.items() if isinstance(v, float))] = float("nan")


def _run(tmp_path, name, method, rounds, poisoned, poison, **overrides):
    config = validate(small_config_dict(method=method, rounds=rounds, eval_every=rounds, **overrides))
    experiment = Experiment.build(config)
    run_dir = RunDir(tmp_path / name)
    run_dir.start("", experiment.federation.to_json())
    loop = RoundLoop(experiment, run_dir, Poisoning(experiment, 1, poisoned, poison))
    loop.run()
    return loop.server.state_dict(), run_dir.read_metrics()


DEA = {"name": "fedavg", "plugin": {"name": "dea", "rho": 0.5}}
PARTITION = {"name": "talos-partition", "calibration_rounds": 3, "calibration_examples": 40, "sparsity": 0.8,
             "head_rounds": 1}  # rounds: head-only, calibration (the masks travel), sparse, sparse


@pytest.mark.parametrize(("method", "rounds", "poisoned"), [
    ("fedavg", 2, 0), ("fedprox", 2, 0), (DEA, 2, 0), (PARTITION, 4, 1), (PARTITION, 4, 2),
], ids=["fedavg", "fedprox", "fedavg+dea", "talos-partition-calibration", "talos-partition-sparse"])
def test_a_rejected_reply_leaves_the_model_exactly_as_a_dropout(tmp_path, method, rounds, poisoned):
    dropped_state, dropped_rows = _run(tmp_path, "dropped", method, rounds, poisoned, None)
    for name, poison in POISONS.items():
        state, rows = _run(tmp_path, name.replace(" ", "-"), method, rounds, poisoned, poison)
        failures = rows[poisoned]["failures"]
        assert 1 in rows[poisoned]["dropped"] and failures["1"] != "dropped", (name, failures)
        assert state.keys() == dropped_state.keys(), name
        assert all(torch.equal(state[k], dropped_state[k]) for k in state), name
        assert rows[-1]["eval"] == dropped_rows[-1]["eval"], name


PERSONAL = {  # one task per client, as SFMTL-Graph and FedU need
    "benchmark": {"name": "rotated-masked-digits", "num_clients": 4, "patch_prob": 0.25},
    "federation": {"num_clients": 4, "tasks": {"kind": "one-per-client"}, "samples": {"kind": "iid"}},
}


@pytest.mark.parametrize(("method", "overrides"), [
    ("matu", {}), ({"name": "matu", "unify": False}, {}), ("matfl", {}), ("sfmtl-graph", PERSONAL),
    ("fedu", PERSONAL),
], ids=["matu", "matu-ununified", "matfl", "sfmtl-graph", "fedu"])
def test_every_method_refuses_bad_replies_as_dropouts(tmp_path, method, overrides):
    """The methods that are not hosts declare their own reply rules; the same ten poisons, the same outcome."""
    dropped_state, dropped_rows = _run(tmp_path, "dropped", method, 2, 0, None, **overrides)
    assert all(row["failures"] == {} for row in _run(tmp_path, "honest", method, 2, 0, lambda d: d, **overrides)[1])
    for name, poison in POISONS.items():
        state, rows = _run(tmp_path, name.replace(" ", "-"), method, 2, 0, poison, **overrides)
        assert list(rows[0]["failures"]) == ["1"] and rows[1]["failures"] == {}, (name, rows[0]["failures"])
        assert state.keys() == dropped_state.keys(), name
        assert all(torch.equal(state[k], dropped_state[k]) for k in state), name
        assert rows[-1]["eval"] == dropped_rows[-1]["eval"], name


def test_screen_keeps_empty_replies_and_names_the_reason_of_each_rejected_one():
    experiment = Experiment.build(validate(small_config_dict()))
    server = experiment.server_program()
    server.configure_fit(0, [0, 1, 2])
    good = encode(Message({}, {"n/" + t: experiment.federation.size(2, t) for t in experiment.federation.tasks_of(2)}))
    accepted, rejected = screen({0: None, 1: b"junk", 2: good}, server, experiment.federation)
    assert list(accepted) == [0, 2] and accepted[0] is None
    assert rejected == {1: "reply does not decode: not a manytask message (bad magic bytes)"}


def test_replies_on_the_device_are_screened_there_with_one_read_for_the_round():
    server = Experiment.build(validate(small_config_dict(federation={"num_clients": 2, "tasks": {"kind": "all"},
                                                                     "samples": {"kind": "iid"}}))).server_program()
    federation = Federation([{"a": np.arange(10)}, {"a": np.arange(10)}, {"a": np.arange(10)}])
    with simulated_cuda() as sim:
        replies = {c: Message({"w": torch.tensor([1.0, value]).cuda()}, {"n/a": 10}) for c, value in
                   enumerate([2.0, float("nan"), float("inf")])}
        reads = sim.host_reads
        accepted, rejected = screen(replies, _Accepting(server), federation)
        assert sim.host_reads == reads + 1
    assert list(accepted) == [0] and rejected == {1: DIVERGED, 2: DIVERGED}


class _Accepting:
    """A server with no checks of its own."""

    def __init__(self, server) -> None:
        self.server = server

    def reply_problem(self, client, reply):
        return None

    def round_problems(self, replies):
        return {}

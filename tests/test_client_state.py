"""Client state is declared once per program (`state_schema`): the engine refuses a key no part declares, when a
call starts (a restored state) and when it ends (a program's own write), and a checkpoint's states at restore."""

import pytest
import torch

from manytask.config import validate
from manytask.engine.client_runner import ClientRunner
from manytask.engine.local import InProcessTransport
from manytask.experiment import Experiment
from manytask.messages import encode
from manytask.methods.client_state import StatePart, StateSchema, UnknownState
from manytask.methods.hosts.feddyn import GRADIENT_PREFIX
from manytask.methods.hosts.moon import PREVIOUS
from tests.conftest import small_config_dict


def test_a_schema_holds_its_parts_names_at_their_prefixes_and_nothing_else():
    schema = StateSchema("P", {"model": StatePart.of(["w", "b"], ["", "t1/"]), "any": StatePart(("log/",))})
    schema.check({"w": torch.zeros(1), "t1/b": torch.zeros(1), "log/anything": torch.zeros(1)})
    for key in ("v", "t2/w", "t1/w/", "lo/x"):
        with pytest.raises(UnknownState, match=f"unknown client state '{key}' for P, which keeps model, any"):
            schema.check({key: torch.zeros(1)})
    with pytest.raises(UnknownState, match="which keeps no client state"):
        StateSchema("Q").check({"w": torch.zeros(1)})


def _runner(method):
    return ClientRunner(Experiment.build(validate(small_config_dict(method=method, execution="sequential"))))


@pytest.mark.parametrize(("method", "kept"), [
    ({"name": "feddyn"}, [GRADIENT_PREFIX + "backbone.layers.1.weight"]),
    ({"name": "feddyn", "per_task": True}, [f"digit/{GRADIENT_PREFIX}backbone.layers.1.weight"]),
    ({"name": "moon", "projection_dim": 8}, [PREVIOUS + "backbone.layers.1.weight", PREVIOUS + "projection.0.bias"]),
    ({"name": "fedper"}, ["heads.digit.weight"]),
])
def test_each_hosts_objective_state_is_declared_and_a_misspelt_key_is_refused(method, kept):
    runner = _runner(method)
    runner.check_states({0: dict.fromkeys(kept, torch.zeros(1))})
    for key in kept:
        for wrong in (key[:-1], "x" + key):  # a name, a prefix misspelt
            with pytest.raises(UnknownState, match="unknown client state"):
                runner.check_states({0: {wrong: torch.zeros(1)}})


def test_the_runner_refuses_an_unknown_state_when_a_call_starts_and_a_checkpoints_at_restore():
    runner = _runner({"name": "fedavg"})
    payload = encode(runner.exp.server_program().configure_fit(0, [0])[0])
    with pytest.raises(UnknownState, match="FedAvgClient, which keeps local parameters"):
        runner.fit(0, 0, payload, {f"{GRADIENT_PREFIX}backbone.layers.1.weight": torch.zeros(1)})
    state: dict = {}
    runner.fit(0, 0, payload, state)
    assert state == {}  # FedAvg keeps nothing
    with pytest.raises(UnknownState, match="'typo'"):
        InProcessTransport(runner).restore_client_states({3: {"typo": torch.zeros(1)}})


def test_a_programs_undeclared_write_is_refused_when_its_call_ends():
    runner = _runner({"name": "fedavg"})
    payload = encode(runner.exp.server_program().configure_fit(0, [0])[0])
    original = runner.program.fit

    def misspelt(ctx, received):
        reply = original(ctx, received)
        ctx.state["feddyn_gg/backbone.layers.1.weight"] = torch.zeros(1)
        return reply

    runner.program.fit = misspelt
    with pytest.raises(UnknownState, match="feddyn_gg"):
        runner.fit(0, 0, payload, {})

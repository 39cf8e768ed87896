"""The phase helper by hand, a phased method that resumes exactly, and servers that choose their participants."""

import json

import pytest

from manytask.client.trainer import TrainConfig
from manytask.config import validate
from manytask.errors import ManytaskError
from manytask.launch import resume, run_config
from manytask.methods.base import MethodDef
from manytask.methods.common.phases import Phase, Phases
from manytask.methods.common.updates import Update
from manytask.methods.hosts.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from manytask.methods.registry import HOST, METHODS, register_method
from manytask.models.multitask import task_of_key
from tests.conftest import small_config_dict


def test_fixed_phases_map_rounds_to_phase_local_rounds():
    phases = Phases([Phase("head-only", 2), Phase("calibration", 1), Phase("sparse")], total_rounds=10)
    steps = [phases.at(r) for r in range(10)]
    assert [s.name for s in steps] == ["head-only"] * 2 + ["calibration"] + ["sparse"] * 7
    assert [s.local_round for s in steps] == [0, 1, 0, 0, 1, 2, 3, 4, 5, 6]
    assert (steps[0].length, steps[2].length, steps[3].length, steps[3].start) == (2, 1, 7, 3)


def test_an_open_ended_phase_lasts_until_the_method_ends_it_and_that_is_the_state():
    phases = Phases([Phase("all-in-one"), Phase("groups")], total_rounds=6)
    assert phases.at(4).name == "all-in-one" and phases.at(4).length == 6
    phases.end(2)
    assert [phases.at(r).name for r in range(6)] == ["all-in-one"] * 3 + ["groups"] * 3
    assert phases.at(3).local_round == 0 and phases.at(3).length == 3
    restored = Phases([Phase("all-in-one"), Phase("groups")], total_rounds=6)
    restored.load_state_dict(phases.state_dict())
    assert [restored.at(r) for r in range(6)] == [phases.at(r) for r in range(6)]
    with pytest.raises(ValueError, match="fixed length"):
        Phases([Phase("a", 2), Phase("b")], 4).end(0)


def test_the_lr_schedule_restarts_in_every_phase():
    phases = Phases([Phase("warm", 2), Phase("main", 4)], total_rounds=6)
    train = TrainConfig(lr=0.1, lr_schedule="linear")
    assert [phases.lr_at(train, r) for r in range(6)] == pytest.approx([0.1, 0.05, 0.1, 0.075, 0.05, 0.025])


class HeadsFirstServer(FedAvgServer):
    """A toy phased host: it aggregates only the heads until the round after the clients' mean training loss first
    falls below 1.6 (an open-ended phase ended by a condition), then everything. It logs its phase every round."""

    def __init__(self, setup, params) -> None:
        super().__init__(setup, params)
        self.phases = Phases([Phase("heads"), Phase("all")], setup.rounds)

    def aggregate_updates(self, round_index: int, updates: list[Update]) -> dict[str, float]:
        step = self.phases.at(round_index)
        if step.name == "heads":
            updates = [Update(u.client, u.sizes, u.reference,
                              {k: v for k, v in u.trained.items() if task_of_key(k) is not None},
                              u.weights, u.scalars, u.copy) for u in updates]
            losses = [float(v) for u in updates for k, v in u.scalars.items() if k.startswith("loss/")]
            if sum(losses) / len(losses) < 1.6:
                self.phases.end(round_index)
        super().aggregate_updates(round_index, updates)
        return {"phase": float(step.index)}

    def state_dict(self):
        return {**super().state_dict(), **self.phases.state_dict()}

    def load_state_dict(self, state) -> None:
        super().load_state_dict({k: v for k, v in state.items() if k not in self.phases.state_dict()})
        self.phases.load_state_dict(state)


class EveryClientFirstServer(FedAvgServer):
    """Asks every client in round 1 (to collect something from all of them once), the engine's sample after."""

    def participants(self, round_index: int, sampled: list[int]) -> list[int]:
        return list(self.setup.holdings) if round_index == 0 else sampled


if "test-heads-first" not in METHODS.names():
    register_method("test-heads-first", MethodDef(FedAvgClient, HeadsFirstServer, family=HOST), FedAvgParams)
    register_method("test-every-client-first", MethodDef(FedAvgClient, EveryClientFirstServer, family=HOST),
                    FedAvgParams)


def _phases_logged(run_dir) -> list[float]:
    return [json.loads(line)["fit"]["phase"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("stop_after", [1, 5])
def test_a_phased_method_resumes_to_the_uninterrupted_numbers(tmp_path, stop_after):
    data = small_config_dict(method="test-heads-first", rounds=6, train={"lr": 0.1, "local_steps": 8})
    full = run_config(validate(data), tmp_path / "full")["test-heads-first"]
    phases = _phases_logged(tmp_path / "full")
    assert phases[0] == 0 and phases[-1] == 1 and 1 < phases.index(1) < 6  # the phase ended on its condition
    assert run_config(validate(data), tmp_path / "cut", stop_after=stop_after) is None
    resumed = resume(tmp_path / "cut")["test-heads-first"]
    assert resumed["tasks"] == full["tasks"]
    assert _phases_logged(tmp_path / "cut") == phases


def test_a_server_may_ask_every_client_then_the_engine_samples(tmp_path):
    data = small_config_dict(method="test-every-client-first", rounds=3, participation=0.5)
    run_config(validate(data), tmp_path / "r")
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["sampled"] == [0, 1, 2, 3] and sorted(rows[0]["bytes_up"]) == ["0", "1", "2", "3"]
    assert all(len(row["sampled"]) == 2 for row in rows[1:])


def test_a_server_asking_for_a_client_that_does_not_exist_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(EveryClientFirstServer, "participants", lambda self, r, sampled: [0, 9])
    with pytest.raises(ManytaskError, match=r"asked for clients \[9\], which this 4-client federation does not"):
        run_config(validate(small_config_dict(method="test-every-client-first")), tmp_path / "r")

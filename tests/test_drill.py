"""Drill mechanics without daemons: hold points named and checked, the driver's actions run once each and release
(or leave held) the run, a held ServerApp waits for its release and gives up after its timeout, and churn schedules
are seeded, fit their run and say which node is down in which round."""

import pytest

from manytask.engine.flower.drill import Churn, Drill, ServerHolds, churn_schedule, parse_points
from manytask.errors import ManytaskError


def test_hold_points_are_after_or_mid_a_round_from_one():
    assert parse_points("after-3, mid-2,") == {"after-3", "mid-2"} and parse_points("") == set()
    for wrong in ("after-0", "before-2", "mid-x", "after3"):
        with pytest.raises(ManytaskError, match="not of the form after-R or mid-R"):
            parse_points(wrong)
    with pytest.raises(ManytaskError, match="not of the form"):
        Drill({"during-2": lambda: True})


def test_the_driver_runs_each_action_once_in_the_order_held_and_releases_or_stops(tmp_path):
    calls = []
    drill = Drill({"after-1": lambda: calls.append("a") is None, "mid-2": lambda: calls.append("m") is not None})
    assert drill.run_config_value == "after-1,mid-2"
    assert drill.serve(tmp_path) and calls == []  # nothing held yet
    (tmp_path / "after-1.held").touch()
    assert drill.serve(tmp_path) and drill.serve(tmp_path) and calls == ["a"]  # once, then released
    assert (tmp_path / "after-1.go").exists()
    (tmp_path / "mid-2.held").touch()
    assert not drill.serve(tmp_path) and calls == ["a", "m"] and not (tmp_path / "mid-2.go").exists()
    assert drill.done == ["after-1", "mid-2"]


def test_a_held_server_goes_on_once_released_and_fails_in_one_sentence_without_a_driver(tmp_path):
    holds = ServerHolds(tmp_path, {"after-2", "mid-3"}, timeout=0.2)
    holds.finished_round({"round": 1})  # not a hold point: returns at once, writes nothing
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "after-2.go").touch()
    holds.finished_round({"round": 2})
    assert (tmp_path / "after-2.held").exists()
    holds.pushed("evaluate", "3")  # only training messages hold mid-round
    with pytest.raises(ManytaskError, match="did not release hold point mid-3 within 0 s"):
        holds.pushed("train", "3")


def test_churn_schedules_are_seeded_and_fit_the_run():
    churn = churn_schedule(0, nodes=12, rounds=10)
    assert churn == churn_schedule(0, nodes=12, rounds=10) != churn_schedule(1, nodes=12, rounds=10)
    assert (len(churn.kills), len(churn.restarts), len(churn.joins)) == (3, 2, 1)
    assert not set(churn.joins) & set(churn.kills) and set(churn.restarts) <= set(churn.kills)
    assert all(1 <= r <= 7 for r in churn.kills.values()) and all(1 <= r <= 8 for r in churn.joins.values())
    assert all(churn.kills[n] < r <= 8 for n, r in churn.restarts.items())
    with pytest.raises(ManytaskError, match="no churn"):
        churn_schedule(0, nodes=3, rounds=10)


def test_a_churn_says_which_node_is_down_and_drills_its_events_in_round_order():
    churn = Churn(kills={0: 2, 1: 2, 2: 4}, restarts={0: 5}, joins={3: 1})
    down = {r: [n for n in range(5) if churn.down(n, r)] for r in range(1, 8)}
    assert down == {1: [3], 2: [], 3: [0, 1], 4: [0, 1], 5: [0, 1, 2], 6: [1, 2], 7: [1, 2]}
    events = []
    drill = churn.drill(kill=lambda n: events.append(("kill", n)), start=lambda n: events.append(("start", n)))
    assert sorted(drill.actions) == ["after-1", "after-2", "after-4", "after-5"]
    assert all(drill.actions[point]() for point in ("after-1", "after-2", "after-4", "after-5"))
    assert events == [("start", 3), ("kill", 0), ("kill", 1), ("kill", 2), ("start", 0)]

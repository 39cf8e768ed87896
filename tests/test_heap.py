"""`settled_heap`: what exists when a run starts is out of the collector's sight during the run, handed back after
it (also when the run fails), once however deeply runs nest; and a run computes the same numbers either way."""

import gc
import json

import pytest

from manytask.config import validate
from manytask.engine import heap
from manytask.run import run_config
from tests.conftest import small_config_dict


def test_the_heap_is_frozen_during_a_run_and_handed_back_after_it():
    assert gc.get_freeze_count() == 0
    existing = object.__new__(type("Existing", (), {}))
    with heap.settled_heap():
        assert gc.get_freeze_count() > 0
        assert not any(o is existing for o in gc.get_objects())  # frozen objects are not scanned
        with heap.settled_heap():
            inner = gc.get_freeze_count()
        assert gc.get_freeze_count() == inner > 0  # the inner run did not unfreeze the outer one's heap
    assert gc.get_freeze_count() == 0
    assert any(o is existing for o in gc.get_objects())


def test_a_failing_run_hands_the_heap_back():
    with pytest.raises(RuntimeError), heap.settled_heap():
        raise RuntimeError("a run that crashes")
    assert gc.get_freeze_count() == 0 and heap._depth == 0


def test_a_run_freezes_its_heap_and_computes_what_an_unfrozen_one_does(tmp_path, monkeypatch):
    config = validate(small_config_dict(rounds=2))
    frozen = run_config(config, tmp_path / "frozen")
    seen = []

    class Plain:  # the loop's heap left as it is, and proof the loop asked for it
        def __enter__(self):
            seen.append(gc.get_freeze_count())

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr("manytask.engine.loop.settled_heap", Plain)
    plain = run_config(config, tmp_path / "plain")
    assert seen == [0]
    assert frozen["fedavg"]["tasks"] == plain["fedavg"]["tasks"]
    rows = [[json.loads(line)["fit"] for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
            for name in ("frozen", "plain")]
    assert rows[0] == rows[1]

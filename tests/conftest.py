"""Shared fixtures: a small, fast config on the digits benchmark; how `make test` spreads the tests over processes."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import pytest

from manytask.config import RunConfig, validate

# Flower's tests (Ray simulations; loopback SuperLinks and SuperNodes) take turns in one worker process. Beside a
# simulation's processes a deployment's rounds took 13-14 s here against 8-10 s, closer to the round timeout (40 s)
# that a failure test waits out; two deployments side by side would also race for free ports.
FLOWER_FILES = frozenset({"test_flower_simulation.py", "test_flower_deployment.py"})


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `pytest -n N` (pytest-xdist): Flower's tests are one unit of work, which goes first as the largest
    (about half of the suite's time); every other test is a unit of its own. (xdist's `--dist loadgroup` does the
    same from markers, but does not work with pytest 9.2's node ids.)"""
    from xdist.scheduler import LoadScopeScheduling

    class FlowerTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "flower" if PurePosixPath(nodeid.split("::")[0]).name in FLOWER_FILES else nodeid

    return FlowerTogether(config, log)


def small_config_dict(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "small",
        "method": "fedavg",
        "benchmark": {"name": "digits-tasks", "tasks": ["digit", "parity", "rotated"]},
        "federation": {"num_clients": 4, "tasks": {"kind": "dirichlet", "zeta": 1.0}, "samples": {"kind": "iid"}},
        "model": {"backbone": "mlp", "hidden": [32]},
        "train": {"lr": 0.05, "local_steps": 5, "batch_size": 32},
        "rounds": 3,
        "seed": 7,
        "eval_every": 1,
    }
    data.update(overrides)
    return data


@pytest.fixture
def small_config() -> RunConfig:
    return validate(small_config_dict())

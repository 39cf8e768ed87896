"""What a method hands an executor for one client's round, and what it gets back.

A `ClientPlan` says *what* a client trains (its data, its starting parameters and buffers, its seed, the loss terms
its objective adds on the parameters); the executor decides *how*: one client after another, or a round's clients
as one batched computation (`execution/batched.py`). A plan that the batched path cannot run raises `Unbatchable`
with the reason, before anything changes, and the engine runs those clients one after another."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from manytask.client.terms import ParameterTerm
from manytask.client.trainer import TaskData, TrainReport


class Unbatchable(Exception):
    """Raised before anything changes when a round's clients cannot train as one batched computation; the message
    says why, and the engine trains them one after another instead."""


@dataclass
class ClientPlan:
    """One client's local training in a round."""

    data: TaskData  # task -> (x, y) of the tasks it trains, in the order it holds them
    start: dict[str, Tensor]  # its initial value of every trainable parameter and buffer, by module name
    seed: int
    terms: list[ParameterTerm] = field(default_factory=list)


@dataclass
class PlanResult:
    params: dict[str, Tensor]  # trained parameters by name, buffers as `buffer/<name>` (the `trainable_state` form)
    report: TrainReport

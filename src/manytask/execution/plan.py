"""What a method hands an executor for one client's round, and what it gets back.

A `ClientPlan` says *what* a client trains (its data, its starting parameters and buffers, its seed, the loss terms
its objective adds on the parameters); the executor decides *how*: one client after another, or a round's clients
as one batched computation (`execution/batched.py`). A round that trains nothing but computes something per client
(TaLoS's calibration) is a `WorkPlan`: the method gives the batched computation, the executor its batches. A plan
that the batched path cannot run raises `Unbatchable` with the reason, before anything changes, and the engine runs
those clients one after another."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from manytask.client.lookahead import LookaheadProbe
from manytask.client.terms import FeatureStateTerm, FeatureTerm, ParameterTerm
from manytask.client.trainer import TaskData, Trainer, TrainReport


class Unbatchable(Exception):
    """Raised before anything changes when a round's clients cannot train as one batched computation; the message
    says why, and the engine trains them one after another instead."""


class NothingToBatch(Unbatchable):
    """A round with no training to batch (an idle stage): the engine runs it one client after another at no cost,
    under `execution: vectorized` too."""


@dataclass
class StateUpdate:
    """A client's state after training, written once as an elementwise function per parameter:
    new_k = function(state_k, trained_k, reference_k) for every parameter k in `state`. Either executor applies it:
    to one client's tensors, or to every client's stacked at once."""

    state: dict[str, Tensor]  # the client's current values, by parameter name
    reference: dict[str, Tensor]  # per parameter in `state`, the value the function compares with (what was sent)
    function: Callable[[Tensor, Tensor, Tensor], Tensor]
    prefix: str = ""  # where the client keeps the new state (the executor ignores it)

    def apply(self, trained: dict[str, Tensor]) -> dict[str, Tensor]:
        """The new state from one client's trained parameters."""
        return {k: self.function(v, trained[k], self.reference[k]) for k, v in self.state.items()}


@dataclass
class ClientPlan:
    """One client's local training in a round: the model it trains (`template` gives the structure, `start` the
    values), its objective (the sum of its tasks' losses, `terms` and `features`), its optimizer and steps (`trainer`,
    at `round_index` of `total_rounds` for the lr schedule), its data, and what it keeps afterwards (`update`)."""

    template: nn.Module
    trainer: Trainer
    round_index: int
    total_rounds: int
    sent: dict[str, Tensor]  # what the server sent (the method's own business; the executor never reads it)
    data: TaskData  # task -> (x, y) of the tasks it trains, in the order it holds them
    start: dict[str, Tensor]  # its initial value of every trainable parameter and buffer, by module name
    seed: int
    terms: list[ParameterTerm] = field(default_factory=list)
    update: StateUpdate | None = None
    features: list[FeatureTerm] = field(default_factory=list)  # terms on each batch's features (MOON's)
    state_terms: list[FeatureStateTerm] = field(default_factory=list)  # terms with a state (SFMTL-Graph's anchors)
    inner_steps: int = 1  # steps on each drawn batch (pFedMe's K): the trainer's steps × this many
    # per parameter, the entries the steps may move under SGD with momentum, whatever the trainer's optimizer
    # (`SparseSGDM`: TaLoS's); None: the trainer's optimizer moves every trainable entry
    masks: dict[str, Tensor] | None = None
    probes: list[LookaheadProbe] = field(default_factory=list)  # measurements inside the steps (MAS's lookahead)


@dataclass
class PlanResult:
    params: dict[str, Tensor]  # trained parameters by name, buffers as `buffer/<name>` (the `trainable_state` form)
    report: TrainReport
    state: dict[str, Tensor] = field(default_factory=dict)  # the plan's `update` applied, by parameter name
    term_states: list[Tensor] = field(default_factory=list)  # each of the plan's `state_terms`' state after training
    moved: list[dict[str, Tensor]] = field(default_factory=list)  # each `MovingParameterTerm`'s final operands
    # each of the plan's `probes`' mean measurement over the client's tasks (in its data's order), None: none made
    probes: list[Tensor | None] = field(default_factory=list)


@dataclass
class WorkPlan:
    """One client's part of a round that trains nothing (TaLoS's calibration): `inputs` for `run`, the method's
    computation of every plan of a batch at once (a pure tensor function, one result per plan, in order), and the
    estimated bytes it needs per client, by which the executor sizes the batches."""

    run: Callable[[Sequence[Any]], list[Any]]
    inputs: Any
    bytes: int

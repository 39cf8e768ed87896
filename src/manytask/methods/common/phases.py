"""Phases of a method whose training runs in stages (FL + TaLoS: head-only → calibration → sparse fine-tuning;
MAS: all-in-one → split groups): round → phase, the round inside the phase, and the phase's own lr schedule.

Fixed-length phases follow each other; an open-ended phase (`rounds=None`) lasts until the method ends it
(`Phases.end`, e.g. when a condition is met) or the run ends. Where open-ended phases ended is the only state,
kept in `state_dict` as one tensor, so a method that puts it in its server state is in the same phase at the
same round after a resume, on every engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from manytask.client.trainer import TrainConfig

ENDS = "phase_ends"
NOT_ENDED = -1


@dataclass(frozen=True)
class Phase:
    name: str
    rounds: int | None = None  # None: until the method ends it, or the run ends


@dataclass(frozen=True)
class PhaseStep:
    """Where a round falls: its phase, that phase's 0-based index, the round inside it, and the phase's length
    (for an open-ended phase not yet ended: the rounds left in the run at its start)."""

    name: str
    index: int
    local_round: int
    length: int
    start: int


class Phases:
    def __init__(self, phases: Sequence[Phase], total_rounds: int) -> None:
        if not phases:
            raise ValueError("a phased method needs at least one phase")
        if len({p.name for p in phases}) != len(phases):
            raise ValueError(f"phase names must be distinct: {[p.name for p in phases]}")
        if any(p.rounds is not None and p.rounds < 1 for p in phases):
            raise ValueError("a fixed phase lasts at least one round")
        self.phases = list(phases)
        self.total_rounds = total_rounds
        self.ends = [NOT_ENDED] * len(phases)  # per open-ended phase: its last round, once ended

    def _bounds(self) -> list[tuple[int, int]]:
        """[start, end) rounds of every phase (a phase not reached has start >= the run's rounds)."""
        bounds, start = [], 0
        for index, phase in enumerate(self.phases):
            if phase.rounds is not None:
                end = start + phase.rounds
            elif self.ends[index] != NOT_ENDED:
                end = self.ends[index] + 1
            else:
                end = max(self.total_rounds, start)
            bounds.append((start, end))
            start = end
        return bounds

    def at(self, round_index: int) -> PhaseStep:
        """The phase of round `round_index` (0-based); rounds after the last phase belong to it."""
        bounds = self._bounds()
        for index, (start, end) in enumerate(bounds):
            if round_index < end or index == len(bounds) - 1:
                return PhaseStep(self.phases[index].name, index, round_index - start, max(end - start, 1), start)
        raise AssertionError("unreachable")

    def end(self, round_index: int) -> None:
        """End the open-ended phase that `round_index` is in, after that round: the next phase starts at
        `round_index + 1`."""
        step = self.at(round_index)
        if self.phases[step.index].rounds is not None:
            raise ValueError(f"phase '{step.name}' has a fixed length; only open-ended phases are ended")
        self.ends[step.index] = round_index

    def lr_at(self, train: TrainConfig, round_index: int) -> float:
        """The round's lr under the train schedule restarted in every phase (phase-local round and length)."""
        step = self.at(round_index)
        return train.lr_at(step.local_round, step.length)

    def state_dict(self) -> dict[str, Tensor]:
        return {ENDS: torch.tensor(self.ends, dtype=torch.int64)}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        ends = state[ENDS].tolist()
        if len(ends) != len(self.phases):
            raise ValueError(f"the checkpoint has {len(ends)} phases, this method {len(self.phases)}")
        self.ends = [int(e) for e in ends]

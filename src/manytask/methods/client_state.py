"""What a client program keeps in a client's state between rounds, declared once (`ClientProgram.state_schema`):
named parts, each at one or more key prefixes, holding the names it lists (a model's tensors, a named scalar) or any
name under its prefixes. The engine's client runner checks every client's state against the schema when a call
starts (a state restored from a checkpoint included) and when it ends, so a key no part declares (a misspelt one,
or one of another method's checkpoint) is an error, not a silent miss."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from torch import Tensor, nn

from manytask.errors import clipped
from manytask.models.multitask import state_keys


@dataclass(frozen=True)
class StatePart:
    prefixes: tuple[str, ...] = ("",)
    names: frozenset[str] | None = None  # None: any name under the prefixes

    @classmethod
    def of(cls, names: Iterable[str], prefixes: Iterable[str] = ("",)) -> StatePart:
        return cls(tuple(prefixes), frozenset(names))

    def holds(self, key: str) -> bool:
        return any(key.startswith(prefix) and (self.names is None or key[len(prefix):] in self.names)
                   for prefix in self.prefixes)


def model_part(model: nn.Module) -> StatePart:
    """Every tensor of `model` that `trainable_state` gives (all its heads): a model a client keeps as its own."""
    return StatePart.of(state_keys(model))


class UnknownState(ValueError):
    """A client state key that no part of the program's schema declares."""


@dataclass
class StateSchema:
    owner: str  # the program, for the error message
    parts: Mapping[str, StatePart] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)  # keys already found in a part: states repeat their keys

    def check(self, state: Mapping[str, Tensor]) -> None:
        """Raise `UnknownState` for the first key of `state` that no part declares."""
        for key in state:
            if key in self.known:
                continue
            if not any(part.holds(key) for part in self.parts.values()):
                kept = ", ".join(self.parts) or "no client state"
                raise UnknownState(f"unknown client state '{clipped(key)}' for {self.owner}, which keeps {kept}")
            self.known.add(key)

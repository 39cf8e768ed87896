"""A small named registry shared by benchmarks, methods, partitioners and backbones.

Each entry has a pydantic `Params` model: it validates user parameters (unknown keys, wrong types) and tells
`manytask list` what can be set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from manytask.config_sources import sweep_hint
from manytask.errors import ManytaskError, clipped, unknown_choice

T = TypeVar("T")


class Params(BaseModel):
    """Base for every parameter model: unknown keys are errors, values are validated strictly by type."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    target: T
    params: type[Params]
    description: str


class Registry(Generic[T]):
    """Name -> (object, Params model, one-line description). With an entry-point group, installed packages add names:
    a name not registered yet is looked up among the group's entry points, whose loading registers it."""

    def __init__(self, kind: str, entry_points: str | None = None) -> None:
        self.kind = kind
        self.entry_points = entry_points
        self._entries: dict[str, Entry[T]] = {}
        self._all_loaded = entry_points is None

    def register(self, name: str, params: type[Params] = Params, description: str = "") -> Callable[[T], T]:
        def decorate(target: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._entries[name] = Entry(name, target, params, description)
            return target

        return decorate

    def get(self, name: str) -> Entry[T]:
        if name not in self._entries and self.entry_points is not None:
            from manytask.user_code import load_entry_point

            if load_entry_point(self.entry_points, name) and name not in self._entries:
                raise ManytaskError(f"the entry point '{name}' (group {self.entry_points}) loaded, but registered no "
                                    f"{self.kind} '{name}'; its module must register it under that name.")
        if name not in self._entries:
            raise unknown_choice(self.kind, name, self.names())
        return self._entries[name]

    def parse_params(self, name: str, values: dict[str, Any]) -> Params:
        """Validate user parameters for entry `name`; raise a one-sentence ManytaskError on bad input."""
        entry = self.get(name)
        try:
            return entry.params(**values)
        except ValidationError as err:
            raise ManytaskError(describe_validation_error(err, f"{self.kind} '{name}'", entry.params)) from None

    def names(self) -> list[str]:
        if not self._all_loaded:
            from manytask.user_code import load_entry_points

            self._all_loaded = True
            load_entry_points(self.entry_points)
        return sorted(self._entries)

    def entries(self) -> list[Entry[T]]:
        return [self._entries[n] for n in self.names()]


def describe_validation_error(err: ValidationError, where: str, model: type[BaseModel]) -> str:
    """One sentence for the first problem pydantic found, with the valid keys when a key is unknown."""
    first = err.errors()[0]
    key = ".".join(str(p) for p in first["loc"]) or "(top level)"
    if first["type"] == "extra_forbidden":
        valid = ", ".join(model.model_fields) or "none"
        return f"unknown parameter '{key}' for {where}; valid parameters: {valid}."
    if first["type"] == "missing":
        return f"missing required parameter '{key}' for {where}."
    given = first.get("input")
    return (f"parameter '{clipped(key)}' of {where} is invalid ({first['msg'].lower()}; got {clipped(repr(given))}"
            f"{sweep_hint(first)}).")


def describe_params(model: type[BaseModel]) -> str:
    """'name=default, ...' for `manytask list`."""
    parts = []
    for name, field in model.model_fields.items():
        default = "required" if field.is_required() else repr(field.get_default(call_default_factory=True))
        parts.append(f"{name}={default}")
    return ", ".join(parts) or "-"

"""A small named registry shared by benchmarks, methods, partitioners and backbones.

Each entry has a pydantic `Params` model: it validates user parameters (unknown keys, wrong types) and tells
`manytask list` what can be set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

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
    """Name -> (object, Params model, one-line description)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, params: type[Params] = Params, description: str = "") -> Callable[[T], T]:
        def decorate(target: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._entries[name] = Entry(name, target, params, description)
            return target

        return decorate

    def get(self, name: str) -> Entry[T]:
        if name not in self._entries:
            raise unknown_choice(self.kind, name, list(self._entries))
        return self._entries[name]

    def parse_params(self, name: str, values: dict[str, Any]) -> Params:
        """Validate user parameters for entry `name`; raise a one-sentence ManytaskError on bad input."""
        entry = self.get(name)
        try:
            return entry.params(**values)
        except ValidationError as err:
            raise ManytaskError(describe_validation_error(err, f"{self.kind} '{name}'", entry.params)) from None

    def names(self) -> list[str]:
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
    return f"parameter '{clipped(key)}' of {where} is invalid ({first['msg'].lower()}; got {clipped(repr(given))})."


def describe_params(model: type[BaseModel]) -> str:
    """'name=default, ...' for `manytask list`."""
    parts = []
    for name, field in model.model_fields.items():
        default = "required" if field.is_required() else repr(field.get_default(call_default_factory=True))
        parts.append(f"{name}={default}")
    return ", ".join(parts) or "-"

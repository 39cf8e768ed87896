"""Search spaces for `manytask tune`: what a method's parameters declare worth tuning, and in which range.

A method's `Params` class lists its own hyper-parameters in `SEARCH_SPACE` (FedProx: μ; MaTU: ρ and ε; DEA: ρ …),
a plug-in's likewise; every member also tunes the local learning rate around its own (`train_space`). A config's
`tune.space.<member label>` overrides any dimension (or removes one with null). Ranges are the spans the papers
sweep or, where a paper gives one value, a decade either side of it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from manytask.errors import ManytaskError

TRAIN_PREFIX = "train."


@dataclass(frozen=True)
class Dimension:
    """One tuned value: a float range (log-uniform when `log`), an integer range, or a list of choices."""

    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False
    choices: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        if self.choices is not None:
            if not self.choices:
                raise ValueError("a dimension's choices are empty")
            return
        if self.low is None or self.high is None or not self.low < self.high:
            raise ValueError(f"a range needs low < high (got {self.low}, {self.high})")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range needs low > 0 (got {self.low})")

    def describe(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(map(str, self.choices))
        kind = "log-uniform" if self.log else "integers" if self.integer else "uniform"
        return f"{kind} [{self.low:g}, {self.high:g}]"

    def to_json(self) -> dict[str, Any]:
        if self.choices is not None:
            return {"choices": list(self.choices)}
        return {"low": self.low, "high": self.high, "log": self.log, "int": self.integer}


def log_range(low: float, high: float) -> Dimension:
    return Dimension(low, high, log=True)


def uniform(low: float, high: float) -> Dimension:
    return Dimension(low, high)


Space = dict[str, Dimension]  # "mu", "plugin.rho", "train.lr" -> its range

LR_BELOW, LR_ABOVE = 10.0, 3.0


def train_space(lr: float) -> Space:
    """The local learning rate, log-uniform from a tenth of the member's own to three times it. A fixed wide range
    lets the search settle at the edge of stability: on the default job (momentum 0.9) a range up to 0.5 picked rates
    that scored best on the validation run and then diverged on the full training set (docs/tuning.md)."""
    return {f"{TRAIN_PREFIX}lr": log_range(lr / LR_BELOW, lr * LR_ABOVE)}


def parse_dimension(raw: Any, where: str) -> Dimension:
    """A dimension from a config: {low, high, log?, int?} or {choices: [...]}; one sentence when malformed."""
    if not isinstance(raw, Mapping) or not (set(raw) <= {"low", "high", "log", "int", "choices"}):
        raise ManytaskError(f"tune.space {where}: give {{low: L, high: H, log: true|false}} or {{choices: [...]}}.")
    try:
        choices = raw.get("choices")
        return Dimension(raw.get("low"), raw.get("high"), bool(raw.get("log", False)), bool(raw.get("int", False)),
                         None if choices is None else tuple(choices))
    except (TypeError, ValueError) as err:
        raise ManytaskError(f"tune.space {where}: {err}.") from None

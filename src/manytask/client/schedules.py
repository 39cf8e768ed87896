"""Learning-rate schedules over rounds: a round's lr is a pure function of (round, rounds), so a resumed run and a
phase of a phased method (which passes its phase-local round and length) get the same values."""

from __future__ import annotations

import math
from typing import Literal

Schedule = Literal["constant", "cosine", "linear", "warmup-cosine", "poly", "step"]


def cosine(lr: float, progress: float) -> float:
    """lr · ½(1 + cos(π·progress)), progress in [0, 1)."""
    return lr * 0.5 * (1 + math.cos(math.pi * progress))


def warmup_cosine(lr: float, round_index: int, total_rounds: int, warmup: int) -> float:
    """Linear warmup lr·(r + 1)/W over the first W rounds (r 0-based), then cosine decay over the other R − W:
    lr · ½(1 + cos(π (r − W)/(R − W)))."""
    if round_index < warmup:
        return lr * (round_index + 1) / warmup
    return cosine(lr, (round_index - warmup) / max(total_rounds - warmup, 1))


def poly(lr: float, round_index: int, total_rounds: int, power: float) -> float:
    """Polynomial decay lr · (1 − r/R)^p."""
    return lr * (1 - round_index / max(total_rounds, 1)) ** power


def step(lr: float, round_index: int, every: int, gamma: float) -> float:
    """Step decay (PyTorch's StepLR over rounds): lr · γ^⌊r / every⌋."""
    return lr * gamma ** (round_index // every)


def scheduled_lr(
    lr: float, schedule: Schedule, round_index: int, total_rounds: int, warmup: int = 0, power: float = 0.9,
    every: int = 10, gamma: float = 0.1,
) -> float:
    """The lr of round `round_index` (0-based) of `total_rounds` under `schedule`."""
    progress = round_index / max(total_rounds, 1)
    if schedule == "cosine":
        return cosine(lr, progress)
    if schedule == "linear":
        return lr * (1 - progress)
    if schedule == "warmup-cosine":
        return warmup_cosine(lr, round_index, total_rounds, warmup)
    if schedule == "poly":
        return poly(lr, round_index, total_rounds, power)
    if schedule == "step":
        return step(lr, round_index, every, gamma)
    return lr

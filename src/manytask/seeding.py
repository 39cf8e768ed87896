"""Explicit, derived seeds: every random choice comes from (run seed, purpose, indices), never global state.

Deriving seeds from the round and client id (instead of carrying a generator forward) is what makes resume exact:
round r of a resumed run draws the same numbers as round r of an uninterrupted run.
"""

from __future__ import annotations

import zlib
from functools import lru_cache

import numpy as np
import torch


@lru_cache(maxsize=1 << 16)  # a round asks for the same few seeds per client many times; SeedSequence costs ~30 µs
def derive_seed(seed: int, *keys: int | str) -> int:
    """A 63-bit seed derived deterministically from a base seed and a path of keys."""
    words = [int(seed)] + [k if isinstance(k, int) else zlib.crc32(k.encode()) for k in keys]
    return int(np.random.SeedSequence(words).generate_state(2, dtype=np.uint32).astype(np.uint64) @ [1 << 31, 1])


def numpy_rng(seed: int, *keys: int | str) -> np.random.Generator:
    """A numpy Generator for one purpose."""
    return np.random.default_rng(derive_seed(seed, *keys))


def torch_generator(seed: int, *keys: int | str) -> torch.Generator:
    """A torch CPU Generator for one purpose."""
    return torch.Generator().manual_seed(derive_seed(seed, *keys))


def seed_global_rng(seed: int) -> None:
    """Seed torch's global generators, as `torch.manual_seed` does, without its per-call bookkeeping: on this
    torch it queues a lazy seeding call for every accelerator backend (CUDA, XPU, MTIA) and records a stack trace
    for each, which made seeding one client cost more than building its model. CPU always; CUDA once it is in use."""
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)

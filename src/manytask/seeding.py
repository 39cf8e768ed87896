"""Explicit, derived seeds: every random choice comes from (run seed, purpose, indices), never global state.

Deriving seeds from the round and client id (instead of carrying a generator forward) is what makes resume exact:
round r of a resumed run draws the same numbers as round r of an uninterrupted run.

`derive_seed` is numpy's `SeedSequence(words).generate_state(2)` (O'Neill's seed_seq with a pool of 4 words), done
in plain ints: building a SeedSequence cost ~35 µs inside a round (this ~15 µs), and a round derives a few seeds
per client. Every seed of every run depends on these numbers, so the arithmetic follows numpy's
`bit_generator.pyx` exactly.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from functools import lru_cache
from itertools import islice

import numpy as np
import torch

_MASK = 0xFFFFFFFF  # SeedSequence computes in uint32
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875  # the hash constant that mixes the entropy into the pool
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED  # the one that draws the output words from the pool
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_POOL = 4


def _hash_constants(const: int, mult: int) -> Iterator[tuple[int, int]]:
    """A hash constant as it evolves: per hashmix, the value xored in and the value multiplied by (the next one)."""
    while True:
        following = const * mult & _MASK
        yield const, following
        const = following


_PAIRS = [(s, d) for s in range(_POOL) for d in range(_POOL) if s != d]  # every pool word into every other
_MIXING = list(islice(_hash_constants(_INIT_A, _MULT_A), _POOL + len(_PAIRS)))
_FIRST = tuple(_MIXING[:_POOL])  # hashmixes of the first words into the pool
_CROSS = tuple((s, d, *const) for (s, d), const in zip(_PAIRS, _MIXING[_POOL:], strict=True))  # (source, dest, ...)
_OUTPUT = tuple(islice(_hash_constants(_INIT_B, _MULT_B), 2))  # the hashmixes of `generate_state(2)`


def _uint32_words(value: int) -> list[int]:
    """An int as SeedSequence reads it: its 32-bit words, least significant first, at least one."""
    if value < 0:
        raise ValueError("expected non-negative integer")
    words = [value & _MASK]
    while value := value >> 32:
        words.append(value & _MASK)
    return words


def _hashmix(value: int, xor: int, mult: int) -> int:
    """SeedSequence's `hashmix` of one word, given the hash constant's step (`_hash_constants`)."""
    value = (value ^ xor) * mult & _MASK
    return value ^ value >> 16


def _pool(entropy: list[int]) -> list[int]:
    """`SeedSequence.mix_entropy`: the pool after mixing in every entropy word. `mix(pool word, hashmix(value))`
    is written out in both loops: a function call per step would double the cost."""
    padded = entropy[:_POOL] + [0] * (_POOL - len(entropy))
    pool = [_hashmix(value, xor, mult) for value, (xor, mult) in zip(padded, _FIRST, strict=True)]
    for source, destination, xor, mult in _CROSS:
        value = (pool[source] ^ xor) * mult & _MASK
        mixed = (_MIX_L * pool[destination] - _MIX_R * (value ^ value >> 16)) & _MASK
        pool[destination] = mixed ^ mixed >> 16
    constants = _hash_constants(_CROSS[-1][3], _MULT_A)  # words past the pool's size carry on with the same constant
    for word in entropy[_POOL:]:
        for destination, (xor, mult) in zip(range(_POOL), constants, strict=False):  # range first: no constant lost
            value = (word ^ xor) * mult & _MASK
            mixed = (_MIX_L * pool[destination] - _MIX_R * (value ^ value >> 16)) & _MASK
            pool[destination] = mixed ^ mixed >> 16
    return pool


def _two_words(entropy: list[int]) -> list[int]:
    """`SeedSequence(entropy).generate_state(2, dtype=np.uint32)`, as ints."""
    pool = _pool(entropy)
    return [_hashmix(pool[0], *_OUTPUT[0]), _hashmix(pool[1], *_OUTPUT[1])]


def _entropy(seed: int, keys: Sequence[int | str]) -> list[int]:
    """The words SeedSequence reads: the seed's, then each key's (a string as its crc32)."""
    words = _uint32_words(int(seed))
    for key in keys:
        words += _uint32_words(key) if isinstance(key, int) else [zlib.crc32(key.encode())]
    return words


@lru_cache(maxsize=1 << 16)  # model builds and evaluations ask for the same seeds again (2/3 of a default run's)
def derive_seed(seed: int, *keys: int | str) -> int:
    """A 63-bit seed derived deterministically from a base seed and a path of keys (strings enter as their crc32)."""
    high, low = _two_words(_entropy(seed, keys))
    return int(float(high << 31) + low)  # in float64, rounded, as numpy's `uint64 @ [2**31, 1]` has always done


def derive_seeds(requests: Sequence[tuple[int | str, ...]]) -> list[int]:
    """`[derive_seed(*request) for request in requests]`, the hashing done for all of them at once in numpy: a
    round derives a few seeds per client, each ~16 µs in plain ints, a few µs per hundred this way."""
    entropies = [_entropy(int(request[0]), request[1:]) for request in requests]
    seeds: list[int] = [0] * len(entropies)
    by_length: dict[int, list[int]] = {}
    for position, words in enumerate(entropies):
        by_length.setdefault(len(words), []).append(position)
    for positions in by_length.values():
        high, low = _two_words_many(np.array([entropies[p] for p in positions], dtype=np.uint64))
        combined = high.astype(np.float64) * float(1 << 31) + low.astype(np.float64)  # `derive_seed`'s rounding
        for position, value in zip(positions, combined.tolist(), strict=True):
            seeds[position] = int(value)
    return seeds


def _two_words_many(entropy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_two_words` of every row of `entropy` (rows of equal length, words < 2**32, uint64), as two uint64
    columns. uint64 products wrap modulo 2**64, which keeps their low 32 bits exact."""
    mask, shift = np.uint64(_MASK), np.uint64(16)

    def hashmix(value: np.ndarray, xor: int, mult: int) -> np.ndarray:
        value = (value ^ np.uint64(xor)) * np.uint64(mult) & mask
        return value ^ value >> shift

    def mix(destination: np.ndarray, value: np.ndarray) -> np.ndarray:
        mixed = np.uint64(_MIX_L) * destination - np.uint64(_MIX_R) * value & mask
        return mixed ^ mixed >> shift

    zeros = np.zeros(len(entropy), dtype=np.uint64)
    columns = [entropy[:, i] if i < entropy.shape[1] else zeros for i in range(_POOL)]
    pool = [hashmix(word, xor, mult) for word, (xor, mult) in zip(columns, _FIRST, strict=True)]
    for source, destination, xor, mult in _CROSS:
        pool[destination] = mix(pool[destination], hashmix(pool[source], xor, mult))
    constants = _hash_constants(_CROSS[-1][3], _MULT_A)
    for i in range(_POOL, entropy.shape[1]):
        for destination, (xor, mult) in zip(range(_POOL), constants, strict=False):
            pool[destination] = mix(pool[destination], hashmix(entropy[:, i], xor, mult))
    return hashmix(pool[0], *_OUTPUT[0]), hashmix(pool[1], *_OUTPUT[1])


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

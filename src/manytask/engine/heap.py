"""The heap the garbage collector scans during a run.

A run starts with hundreds of thousands of long-lived objects that never become garbage: imported modules' functions
and types, the experiment's data, the models. CPython's full collections scan all of them, and a round allocates
enough containers to trigger one every few dozen rounds: about 0.15 s each on a 2-core VM, a tenth of the
vectorized engine's time at 100 clients when spread over the rounds. `settled_heap` moves what exists when the run
starts out of the collector's sight (`gc.freeze`) and hands it back (`gc.unfreeze`) when the run ends, so full
collections scan only what the run itself keeps. Nothing is freed later than it would be otherwise except cycles
among objects that existed before the run, which are collected after it."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_depth = 0  # runs inside runs (a comparison's members, a Flower server in-process) freeze and unfreeze once


@contextmanager
def settled_heap() -> Iterator[None]:
    global _depth
    if _depth == 0:
        gc.freeze()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            gc.unfreeze()

"""The heap the garbage collector scans during a run.

A run starts with hundreds of thousands of long-lived objects that never become garbage: imported modules' functions
and types, the experiment's data, the models. CPython's full collections scan all of them, and a round allocates
enough containers to trigger one every few dozen rounds: about 0.15 s each on a 2-core VM, a tenth of the
vectorized engine's time at 100 clients when spread over the rounds. `settled_heap` moves what exists when the run
starts out of the collector's sight (`gc.freeze`) and hands it back (`gc.unfreeze`) when the run ends, so full
collections scan only what the run itself keeps. Nothing is freed later than it would be otherwise except cycles
among objects that existed before the run, which are collected after it.

It also keeps freed memory for reuse (`retain_freed_memory`): glibc hands the free top of its heap back to the
kernel once it exceeds a few MB, and the next round's first touch of each page then faults it back in, zeroed.
A page fault costs about 4 µs on a VM; a round of 100 vectorized clients faulted about 1 000 pages, 2 to 4 ms of
kernel time in a 35 ms round, where the bare loop faults about 8."""

from __future__ import annotations

import ctypes
import functools
import gc
from collections.abc import Iterator
from contextlib import contextmanager

_depth = 0  # runs inside runs (a comparison's members, a Flower server in-process) freeze and unfreeze once


# glibc's mallopt parameters
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MAPPED_BYTES = 32 << 20  # blocks this large get mappings of their own (the most glibc's own adaptive rule allows)
RETAINED_BYTES = 64 << 20  # free memory the heap keeps at its top before it trims


@functools.cache  # once per process
def retain_freed_memory() -> bool:
    """Under glibc: blocks under `MAPPED_BYTES` come from the heap, which keeps up to `RETAINED_BYTES` of freed
    memory for reuse, for the rest of the process (setting these turns glibc's adaptive thresholds off for good,
    so they are not handed back). Whether the allocator is glibc's; elsewhere nothing changes."""
    try:
        libc = ctypes.CDLL(None)  # the symbols the process has loaded (Windows has no such handle)
    except (OSError, TypeError):
        return False
    if not hasattr(libc, "gnu_get_libc_version"):
        return False
    libc.mallopt(M_MMAP_THRESHOLD, MAPPED_BYTES)
    libc.mallopt(M_TRIM_THRESHOLD, RETAINED_BYTES)
    return True


@contextmanager
def settled_heap() -> Iterator[None]:
    global _depth
    if _depth == 0:
        retain_freed_memory()
        gc.freeze()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            gc.unfreeze()

"""A process's warm-up, paid before a comparison's first member starts its clock.

The first computation of a process pays for what later ones find ready: torch's operator caches and thread pool,
the allocator's first pages, lazily imported modules. In a comparison the first member would pay all of it (on
`fedprox_synthetic`, a process's first round takes 0.95 s of client compute against 0.043 s for later rounds), so
its costs would depend on its place in the list. `warm_up` runs one round of a member in a throwaway directory
first, leaving torch's global CPU random state as it was (every draw on a device takes an explicit seed), so every
member is timed on a warm process and its numbers do not change.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import time
from pathlib import Path

import torch

from manytask.config import to_yaml
from manytask.engine.local import local_engine
from manytask.errors import ManytaskError
from manytask.experiment import Experiment
from manytask.rundir import RunDir


def warm_up(experiment: Experiment) -> float:
    """One round of `experiment` on the local engine, its files and notices thrown away; returns its seconds."""
    began = time.perf_counter()
    with (torch.random.fork_rng(devices=[]), tempfile.TemporaryDirectory(prefix="manytask-warmup-") as folder,
          contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO())):
        run_dir = RunDir(Path(folder) / "run")
        run_dir.start(to_yaml(experiment.config), experiment.federation_record())
        # a round that fails (a diverging member, say) fails the same way in the member's own run, which reports it
        with contextlib.suppress(ManytaskError):
            local_engine(experiment, run_dir).run(stop_after=1)
    return time.perf_counter() - began

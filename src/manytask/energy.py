"""Energy of a run: measured by a hardware meter where the machine exposes one, else estimated.

Meters. A round is measured with the machine's energy counters, Intel/AMD RAPL for the CPU packages (and DRAM
where RAPL has it) and NVML for NVIDIA GPUs, read through the Zeus library (`pip install manytask[energy]`,
PyPI name `zeus`, formerly `zeus-ml`). Zeus was chosen over the other candidates because it is maintained (the
ML.ENERGY project, releases through 2026), measures both RAPL and NVML behind one API (`ZeusMonitor`'s
begin/end windows, in joules, from the hardware's cumulative energy counters rather than sampled power), does
not pull torch, and fails cleanly: without a GPU, without RAPL, or without root (RAPL's files are root-only
on recent kernels) it simply monitors no device, which `available_meter` turns into None. The others fit worse:
codecarbon silently falls back to a TDP-based *estimate* when RAPL is unreadable (so "measured" would not mean
measured) and pulls pandas, requests, an auth client and a CLI stack; pyJoules has had no release since 2020;
nvidia-ml-py reads NVML only (no CPU energy). One wart: zeus 0.16's wheel also installs a stray top-level
`tests` package; this repository's `tests` still wins under pytest, which puts the repository first on sys.path.
A meter reads the whole machine, every RAPL package and GPU it can see, whatever else runs there; on the Flower
engines that is the machine running the server's round loop (clients on other machines are not metered).

Estimate. Where no meter is readable, energy = Σ client compute seconds × `power_watts` (a RunConfig field,
default 15 W). The default is a stated figure, not a measurement: 15 W is the base power (TDP) of the common
laptop processor class (Intel and AMD "U" series), the order of what a laptop draws while one client process
keeps a core busy with the package awake. It covers client fits only, not the server's aggregation or
evaluation, and everywhere it is shown it is labelled as an estimate.

Energy and timing are only recorded: they never feed back into training, so runs stay deterministic.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from functools import lru_cache
from itertools import count
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_POWER_WATTS = 15.0
ESTIMATE_MARK = "(est.)"


class EnergyMeter(ABC):
    """Measures the energy of a stretch of work: `start()`, then `stop()` returns the joules since."""

    source: str  # what was read, e.g. "rapl", "nvml", "rapl+nvml"

    @abstractmethod
    def start(self) -> None:
        """Begin a measurement."""

    @abstractmethod
    def stop(self) -> float:
        """End the measurement begun by `start()`; the joules consumed in between (NaN if a reading failed)."""


class ZeusMeter(EnergyMeter):
    """RAPL and NVML energy through a `zeus.monitor.ZeusMonitor`."""

    _windows = count()

    def __init__(self, monitor: Any) -> None:
        self.monitor = monitor
        parts = []
        if monitor.cpu_indices:
            parts.append("rapl")
        if monitor.gpu_indices:
            parts.append("amdsmi" if type(monitor.gpus).__name__.startswith("AMD") else "nvml")
        self.source = "+".join(parts)
        self._window: str | None = None

    def start(self) -> None:
        self._window = f"manytask-{next(self._windows)}"
        try:
            self.monitor.begin_window(self._window, sync_execution=_cuda_available())
        except Exception as err:  # a meter that stops reading must not stop the run
            logger.warning("energy meter (%s) failed to start a reading: %s", self.source, err)
            self._window = None

    def stop(self) -> float:
        window, self._window = self._window, None
        if window is None:
            return math.nan
        try:
            measured = self.monitor.end_window(window, sync_execution=_cuda_available())
        except Exception as err:
            logger.warning("energy meter (%s) failed to read: %s", self.source, err)
            return math.nan
        parts = (measured.gpu_energy, measured.cpu_energy or {}, measured.dram_energy or {})
        return float(sum(sum(joules.values()) for joules in parts))


def _cuda_available() -> bool:
    """Whether GPU work may be in flight (then a reading waits for it first)."""
    import torch

    return torch.cuda.is_available()


@lru_cache(maxsize=1)
def _zeus_monitor() -> Any | None:
    """One ZeusMonitor for the process, or None when zeus is not installed or reads no meter here."""
    try:
        from zeus.monitor import ZeusMonitor
    except Exception:  # not installed, or a broken install: no meter
        return None
    quiet = logging.getLogger("zeus")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # zeus logs every vendor library it does not find
    try:
        monitor = ZeusMonitor(approx_instant_energy=True)
    except Exception as err:
        logger.info("no energy meter: zeus could not start (%s)", err)
        return None
    finally:
        quiet.setLevel(level)
    if not monitor.cpu_indices and not monitor.gpu_indices:
        return None
    return monitor


def available_meter() -> EnergyMeter | None:
    """A meter backed by zeus when it is installed and reads at least one RAPL or NVML meter here, else None.

    Never raises because a meter is missing. The round loop calls this once per run (tests patch it to inject a
    meter)."""
    monitor = _zeus_monitor()
    return None if monitor is None else ZeusMeter(monitor)


def reading(meter: EnergyMeter | None) -> dict[str, Any]:
    """Stop `meter` and return the metrics-row fields `energy_joules` and `energy_source`; nothing without a
    meter or when the reading failed."""
    if meter is None:
        return {}
    joules = meter.stop()
    if not math.isfinite(joules):
        return {}
    return {"energy_joules": joules, "energy_source": meter.source}


def estimate_source(power_watts: float) -> str:
    """How an estimate is made, e.g. 'estimate: 15 W × client compute seconds'."""
    return f"estimate: {power_watts:g} W × client compute seconds"


def estimate_joules(client_seconds: float, power_watts: float) -> float:
    """The estimate: client compute seconds × the stated power of one busy client process."""
    return client_seconds * power_watts


def energy_totals(rows: Sequence[Mapping[str, Any]], power_watts: float) -> dict[str, Any]:
    """A run's energy from its metrics rows: the sum of the measured per-round joules when every row has one,
    else the estimate from the rows' client compute seconds (`energy_joules`, `energy_estimated`,
    `energy_source`)."""
    measured = [row.get("energy_joules") for row in rows]
    if rows and all(isinstance(j, int | float) and math.isfinite(j) for j in measured):
        sources = sorted({str(row.get("energy_source") or "meter") for row in rows})
        return {"energy_joules": float(sum(measured)), "energy_estimated": False, "energy_source": ", ".join(sources)}
    seconds = sum(s for row in rows for s in row.get("client_seconds", {}).values())
    return {"energy_joules": estimate_joules(seconds, power_watts), "energy_estimated": True,
            "energy_source": estimate_source(power_watts)}

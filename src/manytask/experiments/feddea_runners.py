"""What FedDEA's experiments need beyond the plain `members` runner:

- **The server-step control** (`server-step-control`): every host alone and with DEA, DEA by the paper's eq. 6 on
  the hosts whose rule keeps state, then each host with its server step scaled by the norm inflation c its DEA run
  logged on the same seed (`<host>×c`): the results page's test of whether DEA's gain is more than a longer step.
- **Fig. 2's update overlap** (`update-overlap`): a run whose server records, every round, where the clients' top
  10 % update entries lie over the shared encoder (`update_overlap.json` in the run's folder)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import statistics
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from manytask.experiments.measures import fit_mean
from manytask.experiments.runner import RUNNERS, Unit, Workers, estimate, pending, run_with_estimate, units
from manytask.experiments.spec import Measure, PaperExperiment, Scale, Value
from manytask.report.runs import RunRecord, load_run

if TYPE_CHECKING:
    from torch import Tensor

    from manytask.config import RunConfig

INFLATION = "dea/inflation"  # DEA's logged c = ‖Δ̃‖ / ‖Δ‖, the round's mean over clients
STATEFUL = ("feddyn", "fedacg")  # hosts whose server rule keeps state fed by the updates

# --- the server-step control: host, host + DEA, host + DEA by eq. 6, then host × c ---------------------------------


def _method(config: dict[str, Any]) -> dict[str, Any]:
    method = config["method"]
    return {"name": method} if isinstance(method, str) else dict(method)


def _with_method(unit: Unit, label: str, method: dict[str, Any]) -> Unit:
    """`unit`'s run with another method entry, labelled `label`, in its seed's folder."""
    config = yaml.safe_load(unit.config)
    config["method"] = {**method, "label": label}
    text = yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
    return Unit(unit.seed, label, text, unit.out.parent / label)


def paper_rule_units(todo: list[Unit]) -> list[Unit]:
    """For each `+dea` run of a stateful host, the same run with DEA's `rule: paper` (eq. 6 in place of the
    host's rule), labelled `<host>+dea-paper`."""
    made = []
    for unit in todo:
        host = unit.label.removesuffix("+dea")
        if unit.label.endswith("+dea") and host in STATEFUL:
            method = _method(yaml.safe_load(unit.config))
            method.pop("label", None)
            made.append(_with_method(unit, f"{host}+dea-paper", {**method, "plugin": {**method["plugin"],
                                                                                     "rule": "paper"}}))
    return made


def host_units(todo: list[Unit]) -> list[tuple[Unit, Unit]]:
    """(host run, its `+dea` run) for every host of `todo` that has both on the same seed."""
    by_key = {(unit.seed, unit.label): unit for unit in todo}
    return [(unit, by_key[unit.seed, f"{unit.label}+dea"]) for unit in todo
            if (unit.seed, f"{unit.label}+dea") in by_key]


def inflation(run: Path) -> float:
    """The mean over rounds of the norm inflation c a finished DEA run logged."""
    from manytask.errors import ManytaskError

    record = load_run(run)
    value = fit_mean(INFLATION)(record, {})
    if not isinstance(value, float):
        raise ManytaskError(f"'{run}' logged no {INFLATION}: the control needs DEA below ρ = 1.")
    return value


def scaled_units(pairs: list[tuple[Unit, Unit]]) -> list[Unit]:
    """Each host alone with its server step scaled by the c its DEA run logged on the same seed (`<host>×c`)."""
    made = []
    for host, dea in pairs:
        method = _method(yaml.safe_load(host.config))
        method.pop("label", None)
        made.append(_with_method(host, f"{host.label}×c", {**method, "server_lr": inflation(dea.out)}))
    return made


def control_order(todo: list[Unit]) -> list[Unit]:
    """Seed by seed and host by host: the host, its DEA run, its × c run, its eq. 6 run, then its other plug-ins'
    runs in the config's order, so the table reads by host."""
    rank = ("", "+dea", "×c", "+dea-paper")
    hosts = list(dict.fromkeys(host_of_label(u.label) for u in todo))

    def key(unit: Unit) -> tuple[int, int, int]:
        suffix = unit.label.removeprefix(host_of_label(unit.label))
        return unit.seed, hosts.index(host_of_label(unit.label)), rank.index(suffix) if suffix in rank else len(rank)

    return sorted(todo, key=key)


def host_of_label(label: str) -> str:
    """The host of a grid's or the control's member label (`fedavg+dea-paper`, `fedavg×c` -> `fedavg`)."""
    return label.removesuffix("×c").split("+", 1)[0]


def minutes(seconds: float) -> str:
    """An estimate as the runner words it: whole minutes (at least one), hours from 90 minutes on."""
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{max(1, math.ceil(seconds / 60))} min"


def server_step_control(experiment: PaperExperiment, scale: Scale, config: RunConfig, out: Path, workers: Workers,
                        probe: bool) -> list[Unit]:
    """The results page's control: stage 1 runs every host alone and with DEA (the scale's members) and each
    stateful host with DEA's eq. 6; stage 2 runs each host with `server_lr` = the mean c its DEA run logged on the
    same seed. The estimate counts a stage-2 run as its host's."""
    first = units(config, out, scale.members)
    first += paper_rule_units(first)
    pairs = host_units(first)
    if probe and pending(first):
        stand_ins = [replace(host, out=out / f"seed{host.seed}" / f"{host.label}×c") for host, _ in pairs]
        todo = pending(first) + pending(stand_ins)
        workers.log(f"{len(todo)} runs to go in two stages, {workers.jobs} at a time: about "
                    f"{minutes(estimate(todo, workers.jobs))} (from a one-round probe of each member)")
    run_with_estimate(first, workers, probe=False)
    second = scaled_units(pairs)
    run_with_estimate(second, workers, probe=False)
    return control_order(first + second)


# --- Fig. 2: where each task's top-10 % update entries lie -----------------------------------------------------

OVERLAP_FILE = "update_overlap.json"
TOP_FRACTION = 0.1  # Fig. 2 shows the top 10 % of each task's update


def top_masks(flat_updates: list[Tensor], fraction: float = TOP_FRACTION) -> list[Tensor]:
    """Each update's ⌊fraction·d⌋ entries of largest magnitude, as a boolean mask."""
    import torch

    masks = []
    for flat in flat_updates:
        mask = torch.zeros(flat.numel(), dtype=torch.bool)
        mask[torch.topk(flat.abs(), max(1, math.floor(fraction * flat.numel()))).indices] = True
        masks.append(mask)
    return masks


def overlap(masks: list[Tensor]) -> dict[str, float]:
    """Mean pairwise Jaccard index of the masks, and the mean share of a mask's entries that no other mask holds
    (both 0 and 1 where the tasks' entries are mutually exclusive, as the paper's Fig. 2 shows them)."""
    import torch

    pairs = [(a, b) for i, a in enumerate(masks) for b in masks[:i]]
    jaccard = statistics.fmean(float((a & b).sum() / (a | b).sum()) for a, b in pairs) if pairs else 0.0
    holders = torch.stack(masks).sum(dim=0)
    exclusive = statistics.fmean(float((m & (holders == 1)).sum() / m.sum()) for m in masks)
    return {"jaccard": jaccard, "exclusive": exclusive}


def shared_overlap(updates: list[Any]) -> dict[str, float]:
    """`overlap` of the clients' top-10 % sets over the parameters every client trained (the shared encoder: each
    decoder is one task's alone, so its entries would be exclusive by construction)."""
    import torch

    deltas = [u.deltas() for u in updates]
    shared = [k for k in deltas[0] if all(k in d for d in deltas[1:])]
    flats = [torch.cat([d[k].reshape(-1).double() for k in shared]) for d in deltas]
    return overlap(top_masks(flats))


def _run_recording_overlap(unit: Unit) -> tuple[Unit, float]:
    """One run from scratch with the server recording, every round, where the clients' top-10 % update entries
    lie (`update_overlap.json` in the run's folder); a finished run with that file is kept."""
    from manytask.config import validate
    from manytask.launch import run_config
    from manytask.methods.hosts.server import HostServer
    from manytask.rundir import RunDir

    began = time.perf_counter()
    if RunDir(unit.out).is_finished() and (unit.out / OVERLAP_FILE).is_file():
        return unit, 0.0
    shutil.rmtree(unit.out, ignore_errors=True)  # the rounds before a stop were not recorded: start again
    rounds: list[dict[str, float]] = []
    original = HostServer.read_updates

    def recording(server: HostServer, replies: Mapping[int, Any]) -> list[Any]:
        updates = original(server, replies)
        rounds.append(shared_overlap(updates))
        return updates

    HostServer.read_updates = recording  # type: ignore[method-assign]  # this worker's process only, undone below
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            run_config(validate(yaml.safe_load(unit.config)), unit.out)
    finally:
        HostServer.read_updates = original  # type: ignore[method-assign]
    (unit.out / OVERLAP_FILE).write_text(json.dumps({"fraction": TOP_FRACTION, "rounds": rounds}, indent=1) + "\n")
    return unit, time.perf_counter() - began


def update_overlap_runner(experiment: PaperExperiment, scale: Scale, config: RunConfig, out: Path, workers: Workers,
                          probe: bool) -> list[Unit]:
    """Fig. 2's runner: each member once per seed, recording where its clients' top-10 % update entries lie."""
    todo = units(config, out, scale.members)
    left = [u for u in todo if not (u.out / OVERLAP_FILE).is_file()]
    if probe and left:
        workers.log(f"{len(left)} runs to go, {workers.jobs} at a time: about {minutes(estimate(left, workers.jobs))} "
                    "(from a one-round probe)")
    for done, future in enumerate([workers.pool.submit(_run_recording_overlap, u) for u in left], 1):
        unit, seconds = future.result()
        workers.log(f"[{done}/{len(left)}] seed {unit.seed} {unit.label}: {seconds:.0f} s")
    return todo


def overlap_at(key: str, which: int) -> Measure:
    """A figure of `update_overlap.json` (`jaccard` or `exclusive`, in %) at round `which` (0: the first, -1: the
    last)."""

    def measure(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
        path = record.path / OVERLAP_FILE
        if not path.is_file():
            return None
        rounds = json.loads(path.read_text())["rounds"]
        return 100 * float(rounds[which][key]) if rounds else None

    return measure


RUNNERS["server-step-control"] = server_step_control
RUNNERS["update-overlap"] = update_overlap_runner

"""What SFMTL-Graph's experiments need beyond the plain `members` runner: runs shared between the experiments of
one config, the local computation of a round counted in FLOPs, and the t-SNE of the clients' feature anchors.

- **Shared runs.** Fig. 2, the communication figure and Tables I and II read the same runs of one config. Before
  running, a pending run is taken (hard-linked, else copied) from a finished run of a sibling experiment's folder
  (`OUT/../*/seed<s>/<label>`, or `OUT/../../*/<scale>/seed<s>/<label>` in the default layout) whose config has the
  same `config_hash`, so a config's runs are paid once. Smoke runs are never shared: they fingerprint this tree.
- **FLOPs.** `torch.utils.flop_counter.FlopCounterMode` counts every matrix product and convolution (forward and
  backward) the clients run in one round: the member's own config, its first round on the local engine, clients
  one after another, counting inside the transport's `fit` only, so the server's aggregation and the evaluation are
  left out and pFedMe's K inner steps per batch, SFMTL-Graph's anchor loss and everything else a client computes are
  in. The count per client that trained is written to `flops.json` in the member's run folder.
- **Anchors.** A finished run's checkpoint keeps every client's last anchors (its state, `client/<id>/anchors`),
  one row per class: the rows of the classes the client holds (read from its training labels) are the points of
  the paper's Fig. 4, embedded with sklearn's t-SNE and drawn coloured by true group into `anchors_tsne.png`, with
  the points and two numbers of how they lie in `anchors_tsne.json`."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import statistics
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml

from manytask.engine.client_runner import ClientRunner
from manytask.engine.local import InProcessTransport
from manytask.engine.loop import FitOutcome, Payloads, RoundLoop
from manytask.experiments.runner import RUNNERS, Unit, Workers, pending, run_with_estimate, units
from manytask.experiments.spec import PaperExperiment, Scale, Value
from manytask.report.runs import RunRecord

if TYPE_CHECKING:
    from manytask.config import RunConfig
    from manytask.experiments.spec import Measure

FLOPS_FILE = "flops.json"
TSNE_FILE = "anchors_tsne.json"
TSNE_FIGURE = "anchors_tsne.png"
ANCHORS = "anchors"


# --- shared runs ------------------------------------------------------------------------------------------------

def _config_hash(text: str) -> str:
    from manytask.config import validate
    from manytask.engine.checkpoint import config_hash

    return config_hash(validate(yaml.safe_load(text)))


def sibling_runs(unit: Unit, out: Path) -> list[Path]:
    """Finished runs of the same seed and label in sibling experiments' folders (candidates, not checked)."""
    from manytask.rundir import RunDir

    tail = f"seed{unit.seed}/{unit.label}"
    found = [*out.parent.glob(f"*/{tail}"), *out.parent.parent.glob(f"*/{out.name}/{tail}")]
    return [path for path in found if path.resolve() != unit.out.resolve() and RunDir(path).is_finished()]


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def adopt_sibling_run(unit: Unit, out: Path) -> Path | None:
    """Take a finished run with the unit's config from a sibling experiment; the run taken, or None."""
    if unit.out.exists():
        return None
    wanted = _config_hash(unit.config)
    for path in sibling_runs(unit, out):
        if (path / "config.yaml").is_file() and _config_hash((path / "config.yaml").read_text()) == wanted:
            unit.out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(path, unit.out, copy_function=_link_or_copy)
            return path
    return None


def shared_members(experiment: PaperExperiment, scale: Scale, config: RunConfig, out: Path, workers: Workers,
                   probe: bool) -> list[Unit]:
    """The `members` runner, taking runs already made by sibling experiments on the same config (not at smoke
    scale: a smoke run is the fingerprint of this tree, and cheap)."""
    todo = units(config, out, scale.members)
    for unit in pending(todo) if scale != experiment.scales.get("smoke") else []:
        taken = adopt_sibling_run(unit, out)
        if taken is not None:
            workers.log(f"seed {unit.seed} {unit.label}: the finished run of {taken}")
    run_with_estimate(todo, workers, probe)
    return todo


# --- FLOPs ------------------------------------------------------------------------------------------------------

class CountingTransport(InProcessTransport):
    """The local engine's transport, clients one after another, counting the FLOPs of their training."""

    def __init__(self, runner: ClientRunner) -> None:
        super().__init__(runner, batched=False)
        self.flops = 0
        self.clients = 0

    def fit(self, round_index: int, payloads: Payloads, simulated_drops: set[int]) -> FitOutcome:
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        with counter:
            outcome = super().fit(round_index, payloads, simulated_drops)
        self.flops += counter.get_total_flops()
        self.clients += len(outcome.replies)
        return outcome


def round_flops(config_text: str) -> dict[str, float]:
    """The FLOPs of the clients' training in the first round of the single-method config `config_text`, in all
    and per client that trained (one torch thread, clients one after another, in a throwaway run folder)."""
    from manytask.config import to_yaml, validate
    from manytask.experiment import Experiment
    from manytask.rundir import RunDir

    config = validate({**yaml.safe_load(config_text), "execution": "sequential", "workers": 1})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with (torch.random.fork_rng(devices=[]), tempfile.TemporaryDirectory(prefix="manytask-flops-") as folder,
              contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO())):
            experiment = Experiment.build(config)
            run_dir = RunDir(Path(folder) / "run")
            run_dir.start(to_yaml(experiment.config), experiment.federation_record())
            runner = ClientRunner(experiment)
            transport = CountingTransport(runner)
            RoundLoop(experiment, run_dir, transport, None, server_device=runner.device).run(stop_after=1)
    finally:
        torch.set_num_threads(threads)
    return {"round_flops": float(transport.flops), "clients": float(transport.clients),
            "flops_per_client": transport.flops / max(1, transport.clients)}


def flops_members(experiment: PaperExperiment, scale: Scale, config: RunConfig, out: Path, workers: Workers,
                  probe: bool) -> list[Unit]:
    """The members' runs, then each one's local FLOPs of a round (`round_flops`) into its `flops.json`."""
    todo = shared_members(experiment, scale, config, out, workers, probe)
    for unit in todo:
        path = unit.out / FLOPS_FILE
        if not path.is_file():
            path.write_text(json.dumps(round_flops(unit.config), indent=1) + "\n")
    return todo


def local_gflops(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
    """GFLOPs of one client's local computation in a round (`flops.json` of the FLOPs runner)."""
    path = record.path / FLOPS_FILE
    return json.loads(path.read_text())["flops_per_client"] / 1e9 if path.is_file() else None


def gflops_ratio(base: str) -> Measure:
    """The member's local FLOPs per round over those of member `base` on the same seed."""

    def measure(record: RunRecord, runs: Mapping[str, RunRecord]) -> Value:
        mine, theirs = local_gflops(record, runs), local_gflops(runs[base], runs) if base in runs else None
        if not isinstance(mine, float) or not isinstance(theirs, float) or theirs == 0:
            return None
        return mine / theirs

    return measure


# --- anchors and their t-SNE ------------------------------------------------------------------------------------

def client_anchor_points(record: RunRecord) -> list[tuple[int, int, torch.Tensor]]:
    """(client, class, anchor) for every class each client holds, from the run's final checkpoint (clients that
    never trained have no anchors and are left out)."""
    from manytask.config import validate
    from manytask.engine.checkpoint import load_checkpoint
    from manytask.experiment import make_benchmark

    checkpoint = load_checkpoint(record.path / "checkpoint.safetensors")
    holdings = json.loads((record.path / "federation.json").read_text())["clients"]
    benchmark = make_benchmark(validate(record.config))
    points = []
    for client, state in sorted(checkpoint.clients.items()):
        if ANCHORS not in state:
            continue
        classes: set[int] = set()
        for task, indices in holdings[client].items():
            classes |= set(benchmark.tasks[task].y_train[indices].unique().tolist())
        points += [(client, c, state[ANCHORS][c].float()) for c in sorted(classes)]
    return points


def embed(anchors: torch.Tensor, seed: int = 0) -> list[list[float]]:
    """2-D t-SNE of the anchor rows (cosine distances, as the paper compares anchors; perplexity at most 30 and
    below a third of the points)."""
    from sklearn.manifold import TSNE

    perplexity = max(1.0, min(30.0, (len(anchors) - 1) / 3))
    found = TSNE(2, perplexity=perplexity, metric="cosine", init="random", random_state=seed).fit_transform(
        anchors.double().numpy())
    return found.tolist()


def neighbour_agreement(points: list[list[float]], groups: list[Any]) -> float | None:
    """The share of points whose nearest other point (Euclidean, in the embedding) has the same group."""
    if len(points) < 2:
        return None
    same = 0
    for i, (x, y) in enumerate(points):
        nearest = min((j for j in range(len(points)) if j != i),
                      key=lambda j: math.dist((x, y), points[j]))
        same += groups[nearest] == groups[i]
    return same / len(points)


def class_cosines(anchors: torch.Tensor, clients: list[int], classes: list[int],
                  groups: Mapping[int, Any]) -> tuple[float | None, float | None]:
    """Mean cosine between anchors of the same class held by two clients of the same true group, and by two
    clients of different groups."""
    unit = torch.nn.functional.normalize(anchors.double(), dim=1)
    cosine = (unit @ unit.T).tolist()
    within: list[float] = []
    across: list[float] = []
    for i in range(len(clients)):
        for j in range(i + 1, len(clients)):
            if classes[i] == classes[j] and clients[i] != clients[j]:
                same = groups.get(clients[i]) == groups.get(clients[j])
                (within if same else across).append(cosine[i][j])
    return (statistics.fmean(within) if within else None, statistics.fmean(across) if across else None)


def anchor_tsne(record: RunRecord) -> dict[str, Any] | None:
    """The anchors' t-SNE points and how they lie (see `neighbour_agreement`, `class_cosines`); None for a run
    without anchors or without true groups."""
    from manytask.report.graph import client_groups

    groups = client_groups(record)
    points = client_anchor_points(record) if (record.path / "checkpoint.safetensors").is_file() else []
    if groups is None or len(points) < 3:
        return None
    clients, classes = [p[0] for p in points], [p[1] for p in points]
    anchors = torch.stack([p[2] for p in points])
    embedded = embed(anchors, int(record.summary.get("seed") or 0))
    within, across = class_cosines(anchors, clients, classes, groups)
    labels = [groups.get(c) for c in clients]
    return {"round": int(record.summary.get("rounds") or 0), "clients": clients, "classes": classes,
            "groups": labels, "points": embedded, "same_group_neighbour": neighbour_agreement(embedded, labels),
            "cosine_same_group": within, "cosine_other_groups": across}


def draw_anchor_tsne(found: Mapping[str, Any], title: str, path: Path) -> Path:
    """The t-SNE points coloured by true group, marked by class and labelled by client (the paper's Fig. 4)."""
    from matplotlib.lines import Line2D

    from manytask.report.plots import new_figure, run_color, save_figure

    figure = new_figure((6.4, 5.2))
    axes = figure.add_subplot()
    groups = sorted(set(found["groups"]), key=str)
    classes = sorted(set(found["classes"]))
    markers = "os^Dv<>phP*X"
    for (x, y), client, cls, group in zip(found["points"], found["clients"], found["classes"], found["groups"],
                                          strict=True):
        color = run_color(groups.index(group), len(groups))
        axes.scatter([x], [y], color=color, marker=markers[classes.index(cls) % len(markers)], s=28)
        axes.annotate(str(client), (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points", color="dimgray")
    handles = [Line2D([], [], color=run_color(i, len(groups)), marker="o", linestyle="", label=f"group {g}")
               for i, g in enumerate(groups)]
    handles += [Line2D([], [], color="gray", marker=markers[i % len(markers)], linestyle="", label=f"class {c}")
                for i, c in enumerate(classes)]
    axes.legend(handles=handles, fontsize=7, loc="best", ncol=2)
    axes.set_title(title)
    axes.set_xticks([])
    axes.set_yticks([])
    return save_figure(figure, path)


def tsne_members(experiment: PaperExperiment, scale: Scale, config: RunConfig, out: Path, workers: Workers,
                 probe: bool) -> list[Unit]:
    """The members' runs, then each SFMTL-Graph run's anchor t-SNE into its folder (figure and numbers)."""
    from manytask.report.runs import load_run

    todo = shared_members(experiment, scale, config, out, workers, probe)
    for unit in todo:
        if (unit.out / TSNE_FILE).is_file():
            continue
        record = load_run(unit.out)
        found = anchor_tsne(record)
        (unit.out / TSNE_FILE).write_text(json.dumps(found, indent=1) + "\n")
        if found is not None:
            draw_anchor_tsne(found, f"{unit.label}, seed {unit.seed}: clients' anchors after round "
                                    f"{found['round']} (t-SNE)", unit.out / TSNE_FIGURE)
    return todo


def tsne_value(key: str, scale: float = 1.0) -> Measure:
    """A number of the run's `anchors_tsne.json`, times `scale`."""

    def measure(record: RunRecord, _: Mapping[str, RunRecord]) -> Value:
        path = record.path / TSNE_FILE
        found = json.loads(path.read_text()) if path.is_file() else None
        value = None if found is None else found.get(key)
        return None if value is None else scale * float(value)

    return measure


RUNNERS.update({"sfmtl-shared": shared_members, "sfmtl-flops": flops_members, "sfmtl-anchors": tsne_members})

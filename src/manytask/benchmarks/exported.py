"""Node-local data for real deployments: `manytask export-partitions CONFIG DIR` writes each client's partition to
a folder of its own, and the test sets to the server's, so that a SuperNode reads only its own data and the
ServerApp never sees a client's.

    DIR/config.yaml           the config to deploy: `benchmark: {name: exported, path: DIR/server, export: ID}`
    DIR/server/               manifest.json (tasks, input shape, every client's sample counts) + test.safetensors
    DIR/client-<k>/           manifest.json (the same, naming client k) + data.safetensors (its training rows and
                              the test sets of the tasks it holds)

A SuperNode is started with `--node-config "partition-id=k data-path=DIR/client-k"` (copy only that folder to its
machine). On a node, the `exported` benchmark reads the folder its node config names instead of `path`; a folder
of another client or another export is refused in one sentence, and that client fails the run's rounds with it.
The federation is the exported one: each client's rows are its partition, in the order the full run used, so a
deployment on exported data gives the numbers of the original config."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from pydantic import Field
from safetensors.torch import load_file, save_file
from torch import Tensor

from manytask.benchmarks.base import Benchmark
from manytask.benchmarks.registry import register_benchmark
from manytask.errors import ManytaskError
from manytask.federation.federation import Federation
from manytask.federation.fingerprint import client_fingerprint
from manytask.input_limits import shown_path
from manytask.registry import Params
from manytask.tasks.task import Task, TaskKind, TaskSpec

MANIFEST, TESTS, DATA = "manifest.json", "test.safetensors", "data.safetensors"
FINGERPRINTS_KEY = "client_fingerprints"  # each client's training rows at export (`federation/fingerprint.py`)
FEDERATION_KEY = "exported_federation"  # benchmark metadata: the exported client table, used as the federation


class ExportedParams(Params):
    path: str = Field(description="the server's folder of an export (a node reads the folder its node config names)")
    export: str = Field(description="the export's id (export-partitions writes it): a folder of another export is "
                        "refused")
    node: str | None = Field(default=None, description="set by a SuperNode from its data-path: a client's folder")


@register_benchmark("exported", ExportedParams, "partitions written by manytask export-partitions (node-local data)")
def exported(params: ExportedParams, seed: int) -> Benchmark:
    folder = Path(params.node or params.path)
    manifest = read_manifest(folder, params.export)
    if params.node is None and manifest["client"] is not None:
        raise ManytaskError(f"'{shown_path(folder)}' is client {manifest['client']}'s folder; benchmark.path names "
                            "the server's folder of the export (DIR/server).")
    tensors = load_file(str(folder / (TESTS if manifest["client"] is None else DATA)))
    tasks = {name: _task(name, info, manifest["input_shape"], tensors) for name, info in manifest["tasks"].items()}
    sizes = manifest["sizes"]
    federation = Federation([{task: np.arange(n) for task, n in held.items()} for held in sizes])
    recorded = manifest.get(FINGERPRINTS_KEY)
    if manifest["client"] is not None and recorded is not None:
        _check_rows(folder, tasks, manifest["client"], recorded[manifest["client"]])
    return Benchmark("exported", tasks, f"export {params.export}", {FEDERATION_KEY: federation,
                                                                     "export_client": manifest["client"],
                                                                     FINGERPRINTS_KEY: recorded})


def _check_rows(folder: Path, tasks: dict[str, Task], client: int, recorded: str) -> None:
    """A client's folder holds the rows it was exported with (one sentence where its file was changed since)."""
    found = client_fingerprint({name: (t.x_train, t.y_train) for name, t in tasks.items()})
    if found != recorded:
        raise ManytaskError(f"data folder '{shown_path(folder)}' holds other training data than client {client} was "
                            f"exported with (data fingerprint {found}, exported {recorded}); export the partitions "
                            "again.")


def read_manifest(folder: Path, export: str) -> dict[str, Any]:
    where = f"data folder '{shown_path(folder)}'"
    if not (folder / MANIFEST).is_file():
        raise ManytaskError(f"{where} has no {MANIFEST}; give a folder manytask export-partitions wrote.")
    manifest = json.loads((folder / MANIFEST).read_text())
    if manifest.get("export") != export:
        raise ManytaskError(f"{where} belongs to export {manifest.get('export')}, not to this run's export {export}.")
    return manifest


def check_node_folder(folder: Path, export: str, client: int) -> None:
    """A SuperNode's data-path holds this client's partition of this export (one sentence otherwise)."""
    manifest = read_manifest(folder, export)
    if manifest["client"] != client:
        owner = "the server's test sets" if manifest["client"] is None else f"client {manifest['client']}'s partition"
        raise ManytaskError(f"data-path '{shown_path(folder)}' holds {owner}, not client {client}'s.")


def _task(name: str, info: dict[str, Any], input_shape: list[int], tensors: dict[str, Tensor]) -> Task:
    spec = TaskSpec(name, TaskKind(info["kind"]), info["num_outputs"], info["loss_choice"])
    empty_x = torch.zeros((0, *input_shape))
    empty_y = torch.zeros((0, *info["target_shape"]), dtype=getattr(torch, info["target_dtype"]))
    part = {split: (tensors.get(f"{split}/{name}/x", empty_x), tensors.get(f"{split}/{name}/y", empty_y))
            for split in ("train", "test")}
    return Task(spec, *part["train"], *part["test"])


def export_partitions(experiment: Any, out: Path) -> Path:
    """Write `experiment`'s partitions under `out` (see the module's docstring); returns the config to deploy."""
    bench, federation, config = experiment.benchmark, experiment.federation, experiment.config
    if experiment.setup.pretrained is not None:
        raise ManytaskError("export-partitions does not carry a pretrained backbone yet; give the model its "
                            "weights file (model.weights) or drop model.pretrained.")
    tasks = {name: {"kind": t.spec.kind.value, "num_outputs": t.spec.num_outputs, "loss_choice": t.spec.loss_choice,
                    "target_shape": list(t.y_train.shape[1:]), "target_dtype": str(t.y_train.dtype).split(".")[1]}
             for name, t in bench.tasks.items()}
    sizes = [{t: len(idx) for t, idx in held.items()} for held in federation.clients]
    export = hashlib.sha256(json.dumps([config.model_dump(mode="json"), tasks, sizes], sort_keys=True,
                                       default=str).encode()).hexdigest()[:16]
    fingerprints = [experiment.client_fingerprint(c) for c in range(federation.num_clients)]
    base = {"export": export, "tasks": tasks, "input_shape": list(bench.input_shape), "sizes": sizes,
            FINGERPRINTS_KEY: fingerprints}
    if out.exists() and any(out.iterdir()):
        raise ManytaskError(f"'{shown_path(out)}' is not empty; export into a new folder.")
    _write(out / "server", {**base, "client": None},
           {f"test/{n}/{k}": v for n, t in bench.tasks.items() for k, v in (("x", t.x_test), ("y", t.y_test))})
    for client, held in enumerate(federation.clients):
        rows = {}
        for name, indices in held.items():
            task = bench.tasks[name]
            rows |= {f"train/{name}/x": task.x_train[indices], f"train/{name}/y": task.y_train[indices],
                     f"test/{name}/x": task.x_test, f"test/{name}/y": task.y_test}
        _write(out / f"client-{client}", {**base, "client": client}, rows)
    deployed = config.model_dump(mode="json")
    deployed["benchmark"] = {"name": "exported", "path": str((out / "server").resolve()), "export": export}
    (out / "config.yaml").write_text(yaml.safe_dump(deployed, sort_keys=False))
    return out / "config.yaml"


def _write(folder: Path, manifest: dict[str, Any], tensors: dict[str, Tensor]) -> None:
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / (TESTS if manifest["client"] is None
                                                                            else DATA)))
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")

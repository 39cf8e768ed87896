"""`samples: {kind: flwr, partitioner: NAME, ...}`: Flower Datasets' partitioners (the `hf` extra installs
`flwr-datasets`), run on each task in turn.

    federation: {num_clients: 10, tasks: {kind: all}, samples: {kind: flwr, partitioner: dirichlet, alpha: 0.3}}

Like every sample partitioner this one splits ONE task's training samples among the clients that hold it: per task,
the Flower partitioner gets as many partitions as the task has holders, and holder k (in client order) gets partition
k. What it partitions is a `datasets.Dataset` of the task's training labels (column `label`), the natural client of
each sample where the benchmark records one (column `group`: an hf benchmark's `partition_by`, a shakespeare
speaker) and each sample's index (column `index`, which is read back). As Flower's `FederatedDataset` does, the rows
are shuffled first and the partitioner gets the same seed: an integer drawn from the task's partition stream of the
run's seed. Holder shares that a task allocation gives are not used (a Flower partitioner sizes its partitions
itself), and samples it leaves out (an incomplete shard) belong to no client."""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from manytask.errors import ManytaskError, clipped
from manytask.extras import require
from manytask.federation.partition import SAMPLE_PARTITIONERS, TaskSamples, labels_of
from manytask.registry import Params


@dataclass(frozen=True)
class FlowerKind:
    """A Flower Datasets partitioner: its class, the options of `FlowerParams` it takes, the column it reads."""

    cls: str
    options: tuple[str, ...] = ()
    column: str | None = None


FLOWER_KINDS = {
    "iid": FlowerKind("IidPartitioner"),
    "dirichlet": FlowerKind("DirichletPartitioner", ("alpha", "min_partition_size", "self_balancing"), "label"),
    "pathological": FlowerKind("PathologicalPartitioner", ("num_classes_per_partition", "class_assignment_mode"),
                               "label"),
    "shard": FlowerKind("ShardPartitioner", ("num_shards_per_partition", "shard_size", "keep_incomplete_shard"),
                        "label"),
    "natural-id": FlowerKind("NaturalIdPartitioner", (), "group"),
}


class FlowerParams(Params):
    partitioner: Literal["iid", "dirichlet", "pathological", "shard", "natural-id"] = Field(
        "iid", description="Flower Datasets' IidPartitioner, DirichletPartitioner, PathologicalPartitioner, "
        "ShardPartitioner or NaturalIdPartitioner (by the benchmark's natural clients)")
    alpha: float = Field(0.5, gt=0, description="dirichlet: the concentration")
    min_partition_size: int = Field(10, ge=0, description="dirichlet: redraw until every partition has this many")
    self_balancing: bool = Field(False, description="dirichlet: stop giving samples to partitions above the average")
    num_classes_per_partition: int = Field(2, ge=1, description="pathological: classes per partition")
    class_assignment_mode: Literal["random", "deterministic", "first-deterministic"] = "random"
    num_shards_per_partition: int | None = Field(None, ge=1, description="shard: shards per partition")
    shard_size: int | None = Field(None, ge=1, description="shard: samples per shard")
    keep_incomplete_shard: bool = False

    @model_validator(mode="after")
    def _options_of_the_partitioner(self) -> FlowerParams:
        foreign = sorted(self.model_fields_set - {"partitioner", *FLOWER_KINDS[self.partitioner].options})
        if foreign:
            takes = ", ".join(FLOWER_KINDS[self.partitioner].options) or "no options"
            raise ValueError(f"'{foreign[0]}' is not an option of the {self.partitioner} partitioner, which takes "
                             f"{takes}")
        return self


@SAMPLE_PARTITIONERS.register("flwr", FlowerParams, "a Flower Datasets partitioner (iid, dirichlet, pathological, "
                              "shard, natural-id) per task over its holders")
def _flower(samples: TaskSamples, params: FlowerParams, rng: np.random.Generator) -> list[np.ndarray]:
    kind = FLOWER_KINDS[params.partitioner]
    seed = int(rng.integers(2**32))
    table = flower_table(samples, kind.column).shuffle(seed=seed)
    partitioner = flower_partitioner(kind, params, len(samples.shares), seed)
    partitioner.dataset = table
    try:
        with warnings.catch_warnings():  # one per Dirichlet redraw; the last attempt's failure is the error below
            warnings.filterwarnings("ignore", "The specified min_partition_size", UserWarning)
            parts = [np.asarray(partitioner.load_partition(k)["index"], dtype=np.int64)
                     for k in range(partitioner.num_partitions)]
    except ValueError as err:
        raise _refusal(kind, err) from None
    _check_holders(samples, parts, params.partitioner)
    return parts


def flower_table(samples: TaskSamples, column: str | None) -> Any:
    """The task's samples as a `datasets.Dataset`: `index`, and `label` / `group` where the partitioner reads them."""
    datasets = require("datasets", "sample partitioner 'flwr'")
    columns: dict[str, Any] = {"index": np.arange(samples.num_samples)}
    if column == "label":
        columns["label"] = labels_of(samples, "flwr")
    if column == "group":
        if samples.groups is None:
            raise ManytaskError(f"the benchmark of task '{samples.task}' records no natural client of its samples, "
                                "which the natural-id partitioner reads; set the hf benchmark's partition_by.")
        columns["group"] = samples.groups
    return datasets.Dataset.from_dict(columns)


def flower_partitioner(kind: FlowerKind, params: FlowerParams, holders: int, seed: int) -> Any:
    """The Flower partitioner with the chosen options, and what its signature takes of the partition count, the
    column and the seed."""
    cls = getattr(require("flwr_datasets.partitioner", "sample partitioner 'flwr'"), kind.cls)
    given = {"num_partitions": holders, "partition_by": kind.column, "seed": seed}
    accepted = inspect.signature(cls).parameters
    options = {name: getattr(params, name) for name in kind.options}
    try:
        return cls(**options, **{name: value for name, value in given.items() if name in accepted})
    except ValueError as err:
        raise _refusal(kind, err) from None


def _refusal(kind: FlowerKind, err: ValueError) -> ManytaskError:
    """Flower's reason (several lines at times) as one sentence."""
    return ManytaskError(f"Flower Datasets' {kind.cls} refused ({clipped(' '.join(str(err).split()), 240)}).")


def _check_holders(samples: TaskSamples, parts: list[np.ndarray], partitioner: str) -> None:
    """Every holder gets one partition, and some samples."""
    if len(parts) != len(samples.shares):
        raise ManytaskError(f"the {partitioner} partitioner made {len(parts)} partitions (natural clients) for "
                            f"{len(samples.shares)} holders; set federation.num_clients: {len(parts)} with tasks: "
                            "{kind: all}.")
    empty = [k for k, part in enumerate(parts) if len(part) == 0]
    if empty:
        raise ManytaskError(f"the {partitioner} partitioner left holder {empty[0]} with no samples; use fewer "
                            "clients or other options.")

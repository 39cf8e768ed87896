"""`hf`: a Hugging Face dataset (the `hf` extra installs `datasets`), one classification task per label column, all on
one input column.

    benchmark: {name: hf, path: data/my_ds, input: image, tasks: {digit: label, parity: is_even}}
    benchmark: {name: hf, path: flwrlabs/femnist, input: image, tasks: [character], partition_by: writer_id,
                test_split: null}

`path` is a folder written by `save_to_disk`, or else a Hub id (`owner/name`, with `config` and `revision`) that
`datasets.load_dataset` loads: from the Hub, or offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE) from the local
`datasets` cache alone. A `DatasetDict` gives its `train_split` and `test_split`; a single `Dataset`, or
`test_split: null`, holds out `test_fraction` of the training rows, drawn from the run's seed. With `tasks` left out,
every `ClassLabel` column is a task named after it. `partition_by` names a column holding each row's natural client
(FEMNIST's `writer_id`): every task then records its training rows' groups, so `samples: {kind: natural}` gives one
client per distinct id (in sorted order; the benchmark's metadata `natural_ids` lists them). Rows become tensors as
`Benchmark.from_datasets` makes them (PIL images as channels-first floats in [0, 1])."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field

from manytask.benchmarks.base import Benchmark, record_natural_groups
from manytask.benchmarks.registry import register_benchmark
from manytask.errors import ManytaskError, clipped
from manytask.extras import require
from manytask.input_limits import shown_path
from manytask.registry import Params

HUB_ID = re.compile(r"[\w-][\w.-]*/[\w.-]+")  # owner/name; anything else is taken for a folder


class HfSource(Params):
    """Where a Hugging Face dataset comes from and how it splits into training and test rows."""

    path: str = Field(description="a folder written by datasets' save_to_disk (a Dataset or a DatasetDict), or a "
                      "Hugging Face Hub id owner/name")
    config: str | None = Field(default=None, description="a Hub id: the dataset's configuration (load_dataset's name)")
    revision: str | None = Field(default=None, description="a Hub id: a branch, tag or commit")
    train_split: str = "train"
    test_split: str | None = Field(default="test", description="none: hold out test_fraction of the train split")
    test_fraction: float = Field(default=0.2, gt=0, lt=1, description="a single Dataset or test_split none: the "
                                 "share of rows held out for testing, drawn from the seed")


class HfParams(HfSource):
    input: str | None = Field(default=None, description="the input column (none: image, img, pixel_values, ...)")
    tasks: dict[str, str] | list[str] | None = Field(
        default=None, description="task -> label column, or label columns (tasks named after them); none: every "
        "ClassLabel column")
    partition_by: str | None = Field(default=None, description="a column holding each row's natural client id "
                                     "(writer_id): samples: {kind: natural} then gives one client per id")


@register_benchmark("hf", HfParams, "a Hugging Face dataset (save_to_disk folder or Hub id); a task per label column")
def hf_benchmark(params: HfParams, seed: int) -> Benchmark:
    train, test = load_splits(params, seed, "benchmark hf")
    tasks = _task_columns(train, params.tasks, params.partition_by)
    bench = Benchmark.from_datasets(
        "hf", {task: (train, test) for task in tasks}, f"Hugging Face dataset {params.path}",
        input_key=params.input, label_key=tasks)
    if params.partition_by is not None:
        bench.metadata["natural_ids"] = record_natural_groups(bench.tasks.values(), train[params.partition_by])
    return bench


def load_splits(source: HfSource, seed: int, where: str) -> tuple[Any, Any]:
    """(training rows, test rows) of the dataset `source` names; `where` opens every error (`benchmark hf`)."""
    datasets = require("datasets", where)
    loaded = _load(datasets, source, where)
    if not isinstance(loaded, datasets.DatasetDict):
        return _held_out(loaded, source, seed)
    wanted = [source.train_split] + ([] if source.test_split is None else [source.test_split])
    missing = [split for split in wanted if split not in loaded]
    if missing:
        raise ManytaskError(f"{where}: '{shown_path(source.path)}' has no split '{missing[0]}'; its splits: "
                            f"{', '.join(loaded)} (set train_split / test_split; test_split: null holds out "
                            "test_fraction of the train split).")
    if source.test_split is None:
        return _held_out(loaded[source.train_split], source, seed)
    return loaded[source.train_split], loaded[source.test_split]


def _held_out(rows: Any, source: HfSource, seed: int) -> tuple[Any, Any]:
    halves = rows.train_test_split(test_size=source.test_fraction, seed=seed)
    return halves["train"], halves["test"]


def _load(datasets: Any, source: HfSource, where: str) -> Any:
    """A saved folder through `load_from_disk`, else a Hub id through `load_dataset` (offline: the local cache)."""
    shown = f"{where}: '{shown_path(source.path)}'"
    if Path(source.path).is_dir():
        try:
            return datasets.load_from_disk(source.path)
        except (FileNotFoundError, ValueError) as err:
            raise ManytaskError(f"{shown} is not a dataset saved with save_to_disk ({err}).") from None
    if not HUB_ID.fullmatch(source.path):
        raise ManytaskError(f"{shown} is not a folder; give one that datasets' save_to_disk wrote, or a Hugging Face "
                            "Hub id owner/name.")
    try:
        return datasets.load_dataset(source.path, source.config, revision=source.revision)
    except (ConnectionError, FileNotFoundError, ValueError) as err:
        raise ManytaskError(f"{shown} is not a folder, and datasets could not load it as a Hub id{_offline(datasets)} "
                            f"({clipped(' '.join(str(err).split()), 200)}).") from None


def _offline(datasets: Any) -> str:
    """Where an offline load looked: only the local cache, which an online load fills."""
    if not datasets.config.HF_HUB_OFFLINE:
        return ""
    return (f" from its local cache {shown_path(str(datasets.config.HF_DATASETS_CACHE))} (offline: HF_HUB_OFFLINE "
            "or HF_DATASETS_OFFLINE is set, so load it once online first)")


def _task_columns(train: Any, tasks: dict[str, str] | list[str] | None, partition_by: str | None) -> dict[str, str]:
    """task -> label column, every column checked against the dataset's (the natural-client column is no task)."""
    if partition_by is not None:
        _check_column(train, partition_by, f"partition_by names column '{partition_by}'")
    if tasks is None:
        labels = [name for name, feature in train.features.items()
                  if type(feature).__name__ == "ClassLabel" and name != partition_by]
        if not labels:
            raise ManytaskError(f"benchmark hf: the dataset has no ClassLabel column (its columns: "
                                f"{', '.join(train.column_names)}); name the label columns with tasks.")
        return {name: name for name in labels}
    columns = tasks if isinstance(tasks, dict) else {name: name for name in tasks}
    for task, column in columns.items():
        _check_column(train, column, f"task '{task}' reads column '{column}'")
    return columns


def _check_column(train: Any, column: str, what: str) -> None:
    if column not in train.column_names:
        raise ManytaskError(f"benchmark hf: {what}, which the dataset does not have (its columns: "
                            f"{', '.join(train.column_names)}).")

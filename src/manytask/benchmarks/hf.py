"""`hf`: a Hugging Face dataset saved with `save_to_disk` (the `hf` extra installs `datasets`), one classification
task per label column, all on one input column.

    benchmark: {name: hf, path: data/my_ds, input: image, tasks: {digit: label, parity: is_even}}

A saved `DatasetDict` gives its `train_split` and `test_split`; a single saved `Dataset` is split by `test_fraction`,
drawn from the run's seed. With `tasks` left out, every `ClassLabel` column is a task named after it. Rows become
tensors as `Benchmark.from_datasets` makes them (PIL images as channels-first floats in [0, 1])."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from manytask.benchmarks.base import Benchmark
from manytask.benchmarks.registry import register_benchmark
from manytask.errors import ManytaskError
from manytask.extras import require
from manytask.input_limits import shown_path
from manytask.registry import Params


class HfParams(Params):
    path: str = Field(description="a folder written by datasets' save_to_disk (a Dataset or a DatasetDict)")
    input: str | None = Field(default=None, description="the input column (none: image, img, pixel_values, ...)")
    tasks: dict[str, str] | list[str] | None = Field(
        default=None, description="task -> label column, or label columns (tasks named after them); none: every "
        "ClassLabel column")
    train_split: str = "train"
    test_split: str = "test"
    test_fraction: float = Field(default=0.2, gt=0, lt=1, description="a single saved Dataset: its share held "
                                 "out for testing, drawn from the seed")


@register_benchmark("hf", HfParams, "a Hugging Face dataset saved with save_to_disk; a task per label column")
def hf_benchmark(params: HfParams, seed: int) -> Benchmark:
    datasets = require("datasets", "benchmark hf")
    train, test = _splits(datasets, params, seed)
    tasks = _task_columns(train, params.tasks)
    return Benchmark.from_datasets(
        "hf", {task: (train, test) for task in tasks}, f"Hugging Face dataset {params.path}",
        input_key=params.input, label_key=tasks)


def _splits(datasets: Any, params: HfParams, seed: int) -> tuple[Any, Any]:
    where = f"benchmark hf: '{shown_path(params.path)}'"
    if not Path(params.path).is_dir():
        raise ManytaskError(f"{where} is not a folder; give one that datasets' save_to_disk wrote.")
    try:
        saved = datasets.load_from_disk(params.path)
    except (FileNotFoundError, ValueError) as err:
        raise ManytaskError(f"{where} is not a dataset saved with save_to_disk ({err}).") from None
    if isinstance(saved, datasets.DatasetDict):
        missing = [s for s in (params.train_split, params.test_split) if s not in saved]
        if missing:
            raise ManytaskError(f"{where} has no split '{missing[0]}'; its splits: {', '.join(saved)} "
                                "(set train_split / test_split).")
        return saved[params.train_split], saved[params.test_split]
    halves = saved.train_test_split(test_size=params.test_fraction, seed=seed)
    return halves["train"], halves["test"]


def _task_columns(train: Any, tasks: dict[str, str] | list[str] | None) -> dict[str, str]:
    """task -> label column, every column checked against the dataset's."""
    if tasks is None:
        labels = [name for name, feature in train.features.items() if type(feature).__name__ == "ClassLabel"]
        if not labels:
            raise ManytaskError(f"benchmark hf: the dataset has no ClassLabel column (its columns: "
                                f"{', '.join(train.column_names)}); name the label columns with tasks.")
        return {name: name for name in labels}
    columns = tasks if isinstance(tasks, dict) else {name: name for name in tasks}
    for task, column in columns.items():
        if column not in train.column_names:
            raise ManytaskError(f"benchmark hf: task '{task}' reads column '{column}', which the dataset does not "
                                f"have (its columns: {', '.join(train.column_names)}).")
    return columns

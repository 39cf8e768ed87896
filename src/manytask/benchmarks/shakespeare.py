"""`shakespeare`: LEAF's next-character prediction, one client per speaking role (`samples: {kind: natural}`).

    benchmark: {name: shakespeare, root: leaf/data/shakespeare/data}
    benchmark: {name: shakespeare, path: flwrlabs/shakespeare, speakers: 100}
    model: {backbone: char-lstm}

A sample is 80 characters of a role's lines (`x`) and the character that follows (`y`), each character an id in
LEAF's fixed 80-character vocabulary. `root` holds LEAF's JSON files (`users`, and `user_data`: per user its `x` and
`y` lists): `train/` and `test/` as LEAF's split writes them, or the files themselves (`all_data/`), of which
`test_fraction` is held out from the run's seed. `path` instead names a Hugging Face dataset with LEAF's rows as
columns `character_id`, `x`, `y` (the `hf` benchmark's save_to_disk folder or Hub id; `test_fraction` held out).
Every training sample's speaker is its natural group (the `hf` benchmark's `partition_by` mechanism); `speakers`
keeps those with the most training samples. Inputs are int64 id sequences, which the `char-lstm` backbone embeds."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import Tensor

from manytask.benchmarks.base import Benchmark, record_natural_groups
from manytask.benchmarks.hf import HfSource, load_splits
from manytask.benchmarks.registry import register_benchmark
from manytask.errors import ManytaskError, clipped
from manytask.input_limits import shown_path
from manytask.registry import Params
from manytask.seeding import numpy_rng
from manytask.tasks.task import Task, TaskKind, TaskSpec

VOCABULARY = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"  # LEAF's ALL_LETTERS
CHAR_ID = {char: index for index, char in enumerate(VOCABULARY)}
TASK = "next_char"
Rows = list[tuple[str, str, str]]  # (speaker, x, y)


class ShakespeareParams(Params):
    root: str | None = Field(default=None, description="a folder of LEAF's JSON files: train/ and test/, or files "
                             "to hold test_fraction out of")
    path: str | None = Field(default=None, description="or a Hugging Face dataset with columns character_id, x, y: "
                             "a save_to_disk folder or a Hub id (flwrlabs/shakespeare)")
    revision: str | None = Field(default=None, description="path a Hub id: a branch, tag or commit")
    speakers: int | None = Field(default=None, ge=1, description="keep the speakers with the most training samples "
                                 "(ties by name); none: all")
    test_fraction: float = Field(default=0.2, gt=0, lt=1, description="without LEAF's test/: the share of samples "
                                 "held out for testing, drawn from the seed")

    @model_validator(mode="after")
    def _one_source(self) -> ShakespeareParams:
        if (self.root is None) == (self.path is None):
            raise ValueError("give either root (LEAF's JSON files) or path (a Hugging Face dataset), not both")
        return self


@register_benchmark("shakespeare", ShakespeareParams, "LEAF's next-character prediction, a natural client per speaker")
def shakespeare(params: ShakespeareParams, seed: int) -> Benchmark:
    train, test = _leaf_rows(params, seed) if params.root is not None else _hub_rows(params, seed)
    train, test = _kept_speakers(train, test, params.speakers)
    task = Task(TaskSpec(TASK, TaskKind.CLASSIFICATION, len(VOCABULARY)), *_encoded(train, "train"),
                *_encoded(test, "test"), description="the character after 80 characters of a role's lines")
    speakers = record_natural_groups([task], [speaker for speaker, _, _ in train])
    description = f"Shakespeare next character: {len(train)} training samples of {len(speakers)} speakers"
    return Benchmark("shakespeare", {TASK: task}, description, {"natural_ids": speakers, "vocabulary": VOCABULARY})


def _leaf_rows(params: ShakespeareParams, seed: int) -> tuple[Rows, Rows]:
    root = Path(params.root or "")
    if (root / "train").is_dir() and (root / "test").is_dir():
        return _read_leaf(root / "train"), _read_leaf(root / "test")
    return _held_out(_read_leaf(root), params.test_fraction, seed)


def _read_leaf(folder: Path) -> Rows:
    """Every (speaker, x, y) of the LEAF JSON files in `folder`, in file and user order."""
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not files:
        raise ManytaskError(f"benchmark shakespeare: '{shown_path(folder)}' holds no LEAF JSON files (*.json, or "
                            "train/ and test/ folders of them).")
    return [row for file in files for row in _leaf_file(file)]


def _leaf_file(file: Path) -> Iterator[tuple[str, str, str]]:
    try:
        users = json.loads(file.read_text(encoding="utf-8"))["user_data"]
        for speaker, data in users.items():
            yield from ((speaker, x, y) for x, y in zip(data["x"], data["y"], strict=True))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ManytaskError(f"benchmark shakespeare: '{shown_path(file)}' is not a LEAF JSON file with user_data "
                            f"of x and y lists ({clipped(repr(err))}).") from None


def _hub_rows(params: ShakespeareParams, seed: int) -> tuple[Rows, Rows]:
    source = HfSource(path=params.path or "", revision=params.revision, test_split=None,
                      test_fraction=params.test_fraction)
    where = "benchmark shakespeare"
    train, test = load_splits(source, seed, where)
    missing = [c for c in ("character_id", "x", "y") if c not in train.column_names]
    if missing:
        raise ManytaskError(f"{where}: '{shown_path(source.path)}' has no column '{missing[0]}' (its columns: "
                            f"{', '.join(train.column_names)}); LEAF's rows are character_id, x, y.")
    return _columns(train), _columns(test)


def _columns(rows: Any) -> Rows:
    return list(zip(rows["character_id"], rows["x"], rows["y"], strict=True))


def _held_out(rows: Rows, fraction: float, seed: int) -> tuple[Rows, Rows]:
    order = numpy_rng(seed, "shakespeare", "test").permutation(len(rows))
    cut = len(rows) - max(1, round(fraction * len(rows)))
    return [rows[i] for i in sorted(order[:cut])], [rows[i] for i in sorted(order[cut:])]


def _kept_speakers(train: Rows, test: Rows, count: int | None) -> tuple[Rows, Rows]:
    """The rows of the `count` speakers with the most training samples (all speakers when None)."""
    if count is None:
        return train, test
    sizes = Counter(speaker for speaker, _, _ in train)
    kept = set(sorted(sizes, key=lambda speaker: (-sizes[speaker], speaker))[:count])
    return [r for r in train if r[0] in kept], [r for r in test if r[0] in kept]


def _encoded(rows: Rows, split: str) -> tuple[Tensor, Tensor]:
    """(ids of every x, (N, L) int64; id of every y, (N,)), all in LEAF's vocabulary."""
    if not rows:
        raise ManytaskError(f"benchmark shakespeare: the {split} split has no samples.")
    lengths = {len(x) for _, x, _ in rows}
    if len(lengths) != 1 or any(len(y) != 1 for _, _, y in rows):
        raise ManytaskError(f"benchmark shakespeare: every x must have one length and every y one character; the "
                            f"{split} split has x of lengths {sorted(lengths)[:5]}.")
    x = torch.tensor(np.array([_ids(text, speaker) for speaker, text, _ in rows], dtype=np.int64))
    y = torch.tensor([_ids(label, speaker)[0] for speaker, _, label in rows], dtype=torch.int64)
    return x, y


def _ids(text: Iterable[str], speaker: str) -> list[int]:
    try:
        return [CHAR_ID[char] for char in text]
    except KeyError as err:
        raise ManytaskError(f"benchmark shakespeare: speaker '{clipped(speaker)}' has the character {err} outside "
                            "LEAF's 80-character vocabulary.") from None

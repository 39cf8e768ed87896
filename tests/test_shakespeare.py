"""`benchmark: {name: shakespeare}` with `char-lstm`: LEAF's JSON files of a few speakers written by the test, one
client per speaker through `samples: {kind: natural}`, and fedavg that learns the next character."""

import json

import numpy as np
import pytest
import torch

from manytask import api
from manytask.benchmarks.registry import build_benchmark
from manytask.benchmarks.shakespeare import VOCABULARY
from manytask.errors import ManytaskError

LINES = {  # Hamlet, Act III: every speaker's lines, run together as LEAF does
    "HAMLET": "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings and "
              "arrows of outrageous fortune, or to take arms against a sea of troubles and by opposing end them. "
              "To die, to sleep; no more; and by a sleep to say we end the heart-ache and the thousand natural "
              "shocks that flesh is heir to.",
    "OPHELIA": "Good my lord, how does your honour for this many a day? My lord, I have remembrances of yours that "
               "I have longed long to re-deliver; I pray you, now receive them. My honour'd lord, you know right "
               "well you did; and with them words of so sweet breath composed as made the things more rich.",
    "POLONIUS": "Ophelia, walk you here. Gracious, so please you, we will bestow ourselves. Read on this book; "
                "that show of such an exercise may colour your loneliness. We are oft to blame in this, 'tis too "
                "much proved, that with devotion's visage and pious action we do sugar o'er the devil himself.",
}
WINDOW = 80


def leaf_samples(text: str) -> dict[str, list[str]]:
    """LEAF's samples of one speaker: every 80-character window and the character after it."""
    starts = range(len(text) - WINDOW)
    return {"x": [text[i:i + WINDOW] for i in starts], "y": [text[i + WINDOW] for i in starts]}


def write_leaf(folder, lines=LINES) -> dict[str, int]:
    """One LEAF JSON file (users, num_samples, user_data) of every speaker; returns each speaker's sample count."""
    folder.mkdir(parents=True)
    data = {speaker: leaf_samples(text) for speaker, text in lines.items()}
    (folder / "all_data_0.json").write_text(json.dumps({
        "users": list(data), "num_samples": [len(d["y"]) for d in data.values()], "user_data": data}))
    return {speaker: len(d["y"]) for speaker, d in data.items()}


def test_leaf_files_give_id_sequences_in_leafs_vocabulary_and_a_group_per_speaker(tmp_path):
    counts = write_leaf(tmp_path / "leaf")
    bench = build_benchmark("shakespeare", {"root": str(tmp_path / "leaf"), "test_fraction": 0.25}, seed=0)
    task = bench.tasks["next_char"]
    assert len(VOCABULARY) == 80 and task.spec.num_outputs == 80 and bench.input_shape == (WINDOW,)
    assert task.x_train.dtype == task.x_test.dtype == torch.int64
    assert task.num_train + len(task.y_test) == sum(counts.values())
    assert bench.metadata["natural_ids"] == sorted(LINES)
    groups = task.metadata["sample_groups"]
    assert len(groups) == task.num_train and set(groups.tolist()) == {0, 1, 2}
    text = "".join(VOCABULARY[i] for i in task.x_train[0].tolist()) + VOCABULARY[int(task.y_train[0])]
    assert text in LINES[bench.metadata["natural_ids"][groups[0]]]  # a speaker's sample, decoded


def test_speakers_keeps_the_largest_and_odd_characters_are_one_sentence(tmp_path):
    write_leaf(tmp_path / "leaf")
    every = build_benchmark("shakespeare", {"root": str(tmp_path / "leaf")}, seed=0)
    sizes = np.bincount(every.tasks["next_char"].metadata["sample_groups"])
    largest = sorted(every.metadata["natural_ids"][g] for g in np.argsort(-sizes, kind="stable")[:2])
    two = build_benchmark("shakespeare", {"root": str(tmp_path / "leaf"), "speakers": 2}, seed=0)
    assert two.metadata["natural_ids"] == largest
    write_leaf(tmp_path / "odd", {"YORICK": "Alas, poor Yorick! " * 6 + "I knew him, Horatio | a fellow"})
    with pytest.raises(ManytaskError, match="speaker 'YORICK' has the character '\\|' outside LEAF's"):
        build_benchmark("shakespeare", {"root": str(tmp_path / "odd")}, seed=0)


def test_fedavg_with_char_lstm_learns_the_next_character_with_a_client_per_speaker(tmp_path):
    write_leaf(tmp_path / "leaf")
    params = {"root": str(tmp_path / "leaf"), "test_fraction": 0.2}
    result = api.run({
        "name": "shakespeare", "method": "fedavg", "rounds": 3, "reference": None, "seed": 0,
        "benchmark": {"name": "shakespeare", **params},
        "federation": {"num_clients": 3, "tasks": {"kind": "all"}, "samples": {"kind": "natural"}},
        "model": {"backbone": "char-lstm", "hidden": 64, "layers": 1},
        "train": {"lr": 1.0, "momentum": 0.9, "local_epochs": 3, "batch_size": 16},
    }, tmp_path / "run")
    task = build_benchmark("shakespeare", params, seed=0).tasks["next_char"]
    clients = json.loads((result.path / "federation.json").read_text())["clients"]
    groups = task.metadata["sample_groups"]
    assert [held["next_char"] for held in clients] == [np.flatnonzero(groups == k).tolist() for k in range(3)]
    losses = [row["fit"]["train_loss/next_char"] for row in result.metrics()]
    assert losses[0] > losses[1] > losses[2]
    majority = np.bincount(task.y_test.numpy()).max() / len(task.y_test)  # a space, about 15%
    assert next(iter(result.summaries.values()))["tasks"]["next_char"]["accuracy"] > majority + 0.05

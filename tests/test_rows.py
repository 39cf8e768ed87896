"""`Benchmark.from_datasets` takes the rows users have: (input, label) pairs, mappings with named fields (what
Hugging Face `datasets` yields), PIL images and numpy arrays; anything else is refused in one sentence."""

import numpy as np
import pytest
import torch
from PIL import Image

from manytask.benchmarks import Benchmark
from manytask.errors import ManytaskError


def pixels(seed: int, shape=(4, 5, 3)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def test_pil_images_become_channels_first_floats_in_the_unit_range():
    rgb, grey = pixels(0), pixels(1, (4, 5))
    rows = [(Image.fromarray(rgb), 1), (Image.fromarray(rgb[::-1].copy()), 0)]
    bench = Benchmark.from_datasets("pil", {"t": (rows, [(Image.fromarray(rgb), 2)])})
    x = bench.tasks["t"].x_train
    assert x.shape == (2, 3, 4, 5) and x.dtype == torch.float32
    assert torch.equal(x[0], torch.from_numpy(rgb).permute(2, 0, 1).float() / 255)  # pixel (r, c) of channel k
    assert x[0, 2, 3, 4] == pytest.approx(rgb[3, 4, 2] / 255)
    (g,) = Benchmark.from_datasets("grey", {"t": ([(Image.fromarray(grey), 0)], [(Image.fromarray(grey), 0)])}
                                   ).tasks["t"].x_train
    assert g.shape == (1, 4, 5) and torch.equal(g[0], torch.from_numpy(grey).float() / 255)


def test_dict_rows_find_their_fields_or_take_them_by_name():
    rows = [{"image": pixels(i, (2, 2)), "label": np.int64(i % 3), "id": i} for i in range(6)]
    bench = Benchmark.from_datasets("dicts", {"t": (rows, rows[:2])})
    assert bench.tasks["t"].y_train.tolist() == [0, 1, 2, 0, 1, 2]
    assert torch.equal(bench.tasks["t"].x_train[5], torch.from_numpy(pixels(5, (2, 2))).float() / 255)  # uint8 → [0,1]
    named = [{"a": [float(i), 2.0], "b": [0.5, 0.5], "fine": torch.tensor(i)} for i in range(4)]
    bench = Benchmark.from_datasets("named", {"t": (named, named)}, input_key="b", label_key="fine")
    assert bench.tasks["t"].x_train.tolist() == [[0.5, 0.5]] * 4 and bench.tasks["t"].y_test.tolist() == [0, 1, 2, 3]


def test_numpy_pairs_keep_their_values():
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float64)
    rows = [(x[i], i % 2) for i in range(5)]
    task = Benchmark.from_datasets("np", {"t": (rows, rows)}).tasks["t"]
    assert torch.allclose(task.x_train, torch.from_numpy(x).float()) and task.y_train.tolist() == [0, 1, 0, 1, 0]


BAD = [  # (rows, the sentence's telling part)
    ([("a string", 0)], "task 't', train split, row 0: its input is a str"),
    ([(np.zeros(2), 0.5)], "row 0: its label must be a class index, an integer (got 0.5)"),
    ([(np.zeros(2), -1)], "row 0: its label -1 is negative"),
    ([(np.zeros(2), 0), (np.zeros(3), 1)], "row 0 has (2,) and row 1 (3,)"),
    ([{"image": np.zeros(2), "img": np.zeros(2), "label": 0}], "has several input fields among image, img, label"),
    ([{"pixels": np.zeros(2), "label": 0}], "has no input field among pixels, label; name it with input_key="),
    ([(np.zeros(2), 0, 1)], "row 0 is a tuple; a row is an (input, label) pair or a mapping"),
    ([([["x"]], 0)], "row 0: its input is not an array of numbers"),
    ([], "task 't', train split has no rows"),
    (iter([(np.zeros(2), 0)]), "a dataset must have a length and rows by index"),
]


@pytest.mark.parametrize(("rows", "message"), BAD, ids=[m[:30] for _, m in BAD])
def test_anything_else_is_refused_in_one_sentence(rows, message):
    with pytest.raises(ManytaskError) as caught:
        Benchmark.from_datasets("bad", {"t": (rows, [(np.zeros(2), 0)])})
    assert message in str(caught.value) and str(caught.value).count(". ") == 0, str(caught.value)

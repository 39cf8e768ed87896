"""`benchmark: {name: hf, path: DIR}`: a Hugging Face dataset the test writes with `save_to_disk` (PIL images and
ClassLabel columns), read back as one task per label column and run through the CLI."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

datasets = pytest.importorskip("datasets")

from manytask.benchmarks.registry import build_benchmark  # noqa: E402
from manytask.cli import app  # noqa: E402
from manytask.errors import ManytaskError  # noqa: E402


def save(folder, splits: bool):
    """Grey 6×6 images whose brightness is the class (4 classes), a ClassLabel 'shade' and a plain int 'bright'."""
    rng = np.random.default_rng(0)
    shade = rng.integers(0, 4, size=120)
    images = [np.full((6, 6), 40 + 60 * s, dtype=np.uint8) + rng.integers(0, 20, (6, 6), dtype=np.uint8)
              for s in shade]
    features = datasets.Features({"image": datasets.Image(), "shade": datasets.ClassLabel(num_classes=4),
                                  "bright": datasets.Value("int64")})
    rows = {"image": images, "shade": shade.tolist(), "bright": (shade >= 2).astype(int).tolist()}
    data = datasets.Dataset.from_dict(rows, features=features)
    if splits:
        data = datasets.DatasetDict({"train": data.select(range(90)), "test": data.select(range(90, 120))})
    data.save_to_disk(str(folder))
    return shade, images


def test_a_saved_dataset_dict_gives_a_task_per_classlabel_column_with_its_images(tmp_path):
    shade, images = save(tmp_path / "ds", splits=True)
    bench = build_benchmark("hf", {"path": str(tmp_path / "ds")}, seed=0)
    assert bench.task_names == ["shade"] and bench.input_shape == (1, 6, 6)
    task = bench.tasks["shade"]
    assert task.y_train.tolist() == shade[:90].tolist() and task.y_test.tolist() == shade[90:].tolist()
    assert np.allclose(task.x_train[7, 0].numpy(), images[7] / 255)
    both = build_benchmark("hf", {"path": str(tmp_path / "ds"), "tasks": {"shade": "shade", "bright": "bright"}}, 0)
    assert both.task_names == ["shade", "bright"] and both.tasks["bright"].y_train.max() == 1


def test_a_single_saved_dataset_is_split_by_the_seed(tmp_path):
    save(tmp_path / "one", splits=False)
    a, b = (build_benchmark("hf", {"path": str(tmp_path / "one"), "test_fraction": 0.25}, seed=s) for s in (0, 1))
    assert a.tasks["shade"].num_train == 90 and len(a.tasks["shade"].y_test) == 30
    assert not np.array_equal(a.tasks["shade"].x_train.numpy(), b.tasks["shade"].x_train.numpy())


@pytest.mark.parametrize(("params", "message"), [
    ({"path": "nowhere"}, "is not a folder"),
    ({"path": "{ds}", "test_split": "validation"}, "has no split 'validation'; its splits: train, test"),
    ({"path": "{ds}", "tasks": ["colour"]}, "task 'colour' reads column 'colour', which the dataset does not have"),
])
def test_bad_settings_are_one_sentence(params, message, tmp_path):
    save(tmp_path / "ds", splits=True)
    params = {k: v.format(ds=tmp_path / "ds") if isinstance(v, str) else v for k, v in params.items()}
    with pytest.raises(ManytaskError, match=message):
        build_benchmark("hf", params, seed=0)


def test_the_hf_benchmark_runs_through_the_cli(tmp_path):
    save(tmp_path / "ds", splits=True)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "run", f"benchmark={{name: hf, path: {tmp_path / 'ds'}}}", "method=fedavg",
        "model={backbone: mlp, hidden: [16]}",
        "federation={num_clients: 3, tasks: {kind: all}, samples: {kind: label-skew}}", "rounds=20", "reference=null",
        "train={lr: 0.3, momentum: 0.9, local_epochs: 2, batch_size: 16}", "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "summary.json").read_text())["tasks"]["shade"]["accuracy"] > 0.6  # chance 0.25

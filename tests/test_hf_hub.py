"""`benchmark: {name: hf, path: owner/name}`: Hub ids resolved offline from a `datasets` cache the test fills (as an
online `load_dataset` would leave it), Flower Datasets' partitioners (`samples: {kind: flwr}`) and natural clients
from a column (`partition_by`)."""

import json
from pathlib import Path

import numpy as np
import pytest

datasets = pytest.importorskip("datasets")
partitioners = pytest.importorskip("flwr_datasets.partitioner")

import huggingface_hub.constants  # noqa: E402
from datasets.packaged_modules.parquet.parquet import Parquet  # noqa: E402

from manytask import api  # noqa: E402
from manytask.benchmarks.registry import build_benchmark  # noqa: E402
from manytask.errors import ManytaskError  # noqa: E402
from manytask.federation import SAMPLE_PARTITIONERS, build_federation  # noqa: E402
from manytask.seeding import numpy_rng  # noqa: E402
from tests.test_shakespeare import LINES, leaf_samples  # noqa: E402

CLASSES = 3


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty `datasets` cache, and no network: the Hub is offline, as HF_HUB_OFFLINE=1 makes it (the libraries
    read the variables when imported, so their flags are set too)."""
    cache = tmp_path / "hf-datasets"
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(variable, "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    return cache


def cache_hub_dataset(cache: Path, repo_id: str, splits: dict) -> None:
    """Leave `splits` in the `datasets` cache where `load_dataset(repo_id)` finds them offline: the default config
    of the Hub dataset `repo_id`, prepared from parquet files as an online load prepares the Hub's files."""
    files = {}
    for split, rows in splits.items():
        files[split] = str(cache.parent / f"{repo_id.replace('/', '--')}-{split}.parquet")
        rows.to_parquet(files[split])
    builder = Parquet(cache_dir=str(cache), dataset_name=repo_id.split("/")[1], repo_id=repo_id, hash="0" * 40,
                      data_files=files)
    builder.download_and_prepare()
    config = Path(builder.cache_dir).parents[1]  # <owner>___<name>/<config>/<version>/<hash>
    config.rename(config.with_name("default"))  # a Hub load's config is 'default', without the data files' suffix


def vectors(count: int, seed: int):
    """Rows of a 4-number input whose first coordinates tell the class, and a ClassLabel."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, CLASSES, size=count)
    x = rng.normal(0, 0.3, (count, 4)) + np.eye(4)[label] * 2
    features = datasets.Features({"x": datasets.Sequence(datasets.Value("float32")),
                                  "label": datasets.ClassLabel(num_classes=CLASSES)})
    return datasets.Dataset.from_dict({"x": x.tolist(), "label": label.tolist()}, features=features)


def test_a_hub_id_loads_offline_from_the_cache_and_flwr_partitions_as_flower_datasets_does(hub_cache, tmp_path):
    cache_hub_dataset(hub_cache, "someone/tiny", {"train": vectors(150, 0), "test": vectors(40, 1)})
    samples = {"kind": "flwr", "partitioner": "dirichlet", "alpha": 0.5, "min_partition_size": 5}
    result = api.run({
        "name": "hub", "method": "fedavg", "rounds": 1, "reference": None, "seed": 7,
        "benchmark": {"name": "hf", "path": "someone/tiny", "input": "x"},
        "federation": {"num_clients": 3, "tasks": {"kind": "all"}, "samples": samples},
        "model": {"backbone": "mlp", "hidden": [8]}, "train": {"local_epochs": 1, "batch_size": 16},
    }, tmp_path / "run")
    held = [client["label"] for client in json.loads((result.path / "federation.json").read_text())["clients"]]

    labels = vectors(150, 0)["label"]
    seed = int(numpy_rng(7, "federation", "samples", "label").integers(2**32))  # the task's partition stream
    flower = partitioners.DirichletPartitioner(num_partitions=3, partition_by="label", alpha=0.5,
                                               min_partition_size=5, seed=seed)
    flower.dataset = datasets.Dataset.from_dict({"label": labels, "row": range(150)}).shuffle(seed=seed)
    assert held == [sorted(flower.load_partition(k)["row"]) for k in range(3)]


def test_a_missing_dataset_offline_is_one_sentence(hub_cache):
    with pytest.raises(ManytaskError, match=r"^benchmark hf: 'someone/absent' is not a folder, and datasets could "
                       r"not load it as a Hub id from its local cache .* \(offline: .*\)\.$"):
        build_benchmark("hf", {"path": "someone/absent"}, seed=0)


def writer_images(writers: int, per_writer: int):
    """FEMNIST in small: grey 6×6 images whose brightness tells the character, each row with its writer_id."""
    rng = np.random.default_rng(3)
    character = rng.integers(0, CLASSES, size=writers * per_writer)
    images = [np.clip(40 + 80 * c + rng.integers(0, 30, (6, 6)), 0, 255).astype(np.uint8) for c in character]
    writer = [f"f{w:04d}_07" for w in range(writers) for _ in range(per_writer)]
    features = datasets.Features({"image": datasets.Image(), "writer_id": datasets.Value("string"),
                                  "character": datasets.ClassLabel(num_classes=CLASSES)})
    rows = {"image": images, "writer_id": writer, "character": character.tolist()}
    return datasets.Dataset.from_dict(rows, features=features)


def test_partition_by_writer_gives_a_client_per_writer_that_fedavg_trains(hub_cache, tmp_path):
    cache_hub_dataset(hub_cache, "someone/femnist", {"train": writer_images(4, 40)})  # FEMNIST: one split
    params = {"path": "someone/femnist", "partition_by": "writer_id", "test_split": None, "test_fraction": 0.25}
    bench = build_benchmark("hf", params, seed=0)
    assert bench.task_names == ["character"]  # the writer column is no task
    writers = bench.metadata["natural_ids"]
    assert writers == [f"f{w:04d}_07" for w in range(4)]
    result = api.run({
        "name": "femnist", "method": "fedavg", "rounds": 2, "reference": None, "seed": 0,
        "benchmark": {"name": "hf", **params},
        "federation": {"num_clients": 4, "tasks": {"kind": "all"}, "samples": {"kind": "natural"}},
        "model": {"backbone": "mlp", "hidden": [16]},
        "train": {"lr": 0.1, "momentum": 0.9, "local_epochs": 5, "batch_size": 8},
    }, tmp_path / "run")
    train = writer_images(4, 40).train_test_split(test_size=0.25, seed=0)["train"]
    clients = json.loads((result.path / "federation.json").read_text())["clients"]
    assert [[train[i]["writer_id"] for i in held["character"]] for held in clients] == [
        [w] * train["writer_id"].count(w) for w in writers]  # each writer's rows, all of them
    assert next(iter(result.summaries.values()))["tasks"]["character"]["accuracy"] > 1 / CLASSES + 0.3


def test_flwr_natural_id_matches_the_natural_partition_of_the_speakers(tmp_path):
    rows = [(speaker, x, y) for speaker, text in LINES.items()
            for x, y in zip(*leaf_samples(text).values(), strict=True)]
    columns = dict(zip(("character_id", "x", "y"), map(list, zip(*rows, strict=True)), strict=True))
    datasets.Dataset.from_dict(columns).save_to_disk(str(tmp_path / "shakespeare"))
    bench = build_benchmark("shakespeare", {"path": str(tmp_path / "shakespeare")}, seed=0)
    natural, flower = (build_federation(bench, 3, {"kind": "all"}, samples, seed=0)
                       for samples in ({"kind": "natural"}, {"kind": "flwr", "partitioner": "natural-id"}))
    assert natural.to_json() == flower.to_json()
    assert bench.metadata["natural_ids"] == sorted(LINES)


@pytest.mark.parametrize(("kind", "values", "message"), [
    ("dirichlet", {"zeta": 0.5, "alpha": 0.3}, "give the concentration as zeta or as its synonym alpha, not both"),
    ("flwr", {"partitioner": "iid", "alpha": 0.3}, "'alpha' is not an option of the iid partitioner"),
])
def test_partitioner_settings_are_one_sentence(kind, values, message):
    with pytest.raises(ManytaskError, match=message):
        SAMPLE_PARTITIONERS.parse_params(kind, values)
    if kind == "dirichlet":
        assert SAMPLE_PARTITIONERS.parse_params("label-skew", {"alpha": 0.3}).zeta == 0.3

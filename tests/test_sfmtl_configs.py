"""The SFMTL-Graph configs under configs/sfmtl/: all validate, the offline ones build, the real-data ones fail with
one sentence without their files and build on tiny files in the official formats."""

from pathlib import Path

import pytest

from manytask.config import validate
from manytask.config_sources import load_yaml
from manytask.errors import ManytaskError
from manytask.launch import plan
from tests.data_files import write_cifar_py, write_mnist

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "sfmtl"
OFFLINE = ["label_skew_digits.yaml", "label_skew_mnist1d.yaml", "rotated_masked_digits.yaml"]
REAL = {  # config -> the sentence it fails with when its files are absent
    "cifar10_label_skew.yaml": r"CIFAR-10 file \S+ is missing",
    "mnist_rotated_masked.yaml": r"MNIST file \S+ .* is missing",
}


def test_every_config_validates_and_compares_sfmtl_graph():
    paths = sorted(CONFIGS.glob("*.yaml"))
    assert {p.name for p in paths} >= {*OFFLINE, *REAL}
    for path in paths:
        config = validate(load_yaml(path))
        assert config.methods[0]["name"] == "sfmtl-graph" and config.federation.tasks["kind"] == "one-per-client"


@pytest.mark.parametrize("name", OFFLINE)
def test_offline_configs_build(name):
    experiments = plan(validate(load_yaml(CONFIGS / name)))
    federation = experiments[0].federation
    assert all(len(federation.clients[c]) == 1 for c in range(federation.num_clients))  # one task per client


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_data_configs_fail_in_one_sentence_without_files(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the configs' roots are relative: data/... does not exist here
    with pytest.raises(ManytaskError, match=REAL[name]) as err:
        plan(validate(load_yaml(CONFIGS / name)))
    assert str(err.value).count(". ") == 0 and str(err.value).endswith(".")


def test_real_data_configs_build_on_tiny_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_cifar_py(tmp_path / "data" / "cifar-10-batches-py", train_counts=[40] * 5, num_test=200)
    write_mnist(tmp_path / "data" / "mnist", gz=True, num_train=80, num_test=40)
    cifar = plan(validate(load_yaml(CONFIGS / "cifar10_label_skew.yaml")))[0]
    assert cifar.benchmark.input_shape == (3, 32, 32) and len(cifar.benchmark.tasks) == 30
    mnist = plan(validate(load_yaml(CONFIGS / "mnist_rotated_masked.yaml")))[0]
    assert mnist.benchmark.input_shape == (1, 28, 28) and len(set(mnist.benchmark.metadata["groups"].values())) == 4

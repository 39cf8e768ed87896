"""The README's code runs as written, and every shipped config validates and builds."""

import json
import re
from pathlib import Path

import pytest

import manytask.launch
from manytask.benchmarks import Benchmark, build_benchmark
from manytask.benchmarks.fashion_mnist import DEFAULT_ROOT as FASHION_MNIST_ROOT
from manytask.benchmarks.registry import BENCHMARKS
from manytask.config import RunConfig, validate
from manytask.config_sources import load_yaml
from manytask.errors import ManytaskError
from manytask.experiment import make_benchmark
from manytask.launch import plan

ROOT = Path(__file__).resolve().parents[1]


def test_readme_custom_benchmark_snippet_runs():
    readme = (ROOT / "README.md").read_text()
    (snippet,) = [s for s in re.findall(r"```python\n(.*?)```", readme, re.S) if "register_benchmark" in s]
    if "my-bench" not in BENCHMARKS.names():  # tests/test_first_step.py registers it too when it ran in this process
        exec(compile(snippet, "README.md", "exec"), {})
    bench = build_benchmark("my-bench", {}, seed=0)
    assert bench.task_names == ["sign", "norm"] and bench.input_shape == (20,)


REAL_DATA_CONFIGS = {  # need files on disk
    "vision8.yaml", "cifar10_label_skew.yaml", "mnist_rotated_masked.yaml",
    "nyudv2_swin.yaml", "pascal_context_swin.yaml", "cifar100_vit_s16.yaml", "taskonomy_sdnkt.yaml",
}
FASHION_MNIST_CONFIGS = sorted((ROOT / "configs").rglob("fashion_mnist_*.yaml"))
OFFLINE_CONFIGS = sorted(p for p in (ROOT / "configs").rglob("*.yaml")
                         if p.name not in REAL_DATA_CONFIGS and p not in FASHION_MNIST_CONFIGS)


_BUILT: dict[str, Benchmark] = {}  # configs sharing a benchmark setting (configs/talos/*) build it once


def _benchmark_once(config: RunConfig) -> Benchmark:
    key = json.dumps([config.benchmark, config.seed], sort_keys=True)
    if key not in _BUILT:
        _BUILT[key] = make_benchmark(config)
    return _BUILT[key]


@pytest.fixture(scope="module")
def fresh_cache(tmp_path_factory) -> Path:
    """A cache empty at the first config, as on a clean clone, then shared: the configs of FL + TaLoS's table ask
    for the same pretrained backbone, which the first one builds (one epoch of a ViT: about 9 s here)."""
    return tmp_path_factory.mktemp("cache")


@pytest.mark.parametrize("path", OFFLINE_CONFIGS, ids=lambda p: str(p.relative_to(ROOT / "configs")))
def test_shipped_configs_validate_and_build(path, monkeypatch, fresh_cache):
    monkeypatch.setattr(manytask.launch, "make_benchmark", _benchmark_once)
    monkeypatch.setenv("MANYTASK_CACHE", str(fresh_cache))
    data = {**load_yaml(path), "seeds": None}  # one seed's members: the others differ only in their seed
    model = data.get("model", {})
    if model.get("pretrained"):  # the build pretrains for real, one epoch: 30 of a ViT took over 6 minutes here
        model["pretrain"] = {**model.get("pretrain", {}), "epochs": 1}
    experiments = plan(validate(data))
    assert experiments and all(e.federation.num_clients >= 1 for e in experiments)


@pytest.mark.skipif(not Path(FASHION_MNIST_ROOT).is_dir(), reason="Fashion-MNIST is not installed: apt-get install "
                    "dataset-fashion-mnist")
@pytest.mark.parametrize("path", FASHION_MNIST_CONFIGS, ids=lambda p: p.name)
def test_fashion_mnist_configs_build_on_the_installed_files(path):
    data = {**load_yaml(path), "seeds": None}  # one seed's members: the others differ only in their seed
    experiments = plan(validate(data))
    assert experiments and all(e.federation.num_clients == len(e.benchmark.tasks) for e in experiments)
    assert experiments[0].benchmark.metadata["groups"]  # the true groups the communities are scored against


def test_real_data_config_fails_with_one_sentence_when_files_are_absent(tmp_path):
    config = validate(load_yaml(ROOT / "configs" / "matu" / "vision8.yaml"))
    with pytest.raises(ManytaskError, match=r"vision-8 needs ImageFolder directories .* missing: /data/vision8"):
        plan(config)

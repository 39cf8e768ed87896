"""Pretraining a small backbone on a benchmark's source split (data no task uses), cached on disk.

Task arithmetic needs a pretrained start. The offline benchmarks expose such a source (`digits-tasks` with
`holdout > 0`, `synthetic` with `pretrain_samples > 0`). The backbone is trained centrally on it with Adam,
deterministically, and its weights are stored as safetensors under a key that hashes the source data and every
training setting, so each setting is trained once per machine and then reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from manytask.benchmarks.base import Benchmark
from manytask.client.trainer import TrainConfig, Trainer, evaluate
from manytask.errors import ManytaskError
from manytask.models.multitask import build_model
from manytask.registry import Params
from manytask.seeding import derive_seed

FORMAT_VERSION = 1


class PretrainParams(Params):
    epochs: int = Field(default=40, ge=1)
    lr: float = Field(default=1e-3, gt=0)
    batch_size: int = Field(default=64, ge=1)


@dataclass(frozen=True)
class Pretrained:
    path: Path
    description: str


def cache_dir() -> Path:
    return Path(os.environ.get("MANYTASK_CACHE", Path.home() / ".cache" / "manytask")) / "pretrained"


def pretrained_backbone(
    benchmark: Benchmark, backbone: str, backbone_params: dict[str, Any], params: PretrainParams, seed: int
) -> Pretrained:
    """The pretrained backbone weights for this setting: from the cache, or trained now and cached."""
    source = benchmark.pretraining
    if source is None:
        raise ManytaskError(
            f"benchmark '{benchmark.name}' has no pretraining source; set benchmark.holdout (digits-tasks) or "
            "benchmark.pretrain_samples (synthetic) above 0, or drop model.pretrained."
        )
    settings = {"version": FORMAT_VERSION, "backbone": backbone, "backbone_params": backbone_params,
                "params": params.model_dump(), "seed": seed, "source": _fingerprint(source.x_train, source.y_train)}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / f"{backbone}-{key}.safetensors"
    if not path.exists():
        _train_and_save(benchmark, backbone, backbone_params, params, seed, path)
    with safe_open(str(path), framework="pt") as handle:
        return Pretrained(path, handle.metadata()["description"])


@lru_cache(maxsize=8)
def load_backbone_weights(path: str) -> dict[str, Tensor]:
    """The stored backbone state (read once per process)."""
    with safe_open(path, framework="pt") as handle:
        return {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118 (safe_open is not a mapping)


def _train_and_save(
    benchmark: Benchmark, backbone: str, backbone_params: dict[str, Any], params: PretrainParams, seed: int,
    path: Path,
) -> None:
    source = benchmark.pretraining
    assert source is not None
    began = time.perf_counter()
    model = build_model(backbone, backbone_params, benchmark.input_shape, {source.name: source.spec},
                        derive_seed(seed, "pretrain", "init"))
    config = TrainConfig(optimizer="adamw", lr=params.lr, local_epochs=params.epochs, batch_size=params.batch_size)
    Trainer(config, {source.name: source.spec}).train(
        model, {source.name: (source.x_train, source.y_train)}, derive_seed(seed, "pretrain"), 0, 1)
    accuracy = evaluate(model, source.spec, source.x_test, source.y_test)["accuracy"]
    description = (
        f"{backbone} pretrained {params.epochs} epochs (AdamW, lr {params.lr}) on {benchmark.name}'s source "
        f"'{source.name}' ({source.num_train} samples, {source.spec.num_outputs} classes, held out from every task); "
        f"source test accuracy {accuracy:.1%}; {time.perf_counter() - began:.1f} s"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.backbone.state_dict().items()}
    # a temporary file of this writer's own: parallel runs may pretrain the same backbone at once
    handle, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    os.close(handle)
    try:
        save_file(state, tmp, metadata={"description": description})
        os.replace(tmp, path)
    finally:  # an interrupted write leaves nothing behind
        Path(tmp).unlink(missing_ok=True)


def _fingerprint(*tensors: Tensor) -> str:
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()


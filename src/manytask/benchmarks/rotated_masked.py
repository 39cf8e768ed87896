"""`rotated-masked-digits`: one personal task per client, in rotation clusters (SFMTL-Graph's rotated & masked
MNIST: on the 8×8 digits by default, on 28×28 MNIST from its IDX files with `source: mnist`, or on Fashion-MNIST
with `source: fashion-mnist`).

Client i belongs to rotation cluster c = i·K // N (0°, 90°, 180°, 270° for K = 4) and has its own random patch
mask: the image is cut into a grid of patches, each white with probability `patch_prob`, and the client sees
max(rotated image, mask). Each client has its own training and test images (disjoint slices of the source's
train and test sets), so every client is evaluated on its own local test split. The true cluster of each task is
in the metadata (`groups`), for checking the communities a method finds.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field

from manytask.benchmarks.base import Benchmark
from manytask.benchmarks.digits import Images
from manytask.benchmarks.personal import Source, SourceParams, load_source, personal_benchmark, personal_task
from manytask.benchmarks.registry import register_benchmark
from manytask.errors import ManytaskError
from manytask.seeding import numpy_rng
from manytask.tasks.task import Task


class RotatedMaskedParams(SourceParams):
    source: Literal["digits", "mnist", "fashion-mnist"] = Field(
        "digits", description="8x8 digits, or MNIST / Fashion-MNIST files under root"
    )
    num_clients: int = Field(40, ge=1)
    clusters: int = Field(4, ge=1, le=4, description="rotation clusters: 0°, 90°, 180°, 270° (the first K)")
    grid: int = Field(4, ge=1, le=28, description="patches per side; must divide the image side (8 or 28)")
    patch_prob: float = Field(0.5, ge=0, le=1)


def patch_mask(grid: int, side: int, prob: float, rng: np.random.Generator) -> Images:
    """A (1, side, side) mask: each of grid×grid patches is 1 (white) with probability `prob`, else 0."""
    patches = (rng.random((grid, grid)) < prob).astype(np.float32)
    size = side // grid
    return np.kron(patches, np.ones((size, size), dtype=np.float32))[None]


def cluster_of(client: int, num_clients: int, clusters: int) -> int:
    return client * clusters // num_clients


def _client_task(client: int, source: Source, parts: tuple[np.ndarray, np.ndarray], p: RotatedMaskedParams,
                 seed: int) -> Task:
    cluster = cluster_of(client, p.num_clients, p.clusters)
    side = source.x_train.shape[-1]
    mask = torch.from_numpy(patch_mask(p.grid, side, p.patch_prob, numpy_rng(seed, "rotated-masked", "mask", client)))
    train, test = (torch.from_numpy(part) for part in parts)

    def seen(x: torch.Tensor) -> torch.Tensor:
        # rot90 permutes strides and maximum keeps them: make rows contiguous again, as for unrotated clients
        return torch.maximum(torch.rot90(x, cluster, dims=(2, 3)), mask).contiguous()

    arrays = (seen(source.x_train[train]), source.y_train[train], seen(source.x_test[test]), source.y_test[test])
    description = f"client {client}: images rotated by {90 * cluster}°, its own patch mask"
    return personal_task(client, arrays, source.num_classes, description)


@register_benchmark(
    "rotated-masked-digits", RotatedMaskedParams, "one task per client: 4 rotation clusters, per-client patch masks"
)
def rotated_masked_digits(params: RotatedMaskedParams, seed: int) -> Benchmark:
    source = load_source(params.source, params, seed, "rotated-masked")
    side = source.x_train.shape[-1]
    if side % params.grid:
        raise ManytaskError(f"grid must divide the image side ({side}), got {params.grid}.")
    if len(source.y_test) < params.num_clients:
        raise ManytaskError(
            f"{params.num_clients} clients need at least as many test images; there are {len(source.y_test)}."
        )
    rng = numpy_rng(seed, "rotated-masked", "clients")
    train_parts = np.array_split(rng.permutation(len(source.y_train)), params.num_clients)
    test_parts = np.array_split(rng.permutation(len(source.y_test)), params.num_clients)
    tasks = [_client_task(c, source, (train_parts[c], test_parts[c]), params, seed) for c in range(params.num_clients)]
    groups = [cluster_of(c, params.num_clients, params.clusters) for c in range(params.num_clients)]
    description = (f"{params.num_clients} personal tasks on {source.label} in {params.clusters} rotation clusters, "
                   "each with its own random patch mask")
    return personal_benchmark("rotated-masked-digits", tasks, groups, description)

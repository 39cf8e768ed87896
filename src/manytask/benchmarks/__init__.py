"""Benchmarks: a registry of named task sets. Importing this package registers the built-in ones."""

from manytask.benchmarks import (  # noqa: F401  (imported to register them)
    cifar10,
    cifar100,
    dense_real,
    digits,
    exported,
    fashion_mnist,
    hf,
    images,
    label_skew,
    mnist,
    mnist1d,
    rotated_masked,
    scene_objects,
    scenes,
    shakespeare,
    synthetic,
    thirty_tasks,
)
from manytask.benchmarks.base import Benchmark
from manytask.benchmarks.registry import BENCHMARKS, build_benchmark, register_benchmark

__all__ = ["BENCHMARKS", "Benchmark", "build_benchmark", "register_benchmark"]

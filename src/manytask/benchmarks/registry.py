"""The benchmark registry: `name -> factory(params, seed) -> Benchmark`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from manytask.benchmarks.base import Benchmark
from manytask.registry import Params, Registry

BenchmarkFactory = Callable[[Any, int], Benchmark]
BENCHMARKS: Registry[BenchmarkFactory] = Registry("benchmark", entry_points="manytask.benchmarks")


def register_benchmark(name: str, params: type[Params] = Params, description: str = ""):
    """Decorator: register `factory(params, seed) -> Benchmark` under `name`."""
    return BENCHMARKS.register(name, params, description)


def build_benchmark(name: str, params: dict[str, Any], seed: int) -> Benchmark:
    """Validate `params` and build the benchmark; deterministic in `seed`."""
    entry = BENCHMARKS.get(name)
    return entry.target(BENCHMARKS.parse_params(name, params), seed)

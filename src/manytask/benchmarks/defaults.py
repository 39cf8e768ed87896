"""The federation and model that suit a benchmark when a run names it without saying more.

The built-in default job is MaTU's setting on `digits-tasks`: an MLP pretrained on held-out digits, clients with
Dirichlet-allocated tasks and label-skewed samples. Those choices belong to that job and its benchmark, not to every
run: `manytask run benchmark=X` keeps the job (its methods, optimizer and rounds) and takes X's own federation and
model from here, the ones its configs in `configs/` use. A benchmark not listed (one of a user's) gets the
run config's plain defaults (an MLP, one task per client, IID samples).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Setup = dict[str, Any]  # {"federation": {...}, "model": {...}}

SMALL_CNN = {"backbone": "cnn", "channels": [16, 32], "hidden": 64}
DENSE_CNN = {"backbone": "cnn", "channels": [16, 32, 64], "decoder": {"width": 16}}


def _personal(params: Mapping[str, Any], clients: int) -> Setup:
    """One personal task per client, as the benchmark draws them: its client count is the federation's."""
    count = params.get("num_clients", clients)
    return {"federation": {"num_clients": count, "tasks": {"kind": "one-per-client"}, "samples": {"kind": "iid"}},
            "model": SMALL_CNN}


def _images(params: Mapping[str, Any]) -> Setup:
    """A labelled image set: every client holds it, Dirichlet label skew across clients."""
    return {"federation": {"num_clients": 10, "tasks": {"kind": "all"},
                           "samples": {"kind": "dirichlet", "zeta": 0.5}}, "model": SMALL_CNN}


def _dense(params: Mapping[str, Any]) -> Setup:
    """Dense tasks on one set of images: every client holds every task (a CNN encoder and FCN decoders)."""
    return {"federation": {"num_clients": 4, "tasks": {"kind": "all"}, "samples": {"kind": "iid"}},
            "model": DENSE_CNN}


SETUPS: dict[str, Callable[[Mapping[str, Any]], Setup]] = {
    "digits-tasks": lambda p: {"federation": {"num_clients": 10, "tasks": {"kind": "dirichlet", "zeta": 0.5},
                                              "samples": {"kind": "label-skew", "zeta": 1.0}},
                               "model": {"backbone": "mlp", "hidden": [128, 64]}},
    "synthetic": lambda p: {"federation": {"num_clients": 12, "tasks": {"kind": "one-per-client"},
                                           "samples": {"kind": "iid"}}, "model": {"backbone": "mlp", "hidden": [64]}},
    "mnist1d": lambda p: {"federation": {"num_clients": 20, "tasks": {"kind": "all"},
                                         "samples": {"kind": "shards", "classes_per_client": 2}}, "model": SMALL_CNN},
    "label-skew": lambda p: _personal(p, 30),
    "rotated-masked-digits": lambda p: _personal(p, 40),
    "scene-objects": _images,
    "cifar10": _images,
    "cifar100": _images,
    "mnist": _images,
    "fashion-mnist": _images,
    "scenes": _dense,
    "nyudv2": _dense,
    "pascal-context": _dense,
    # one client per speaker: `speakers` of them, else the natural partitioner names the count the data have
    "shakespeare": lambda p: {"federation": {"num_clients": p.get("speakers") or 10, "tasks": {"kind": "all"},
                                             "samples": {"kind": "natural"}}, "model": {"backbone": "char-lstm"}},
    "taskonomy": lambda p: {**_dense(p), "federation": {"num_clients": len(p.get("buildings") or []) or 1,
                                                        "tasks": {"kind": "all"}, "samples": {"kind": "natural"}}},
}


def benchmark_setup(benchmark: Any) -> Setup:
    """The federation and model a run on `benchmark` (a name, or `{name, **params}`) gets when it names neither
    (a plain MLP for a benchmark not listed, or a value that is neither: the config's validation names that)."""
    entry = {"name": benchmark} if isinstance(benchmark, str) else dict(benchmark) if isinstance(
        benchmark, Mapping) else {}
    name = entry.pop("name", None)
    setup = SETUPS.get(name) if isinstance(name, str) else None
    return {"model": {"backbone": "mlp"}} if setup is None else setup(entry)

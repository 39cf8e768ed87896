"""Kernels dispatched per training round, counted on any machine: every non-view aten op a round dispatches (a
`TorchDispatchMode` sees each one; on a GPU each is at least one kernel launch), and the host syncs among them.

A federated round of small clients is bound by launches, not arithmetic, so the count that matters is how it grows
with the clients of a round: `manytask bench --kernels` prints the ratio of a round of 32 clients to a round of 4
for the methods of `KERNEL_METHODS`: the hosts on a one-task-per-client federation, on a multi-task one and on an
encoder–decoder one (dense tasks, one FCN decoder each), the methods that keep a model per client on one-task
clients of one label space. A round is counted
as a 2-round run minus a 1-round run, with no evaluation in either, the engine's whole round included: payloads,
training, replies, screening, aggregation and the checkpoint."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from manytask.config import RunConfig, validate

# ops that make the host wait for the device: a read of a value, or an output whose size depends on values
SYNC_OPS = frozenset({"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim",
                      "unique_consecutive"})


class KernelCounter(TorchDispatchMode):
    """Counts the non-view aten ops dispatched while active (`ops`, and per op name `by_op`) and the host syncs
    among them (`syncs`)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not func.is_view and not _on_meta(out):  # a meta tensor's op computes shapes only: nothing launches
            self.by_op[func.overloadpacket.__name__] += 1
        return out

    @property
    def ops(self) -> int:
        return sum(self.by_op.values())

    @property
    def syncs(self) -> int:
        return sum(n for name, n in self.by_op.items() if name in SYNC_OPS)


def _on_meta(out: Any) -> bool:
    tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    return bool(tensors) and all(t.is_meta for t in tensors)


def counted(action: Callable[[], Any]) -> KernelCounter:
    """The ops `action` dispatches."""
    with KernelCounter() as counter:
        action()
    return counter


class KernelMethod(NamedTuple):
    entry: dict[str, Any]
    plugins: list[dict[str, Any]] | None
    federations: tuple[str, ...]
    counted_round: int = 1  # the round counted (0-based): a phase's, for phased methods


TALOS = {"name": "talos", "head_rounds": 1}  # head-only, then its calibration round (1), then sparse rounds (2 on)
# all-in-one rounds (0-2; the last measures the lookahead affinities), then the first group's rounds (3 on)
MAS = {"name": "mas", "groups": 2, "r0": 3, "affinity_round": 3}
HOST_FEDERATIONS = ("one-task", "multi-task", "dense")
# the methods held to ≤ 1.5 kernels per round at 32 clients ÷ 4, each on the federations it runs on: the hosts
# (issue 32), MaT-FL, and the methods that keep a model per client (issue 34) on one-task clients of one label space
KERNEL_METHODS: dict[str, KernelMethod] = {label: KernelMethod(*entry) for label, entry in {
    "fedavg": ({"name": "fedavg"}, None, HOST_FEDERATIONS),
    "fedprox+dea": ({"name": "fedprox"}, [{"name": "dea"}], HOST_FEDERATIONS),
    "feddyn": ({"name": "feddyn"}, None, HOST_FEDERATIONS),
    "fedbn": ({"name": "fedbn"}, None, HOST_FEDERATIONS),
    "moon": ({"name": "moon", "projection_dim": 32}, None, HOST_FEDERATIONS),
    "fedper": ({"name": "fedper"}, None, HOST_FEDERATIONS),
    "fedadam": ({"name": "fedadam"}, None, HOST_FEDERATIONS),
    "fedavg+dea": ({"name": "fedavg"}, [{"name": "dea"}], ("dense",)),  # FedDEA's setting: encoder–decoders
    "matfl": ({"name": "matfl"}, None, ("one-task", "multi-task")),
    "fedavg per task": ({"name": "fedavg", "per_task": True}, None, ("multi-task",)),  # the default job's FedAvg
    "matu": ({"name": "matu"}, None, ("multi-task",)),
    "local": ({"name": "local"}, None, ("personal",)),
    "fedu": ({"name": "fedu"}, None, ("personal",)),
    "sfmtl-graph": ({"name": "sfmtl-graph"}, None, ("personal",)),
    "pfedme": ({"name": "pfedme"}, None, ("personal",)),
    "talos calibration": (TALOS, None, ("one-task", "multi-task"), 1),
    "talos sparse": (TALOS, None, ("one-task", "multi-task"), 2),
    "talos-partition sparse": ({**TALOS, "name": "talos-partition"}, None, ("one-task",), 2),
    "mas-2 all-in-one": (MAS, None, ("shared",), 1),
    "mas-2 affinity": (MAS, None, ("shared",), 2),
    "mas-2 group": (MAS, None, ("shared",), 3),
}.items()}
DIGITS = {"benchmark": {"name": "digits-tasks", "tasks": ["digit", "parity", "rotated", "mod3"]},
          "model": {"backbone": "cnn", "channels": [8, 16], "hidden": 32, "norm": "batch"}}
FEDERATIONS: dict[str, Callable[[int], dict[str, Any]]] = {  # the workload's parts, by the clients of a round
    "one-task": lambda clients: {**DIGITS, "federation": {"num_clients": clients, "tasks": {"kind": "one-per-client"},
                                                          "samples": {"kind": "iid"}}},
    "multi-task": lambda clients: {**DIGITS, "federation": {
        "num_clients": clients, "tasks": {"kind": "dirichlet", "zeta": 0.5}, "samples": {"kind": "iid"}}},
    "dense": lambda clients: {  # nyud-like scenes, one task per client: the encoder and one decoder each
        "benchmark": {"name": "scenes", "tasks": "nyud-like", "size": 16, "train_per_task": 8 * clients,
                      "test_size": 8, "styles": 2, "images": "disjoint"},
        "federation": {"num_clients": clients, "tasks": {"kind": "one-per-client"}, "samples": {"kind": "iid"}},
        "model": {"backbone": "cnn", "channels": [8, 16], "norm": "batch", "decoder": {"width": 8}}},
    "shared": lambda clients: {  # scenes buildings: every client holds the sdn tasks of its own images (MAS's)
        "benchmark": {"name": "scenes", "tasks": "sdn", "size": 16, "train_per_task": 8 * clients, "test_size": 8,
                      "styles": 2, "buildings": clients},
        "federation": {"num_clients": clients, "tasks": {"kind": "all"}, "samples": {"kind": "natural"}},
        "model": {"backbone": "cnn", "channels": [8, 16], "norm": "batch", "decoder": {"width": 8}}},
    "personal": lambda clients: {  # rotated & masked digits: one task per client, all of one label space
        "benchmark": {"name": "rotated-masked-digits", "num_clients": clients, "patch_prob": 0.25},
        "federation": {"num_clients": clients, "tasks": {"kind": "one-per-client"}, "samples": {"kind": "iid"}},
        "model": DIGITS["model"]},
}


def kernel_config(method: dict[str, Any], plugins: list[dict[str, Any]] | None, clients: int, federation: str,
                  execution: str = "auto") -> RunConfig:
    """The kernel workload: digits-tasks (4 tasks) and the small CNN with BatchNorm, or the nyud-like scenes and
    its encoder–decoder (`dense`, and `shared` for clients holding several of its tasks on their own images: MAS's);
    gradient clipping, 4 local steps of batch 32 (8 for the 16×16 scenes), every
    client sampled, no evaluation in the rounds counted."""
    if plugins:  # one run: the plug-in wraps the method's entry (a config-level `plugins` list plans a comparison)
        (plugin,) = plugins
        method = {**method, "plugin": plugin}
    return validate({
        "name": f"kernels-{method['name']}-{clients}", "method": method, "rounds": 10, "seed": 0,
        **FEDERATIONS[federation](clients),
        "train": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "local_steps": 4,
                  "batch_size": 8 if federation in ("dense", "shared") else 32, "grad_clip": 1.0},
        "eval_every": 10, "reference": None, "execution": execution,
    })


def round_kernels(config: RunConfig, counted_round: int = 1) -> KernelCounter:
    """The ops of one training round of `config` (`counted_round`, 0-based, at least 1): a fresh run to its end
    minus a fresh run to the round before (so the count holds no set-up, no evaluation and no checkpoint read, only
    that round's work)."""
    from manytask.bench.timing import engine_runner

    counts = []
    for rounds in (counted_round, counted_round + 1):
        with engine_runner(config) as run:
            counts.append(counted(lambda rounds=rounds: run(rounds)))
    one, two = counts
    difference = KernelCounter()
    difference.by_op.update(two.by_op)
    difference.by_op.subtract(one.by_op)
    return difference


def kernel_table(clients: tuple[int, int] = (4, 32), execution: str = "auto",
                 methods: dict[str, KernelMethod] = KERNEL_METHODS) -> list[dict[str, Any]]:
    """Per method and federation: ops and host syncs of one round at each client count, and the ratio of ops."""
    torch.set_num_threads(1)
    rows = []
    for label, (method, plugins, federations, counted_round) in methods.items():
        for federation in federations:
            few, many = (round_kernels(kernel_config(method, plugins, n, federation, execution), counted_round)
                         for n in clients)
            rows.append({"host": label, "federation": federation, "clients": list(clients),
                         "ops": [few.ops, many.ops], "syncs": [few.syncs, many.syncs], "ratio": many.ops / few.ops})
    return rows

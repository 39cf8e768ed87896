"""Kernels per round: the counter counts what it should, and a round of 32 clients dispatches about as many kernels
as a round of 4 under execution auto (the count is deterministic: no timing involved)."""

import pytest
import torch

from manytask.bench.kernels import KERNEL_METHODS, counted, kernel_config, round_kernels
from manytask.experiment import Experiment


def test_the_counter_counts_non_view_ops_and_host_syncs():
    x = torch.ones(4)

    def work():
        y = x + 1  # add
        z = y.view(2, 2).t()  # views: not counted
        (z * 2).sum().item()  # mul, sum, and the read: a sync

    counter = counted(work)
    assert counter.by_op["add"] == 1 and counter.by_op["mul"] == 1 and counter.by_op["sum"] == 1
    assert counter.by_op["view"] == 0 and counter.by_op["t"] == 0
    assert counter.syncs == 1 and counter.ops == 4


def test_a_kernel_workload_with_a_plug_in_runs_the_plug_in():
    # a config-level `plugins` list plans a comparison, which one engine run ignores: the plug-in goes in the entry
    for label, (method, plugins, federations, _) in KERNEL_METHODS.items():
        if plugins:
            experiment = Experiment.build(kernel_config(method, plugins, 4, federations[0]))
            assert experiment.label == f"{method['name']}+{plugins[0]['name']}", label


@pytest.mark.slow
@pytest.mark.parametrize(("host", "federation"), [
    ("fedavg", "multi-task"), ("moon", "multi-task"), ("feddyn", "multi-task"), ("fedbn", "dense"),
    ("fedavg+dea", "dense"), ("local", "personal"), ("fedu", "personal"), ("sfmtl-graph", "personal"),
    ("pfedme", "personal"), ("talos calibration", "one-task"), ("talos sparse", "multi-task")])
def test_a_round_of_32_clients_dispatches_at_most_one_and_a_half_times_a_round_of_4(host, federation):
    method, plugins, _, counted_round = KERNEL_METHODS[host]
    few, many = (round_kernels(kernel_config(method, plugins, n, federation), counted_round) for n in (4, 32))
    assert many.ops <= 1.5 * few.ops, (few.ops, many.ops)
    assert many.syncs == few.syncs == 0  # no host sync at all: losses are read once a round, on the host
    sequential = round_kernels(kernel_config(method, plugins, 4, federation, "sequential"), counted_round)
    # one by one, each client's losses are read once, after its last step (`tolist`, no aten op); only the dense
    # losses' checks for a batch without labels (`any()`) remain, fewer than one a step
    assert sequential.syncs < 4 * 4
    if federation != "dense":  # an encoder–decoder round of four: about as many either way (docs/performance.md)
        assert sequential.ops > few.ops  # batching four clients already dispatches fewer kernels than one by one


@pytest.mark.slow
def test_matu_dispatches_about_as_many_kernels_for_32_clients_as_for_4_and_no_more_host_reads():
    """MaTU's unifications (the server's per task set, the clients' per number of held tasks) run batched, and the
    reads of rescalers and similarities are per round, not per client."""
    method, plugins, *_ = KERNEL_METHODS["matu"]
    few, many = (round_kernels(kernel_config(method, plugins, n, "multi-task")) for n in (4, 32))
    assert many.ops <= 1.5 * few.ops, (few.ops, many.ops)
    assert many.syncs == few.syncs, (few.syncs, many.syncs)


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["mas-2 all-in-one", "mas-2 affinity", "mas-2 group"])
def test_mas_stages_dispatch_about_as_many_kernels_for_32_clients_as_for_4(stage):
    """MAS-2's all-in-one round, its affinity round (the lookahead measured for every client at once) and a group
    round train batched; their few host reads (the stage's bookkeeping) do not grow with the clients."""
    method, plugins, (federation,), counted_round = KERNEL_METHODS[stage]
    few, many = (round_kernels(kernel_config(method, plugins, n, federation), counted_round) for n in (4, 32))
    assert many.ops <= 1.5 * few.ops, (few.ops, many.ops)
    assert many.syncs == few.syncs, (few.syncs, many.syncs)

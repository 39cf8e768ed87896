"""The vectorized server hot spots equal the straightforward implementations they replaced, bit for bit.

`matu_aggregate.aggregate` (blocked over d, tasks batched) and `task_similarity` (blocked sign counts) against the
original task-by-task, whole-d loop; `sfmtl_math.similarity_graph` (all pairs at once) and `communities` (graph built
from one `tolist`) against the original pair loop. The references below are the replaced code, kept here verbatim in
substance. Equality is checked on the bit patterns (so even the sign of zeros and NaN payloads must agree), on random
inputs that reach every branch: one and many holders (sums over ≥ 16 rows use torch's cascade order), padded and
grouped neighbour batches, non-finite uploads, float64 / bfloat16 uploads, d across the block, span and sign-buffer
borders.
"""

import random

import networkx as nx
import pytest
import torch

from manytask.methods.manytask import matu_aggregate, sfmtl_math
from manytask.methods.manytask.matu_aggregate import aggregate
from manytask.methods.manytask.matu_math import CROSS_TASK_MODES, neighbours, task_similarity
from manytask.methods.manytask.sfmtl_math import (
    anchor_similarity,
    communities,
    head_similarity,
    similarity_graph,
)
from tests.simulated_cuda import simulated_cuda


@pytest.fixture(autouse=True)
def one_thread():
    """The engine runs the server on `threads` torch threads, 1 unless a config asks for more. With 2, MKL splits
    some batched products differently from their single matmuls (seen on an AMD EPYC VM), so the equality holds on
    one thread; without this the outcome depended on whether an earlier test had set the thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def bits(x):
    return x.view({torch.float32: torch.int32, torch.float64: torch.int64}[x.dtype])


def assert_bitwise(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(bits(actual), bits(expected)), (actual, expected)


# ------------------------------------------------------------------------------------------------------- MaTU reference


def reference_aggregate(uploads, rho=0.4, eps=0.5, kappa=2, cross_task="mean"):
    """The original `aggregate`: per task, whole d, float64 (validation left out)."""
    per_task = {}
    for upload in uploads:
        tau_n = upload["unified"].to(torch.float64)
        for task, mask in upload["masks"].items():
            vectors, lams, ns = per_task.setdefault(task, ([], [], []))
            vectors.append(torch.where(mask != 0, tau_n, torch.zeros((), dtype=torch.float64)))
            lams.append(float(upload["rescalers"][task]))
            ns.append(float(upload["sizes"][task]))
    if not per_task:
        return {}
    names = sorted(per_task)
    m_hats, tau_hats = [], []
    for task in names:
        vectors, lams, ns = per_task[task]
        stacked = torch.stack(vectors)
        alpha = torch.sign(stacked).mean(dim=0).abs()
        m_hat = torch.where(alpha >= rho, torch.ones_like(alpha), alpha)
        sizes = torch.tensor(ns, dtype=torch.float64)
        gamma = torch.full_like(sizes, 1.0 / len(ns)) if sizes.sum() == 0 else sizes / sizes.sum()
        coeff = (gamma * torch.tensor(lams, dtype=torch.float64)).unsqueeze(-1)
        m_hats.append(m_hat)
        tau_hats.append(m_hat * (coeff * stacked).sum(dim=0))
    tau_hat_all = torch.stack(tau_hats)
    num_tasks = len(names)
    if cross_task in ("mean", "sum"):
        signs = torch.sign(tau_hat_all)
        sim = 0.5 * (signs @ signs.T / tau_hat_all.shape[1] + 1.0)
        z = neighbours(sim, eps, kappa)
    result = {}
    for t, task in enumerate(names):
        if cross_task == "none":
            new = tau_hats[t].clone()
        else:
            if cross_task == "uniform":
                others = [i for i in range(num_tasks) if i != t]
                weights = [1.0] * len(others)
                weight_sum = float(num_tasks - 1)
            else:
                others = z[t]
                weights = [float(sim[t, i]) for i in others]
                weight_sum = sum(weights)
            w = torch.as_tensor(weights, dtype=torch.float64)
            cross = m_hats[t] * (w.unsqueeze(-1) * tau_hat_all[others]).sum(dim=0)
            new = tau_hats[t] + cross
            if cross_task != "sum":
                new = new / (1.0 + float(weight_sum))
        result[task] = new.to(torch.float32)
    return result


def make_uploads(rng, d, tasks, holdings, dtype=torch.float32, non_finite=False):
    uploads = []
    for held in holdings:
        vector = torch.randn(d, dtype=torch.float64) * rng.choice([1.0, 1e-3])
        if rng.random() < 0.3:
            vector[torch.rand(d) < 0.3] = 0.0
        vector = vector.to(dtype)
        if non_finite and rng.random() < 0.5:
            vector[rng.randrange(d)] = rng.choice([float("inf"), float("-inf"), float("nan")])
        masks = {task: torch.rand(d) < rng.random() for task in held}
        if rng.random() < 0.2:
            masks = {task: mask.to(torch.float32) for task, mask in masks.items()}  # 0/1 masks are accepted too
        uploads.append({"unified": vector, "masks": masks, "rescalers": {t: rng.uniform(0.5, 2.0) for t in held},
                        "sizes": {t: rng.randint(0, 50) for t in held}})
    return uploads


def check_aggregate(uploads, **kwargs):
    expected = reference_aggregate(uploads, **kwargs)
    actual = aggregate(uploads, **kwargs)
    assert list(actual) == list(expected)
    for task in expected:
        assert_bitwise(actual[task], expected[task])


@pytest.mark.parametrize("seed", range(6))
def test_aggregate_equals_the_task_by_task_loop_on_random_uploads(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    d = rng.choice([1, 7, 1000, 70_003])  # 70_003: several spans of 16384 and a ragged last block
    tasks = [f"t{i}" for i in range(rng.randint(1, 7))]
    holdings = [rng.sample(tasks, rng.randint(1, len(tasks))) for _ in range(rng.randint(1, 10))]
    uploads = make_uploads(rng, d, tasks, holdings)
    for mode in CROSS_TASK_MODES:
        check_aggregate(uploads, cross_task=mode, rho=rng.choice([0.0, 0.4, 0.7, 1.0]), eps=rng.choice([0.0, 0.5]),
                        kappa=rng.choice([0, 1, 2, None]))


def test_aggregate_many_holders_and_many_tasks():
    rng = random.Random(7)
    torch.manual_seed(7)
    # 20 holders of "a": the sum over holders takes torch's cascade order (≥ 16 rows), per column as on the whole d.
    uploads = make_uploads(rng, 20_000, ["a", "b", "c"], [["a", *rng.sample(["b", "c"], rng.randint(0, 2))]
                                                           for _ in range(20)])
    for mode in CROSS_TASK_MODES:
        check_aggregate(uploads, cross_task=mode, kappa=None)
    # 18 tasks: "uniform" and kappa=None give ≥ 16 neighbours (batched by count, not padded).
    names = [f"t{i:02d}" for i in range(18)]
    uploads = make_uploads(rng, 3000, names, [[n] for n in names] + [["t00", "t01"], ["t03", "t17", "t04"]])
    for mode in CROSS_TASK_MODES:
        check_aggregate(uploads, cross_task=mode, kappa=None, eps=0.0)
        check_aggregate(uploads, cross_task=mode, kappa=3, eps=0.0)


def test_aggregate_non_finite_and_other_dtypes():
    rng = random.Random(11)
    torch.manual_seed(11)
    for _ in range(3):
        uploads = make_uploads(rng, rng.choice([300, 40_000]), list("abcd"),
                               [rng.sample("abcd", rng.randint(1, 4)) for _ in range(6)], non_finite=True)
        for mode in CROSS_TASK_MODES:
            check_aggregate(uploads, cross_task=mode)
    for dtype in (torch.float64, torch.float16, torch.bfloat16):
        uploads = make_uploads(rng, 20_000, list("abc"), [rng.sample("abc", rng.randint(1, 3)) for _ in range(5)],
                               dtype=dtype)
        for mode in CROSS_TASK_MODES:
            check_aggregate(uploads, cross_task=mode)


def test_aggregate_across_the_sign_buffer_border():
    rng = random.Random(3)
    torch.manual_seed(3)
    uploads = make_uploads(rng, (1 << 18) + 16_384 + 77, ["a", "b"], [["a"], ["b"], ["a", "b"]])
    for mode in ("mean", "uniform"):
        check_aggregate(uploads, cross_task=mode)


def _on_device(uploads):
    return [{**u, "unified": u["unified"].to("cuda"), "masks": {t: m.to("cuda") for t, m in u["masks"].items()}}
            for u in uploads]


@pytest.mark.parametrize("elements", [matu_aggregate._DEVICE_ELEMENTS, 1 << 12])
def test_aggregate_on_a_device_equals_the_task_by_task_loop(elements, monkeypatch):
    """On a device `aggregate` takes a span of columns as one block (a few large ops, not a cache-sized loop): on the
    simulated GPU its results are the reference's bit for bit, in one span and in many (a small element budget),
    non-finite uploads included; the result lies on the device, and the round reads back to the host at most twice
    (the finite checks, the sign counts; nothing per upload)."""
    monkeypatch.setattr(matu_aggregate, "_DEVICE_ELEMENTS", elements)
    rng = random.Random(5)
    torch.manual_seed(5)
    for non_finite in (False, True):
        uploads = make_uploads(rng, 9_001, list("abcd"), [rng.sample("abcd", rng.randint(1, 4)) for _ in range(8)],
                               non_finite=non_finite)
        uploads = [{**u, "masks": {t: m.bool() for t, m in u["masks"].items()}} for u in uploads]
        for mode in CROSS_TASK_MODES:
            expected = reference_aggregate(uploads, cross_task=mode, kappa=None)
            with simulated_cuda() as sim:
                actual = aggregate(_on_device(uploads), cross_task=mode, kappa=None)
                assert all(sim.on_device(v) for v in actual.values())
            assert sim.host_reads <= 2, sim.host_reads
            assert list(actual) == list(expected)
            for task in expected:
                assert_bitwise(actual[task], expected[task])


def test_task_similarity_equals_the_one_shot_float64_product():
    torch.manual_seed(0)
    for d in (1, 5, 65_536, 150_001):
        vectors = torch.randn(6, d)
        vectors[:, ::7] = 0.0
        signs = torch.sign(vectors.to(torch.float64))
        expected = (0.5 * (signs @ signs.T / d + 1.0)).to(torch.float32)
        assert_bitwise(task_similarity(vectors), expected)


# ------------------------------------------------------------------------------------------------ SFMTL-Graph reference


def reference_similarity_graph(heads, anchors, label_sets, alpha=0.49):
    """The original pair loop of `similarity_graph`."""
    held = [a[list(labels)] for a, labels in zip(anchors, label_sets, strict=True)]
    n = len(heads)
    weights = torch.zeros(n, n)
    for i in range(n):
        for j in range(i + 1, n):
            mixed = alpha * head_similarity(heads[i], heads[j], held[i], held[j])
            mixed += (1 - alpha) * anchor_similarity(held[i], held[j])
            weights[i, j] = weights[j, i] = max(0.0, mixed)
    return weights


def reference_communities(weights, seed, resolution=1.0):
    """The original `communities`: the graph built with one tensor index per pair."""
    graph = nx.Graph()
    graph.add_nodes_from(range(len(weights)))
    for i in range(len(weights)):
        for j in range(i + 1, len(weights)):
            if weights[i, j] > 0:
                graph.add_edge(i, j, weight=float(weights[i, j]))
    found = nx.community.louvain_communities(graph, weight="weight", resolution=resolution, seed=seed)
    return sorted((sorted(c) for c in found), key=lambda c: c[0])


def random_clients(rng, n, classes, features, label_counts, dtype=torch.float32, scale=1.0):
    heads = [(torch.randn(classes, features, dtype=dtype) * scale, torch.randn(classes, dtype=dtype))
             for _ in range(n)]
    anchors = [torch.randn(classes, features, dtype=dtype) for _ in range(n)]
    labels = [sorted(rng.sample(range(classes), rng.choice(label_counts))) for _ in range(n)]
    return heads, anchors, labels


# (clients, classes, features, label-set sizes): the configs' shapes (10 classes, hidden 64 or 512, 2 or 10 classes
# held), and shapes that take the other head paths: one held class (GEMV), tiny products (< 400 multiply-adds).
SHAPES = [(15, 10, 64, [2]), (30, 10, 64, [2]), (12, 10, 512, [2, 10]), (20, 10, 64, [10]), (12, 10, 64, [1, 2, 3]),
          (10, 3, 16, [1, 2, 3]), (12, 2, 2, [1, 2]), (9, 100, 64, [1, 5, 17, 40]), (6, 1, 8, [1]), (2, 10, 64, [2])]


@pytest.mark.parametrize("shape", SHAPES)
def test_similarity_graph_equals_the_pair_loop(shape):
    clients, classes, features, label_counts = shape
    rng = random.Random(clients * 1000 + classes * 10 + features)
    torch.manual_seed(clients * 7 + features)
    heads, anchors, labels = random_clients(rng, clients, classes, features, label_counts)
    for alpha in (0.49, 0.1, 0.9):
        assert_bitwise(similarity_graph(heads, anchors, labels, alpha),
                       reference_similarity_graph(heads, anchors, labels, alpha))


def test_similarity_graph_float64_small_scales_and_trivial_sizes():
    rng = random.Random(5)
    torch.manual_seed(5)
    heads, anchors, labels = random_clients(rng, 8, 10, 64, [2, 3], dtype=torch.float64)
    assert_bitwise(similarity_graph(heads, anchors, labels), reference_similarity_graph(heads, anchors, labels))
    heads, anchors, labels = random_clients(rng, 8, 10, 64, [2], scale=1e-6)
    assert_bitwise(similarity_graph(heads, anchors, labels), reference_similarity_graph(heads, anchors, labels))
    for n in (0, 1):
        heads, anchors, labels = random_clients(rng, n, 10, 8, [2])
        assert similarity_graph(heads, anchors, labels).shape == (n, n)


def test_head_outputs_equal_each_head_applied_alone():
    """The premise of the batched heads: bmm (MKL's batched GEMM) gives each head's product bit for bit."""
    torch.manual_seed(0)
    for count, classes, features in [(15, 10, 64), (200, 10, 512), (7, 2, 130), (30, 33, 20), (5, 1, 64)]:
        weight, bias = torch.randn(count, classes, features), torch.randn(count, classes)
        for rows in (1, 2, 3, 10):
            anchors = torch.randn(rows, features)
            batched = sfmtl_math._head_outputs(anchors, weight, bias)
            for k in range(count):
                assert_bitwise(batched[k], anchors @ weight[k].T + bias[k])


def test_communities_equal_the_pair_loop_graph():
    rng = random.Random(1)
    torch.manual_seed(1)
    heads, anchors, labels = random_clients(rng, 40, 10, 64, [2])
    weights = similarity_graph(heads, anchors, labels)
    for seed in (0, 1, 2):
        assert communities(weights, seed) == reference_communities(weights, seed)
    noisy = torch.rand(60, 60)
    noisy = ((noisy + noisy.T) / 2 - 0.4).clamp(min=0).fill_diagonal_(0)
    assert communities(noisy, 3, resolution=1.5) == reference_communities(noisy, 3, resolution=1.5)

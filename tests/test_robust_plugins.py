"""The robust aggregation plug-ins (clip, median, trimmed-mean, krum): the math by hand on tiny tensors, robustness
to one inflated update, the servers on `Update`s, then end to end over FedAvg and other hosts."""

import json

import pytest
import torch
from pydantic import ValidationError

from manytask.client.trainer import TrainConfig
from manytask.config import validate
from manytask.launch import run_config
from manytask.methods.base import Setup
from manytask.methods.common.aggregation import weighted_average
from manytask.methods.common.updates import Update
from manytask.methods.hosts.fedavg import FedAvgParams, FedAvgServer
from manytask.methods.plugins.robust import (
    ClipParams,
    ClipServer,
    KrumParams,
    KrumServer,
    MedianServer,
    TrimmedMeanParams,
    TrimmedMeanServer,
    clip,
    clip_bound,
    coordinate_median,
    coordinate_trimmed_mean,
    krum_scores,
    krum_select,
    norm,
    squared_distance,
    trim_count,
)
from manytask.methods.registry import PLUGINS
from manytask.registry import Params
from manytask.tasks import TaskKind, TaskSpec
from tests.conftest import small_config_dict


def w(*values: float) -> dict[str, torch.Tensor]:
    return {"w": torch.tensor(values)}


def tiny_host() -> FedAvgServer:
    specs = {"a": TaskSpec("a", TaskKind.CLASSIFICATION, 2)}
    setup = Setup(specs, (2,), "mlp", {"hidden": [2]}, TrainConfig(), seed=0, rounds=1, holdings={0: {"a": 10}})
    return FedAvgServer(setup, FedAvgParams())


# --- median and trimmed mean -----------------------------------------------------------------------------------


def test_median_of_an_odd_count_is_the_middle_value():
    out = coordinate_median([w(1, 5, -2), w(3, 0, 0), w(2, 1, 4)])
    assert torch.equal(out["w"], torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64))


def test_median_of_an_even_count_is_the_mean_of_the_two_middle_values():
    deltas = [w(1, 5, -2), w(3, 0, 0), w(2, 1, 4), w(10, -1, 1)]
    # sorted columns: [1, 2, 3, 10], [-1, 0, 1, 5], [-2, 0, 1, 4]; torch.median would give the lower [2, 0, 0].
    assert torch.equal(coordinate_median(deltas)["w"], torch.tensor([2.5, 0.5, 0.5], dtype=torch.float64))


def test_median_runs_per_key_over_the_updates_holding_it():
    deltas = [
        {"w": torch.tensor([1.0]), "heads.a.w": torch.tensor([1.0, 0.0])},
        {"w": torch.tensor([2.0]), "heads.a.w": torch.tensor([3.0, 1.0])},
        {"w": torch.tensor([9.0]), "heads.b.w": torch.tensor([7.0])},
    ]
    out = coordinate_median(deltas)
    assert out["w"].item() == 2.0
    assert torch.equal(out["heads.a.w"], torch.tensor([2.0, 0.5], dtype=torch.float64))  # two holders: their mean
    assert out["heads.b.w"].item() == 7.0  # one holder: its own value


def test_trimmed_mean_drops_exactly_the_extremes():
    deltas = [w(1, -50), w(2, 0), w(3, 1), w(4, 2), w(100, 3)]
    # β = 0.2, m = 5: ⌊1⌋ dropped at each end -> mean(2, 3, 4) = 3 and mean(0, 1, 2) = 1.
    assert torch.equal(coordinate_trimmed_mean(deltas, 0.2)["w"], torch.tensor([3.0, 1.0], dtype=torch.float64))
    # β = 0.1: ⌊0.5⌋ = 0, the plain mean.
    assert torch.allclose(coordinate_trimmed_mean(deltas, 0.1)["w"], torch.tensor([22.0, -8.8], dtype=torch.float64))


def test_trimmed_mean_counts_each_key_over_its_own_holders():
    deltas = [{**w(0), "h": torch.tensor([1.0])}, {**w(1), "h": torch.tensor([5.0])}, w(2), w(3), w(40)]
    out = coordinate_trimmed_mean(deltas, 0.25)
    assert out["w"].item() == 2.0  # m = 5: one dropped at each end, mean(1, 2, 3)
    assert out["h"].item() == 3.0  # m = 2: ⌊0.5⌋ = 0 dropped, mean(1, 5)


def test_trim_count_is_the_floor_of_beta_m():
    assert trim_count(0.29, 100) == 29  # 0.29·100 is 28.999… in floats
    assert trim_count(0.1, 10) == 1 and trim_count(0.1, 9) == 0 and trim_count(0.49, 4) == 1
    with pytest.raises(ValueError, match=r"\[0, 0.5\)"):
        coordinate_trimmed_mean([w(1)], 0.5)


# --- clipping ---------------------------------------------------------------------------------------------------


def test_clip_with_a_fixed_bound_scales_only_the_long_updates():
    long, short = {**w(3), "h": torch.tensor([4.0])}, {**w(0.6), "h": torch.tensor([0.8])}
    assert norm(long) == 5.0
    out = clip([long, short], clip_bound([5.0, 1.0], 2.0))
    assert torch.allclose(out[0]["w"], torch.tensor([1.2], dtype=torch.float64))  # the norm over both keys: 5 -> 2
    assert torch.allclose(out[0]["h"], torch.tensor([1.6], dtype=torch.float64))
    assert out[1] is short


def test_clip_with_the_median_bound():
    assert clip_bound([5.0, 1.0, 2.0], 0.0) == 2.0
    assert clip_bound([5.0, 1.0, 2.0, 4.0], 0.0) == 3.0  # even: the mean of the two middle norms
    out = clip([w(5), w(1), w(-2)], clip_bound([5.0, 1.0, 2.0], 0.0))
    assert [d["w"].item() for d in out] == [2.0, 1.0, -2.0]


# --- Krum -------------------------------------------------------------------------------------------------------

KRUM = [w(0, 0), w(1, 0), w(0, 1), w(10, 10)]  # squared distances: ab = ac = 1, bc = 2, ad = 200, bd = cd = 181


def test_krum_picks_the_update_closest_to_its_neighbours():
    # f = 0: m − f − 2 = 2 neighbours; scores a = 1 + 1, b = c = 1 + 2, d = 181 + 181.
    assert krum_scores(KRUM, 0).tolist() == [2.0, 3.0, 3.0, 362.0]
    assert krum_select(KRUM, 0, 1) == [0]


def test_multi_krum_selects_the_lowest_scores_ties_to_the_lower_index():
    assert krum_select(KRUM, 0, 2) == [0, 1]  # b and c tie: b, the lower index
    assert krum_select(KRUM, 0, 3) == [0, 1, 2]
    assert krum_select(KRUM, 1, 1) == [0]  # f = 1: one neighbour; a, b, c all score 1, a first


def test_krum_uses_one_neighbour_when_m_minus_f_minus_2_is_below_one():
    deltas = [w(0), w(1), w(3)]  # squared distances 1, 9, 4
    assert krum_scores(deltas, 1).tolist() == [1.0, 1.0, 4.0]
    assert krum_scores(deltas, 5).tolist() == [1.0, 1.0, 4.0]
    assert krum_scores([w(7)], 1).tolist() == [0.0] and krum_select([w(7)], 1, 3) == [0]


def test_krum_distances_run_over_the_keys_both_updates_hold():
    a = {"w": torch.tensor([0.0, 0.0]), "heads.a.w": torch.tensor([100.0])}
    b = {"w": torch.tensor([3.0, 4.0]), "heads.b.w": torch.tensor([-100.0])}
    assert squared_distance(a, b) == 25.0


# --- robustness to one inflated update -------------------------------------------------------------------------


def honest_and_inflated() -> tuple[list[dict[str, torch.Tensor]], torch.Tensor, torch.Tensor]:
    """Five honest random deltas and a sixth, an honest one scaled by 1e3; the honest per-entry min and max."""
    generator = torch.Generator().manual_seed(0)
    honest = [{"w": torch.randn(20, generator=generator)} for _ in range(5)]
    stacked = torch.stack([d["w"] for d in honest]).double()
    inflated = {"w": torch.randn(20, generator=generator) * 1e3}
    return [*honest, inflated], stacked.min(dim=0).values, stacked.max(dim=0).values


def test_median_and_trimmed_mean_stay_within_the_honest_range():
    deltas, low, high = honest_and_inflated()
    for out in (coordinate_median(deltas), coordinate_trimmed_mean(deltas, 0.2)):
        assert bool((out["w"] >= low).all()) and bool((out["w"] <= high).all())
    plain = coordinate_trimmed_mean(deltas, 0.0)["w"]  # the plain mean is dragged out
    assert not bool((plain <= high).all() and (plain >= low).all())


def test_krum_never_keeps_the_inflated_update():
    deltas, _, _ = honest_and_inflated()
    assert 5 not in krum_select(deltas, 1, 1)
    assert 5 not in krum_select(deltas, 1, 4)


def test_clip_bounds_every_norm():
    deltas, _, _ = honest_and_inflated()
    for max_norm in (0.0, 1.0):
        bound = clip_bound([norm(d) for d in deltas], max_norm)
        assert all(norm(d) <= bound * (1 + 1e-12) for d in clip(deltas, bound))
    assert clip_bound([norm(d) for d in deltas], 0.0) < 10  # the median ignores the inflated norm (~4500)


# --- the servers on Updates -------------------------------------------------------------------------------------

REFERENCE = {"w": torch.tensor([1.0, 1.0]), "buffer/bn": torch.tensor([0.0])}


def updates(changes: list[list[float]], sizes: list[int]) -> list[Update]:
    """Client n (size sizes[n]) moves "w" from [1, 1] by changes[n]; its buffer "bn" becomes n."""
    out = []
    for client, (change, size) in enumerate(zip(changes, sizes, strict=True)):
        trained = {"w": REFERENCE["w"] + torch.tensor(change), "buffer/bn": torch.tensor([float(client)])}
        out.append(Update(client, {"a": size}, REFERENCE, trained, {"w": float(size), "buffer/bn": float(size)}))
    return out


def test_median_server_makes_the_host_average_reference_plus_median_whatever_the_weights():
    server = MedianServer(tiny_host(), tiny_host().setup, Params())
    out = server.adjust(0, updates([[1.0, 0.0], [2.0, -1.0], [30.0, 5.0]], [10, 10, 1_000_000]))
    merged = weighted_average([u.trained for u in out], [u.weights for u in out])
    assert torch.allclose(merged["w"], torch.tensor([3.0, 1.0]))  # reference [1, 1] + median [2, 0]
    assert merged["buffer/bn"].item() == pytest.approx(2_000_010 / 1_000_020)  # buffers: the host's average
    assert out[2].weights == {"w": 1_000_000.0, "buffer/bn": 1_000_000.0}


def test_trimmed_mean_server_replaces_every_delta():
    server = TrimmedMeanServer(tiny_host(), tiny_host().setup, TrimmedMeanParams(trim=0.25))
    out = server.adjust(0, updates([[0.0, 0.0], [1.0, 2.0], [3.0, 4.0], [100.0, -100.0]], [1, 1, 1, 1]))
    assert all(torch.equal(u.trained["w"], torch.tensor([3.0, 2.0])) for u in out)  # 1 + mean(1, 3), 1 + mean(0, 2)


def test_clip_server_scales_long_updates_logs_them_and_leaves_the_others_as_they_were():
    server = ClipServer(tiny_host(), tiny_host().setup, ClipParams(max_norm=1.0))
    before = updates([[3.0, 4.0], [0.6, 0.0]], [10, 20])
    out = server.adjust(0, before)
    assert server.log == {"robust/clipped": 1.0}
    assert torch.allclose(out[0].trained["w"], torch.tensor([1.6, 1.8]))
    assert out[1] is before[1] and out[0].trained["buffer/bn"] is before[0].trained["buffer/bn"]


def test_krum_server_drops_the_outlier_and_keeps_the_host_weights():
    server = KrumServer(tiny_host(), tiny_host().setup, KrumParams(byzantine=1, select=2))
    before = updates([[0.0, 0.5], [0.5, 0.0], [1.0, 0.5], [50.0, 50.0]], [10, 20, 30, 40])
    out = server.adjust(0, before)
    # one neighbour (m − f − 2 = 1): a, b and c all score 0.5; the two lowest indices are kept
    assert [u.client for u in out] == [0, 1] and out[1] is before[1]
    assert server.log == {"robust/kept": 2.0}


def test_params_are_validated():
    for bad in (lambda: ClipParams(max_norm=-1.0), lambda: TrimmedMeanParams(trim=0.5),
                lambda: TrimmedMeanParams(trim=-0.1), lambda: KrumParams(byzantine=-1), lambda: KrumParams(select=0)):
        with pytest.raises(ValidationError):
            bad()
    assert {"clip", "median", "trimmed-mean", "krum"} <= set(PLUGINS.names())


# --- end to end -------------------------------------------------------------------------------------------------

ROUNDS = 8  # digits-tasks, 4 clients, seed 7: plain FedAvg reaches a mean accuracy of 0.748 (chance ≈ 0.23)


def run_one(tmp_path, host: str, plugin) -> tuple[float, list[dict]]:
    method = {"name": host, **({} if plugin is None else {"plugin": plugin})}
    (summary,) = run_config(validate(small_config_dict(method=method, rounds=ROUNDS)), tmp_path).values()
    rows = [json.loads(r) for r in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    accuracies = [m["accuracy"] for m in summary["tasks"].values()]
    return sum(accuracies) / len(accuracies), rows


@pytest.fixture(scope="module")
def fedavg_accuracy(tmp_path_factory) -> float:
    return run_one(tmp_path_factory.mktemp("fedavg"), "fedavg", None)[0]


# Measured mean accuracy after 8 rounds over FedAvg (0.748): clip (median bound) 0.743, clip max_norm 1 0.748
# (no update that long), median 0.751, trimmed-mean 0.738, krum 0.698, multi-krum (2) 0.716. Bar: FedAvg − 0.1.
@pytest.mark.slow
@pytest.mark.parametrize("plugin", ["clip", "median", "trimmed-mean", "krum", {"name": "krum", "select": 2}],
                         ids=["clip", "median", "trimmed-mean", "krum", "multi-krum"])
def test_fedavg_with_each_robust_plugin_stays_near_fedavg(tmp_path, fedavg_accuracy, plugin):
    accuracy, rows = run_one(tmp_path / "run", "fedavg", plugin)
    assert accuracy >= fedavg_accuracy - 0.1
    if plugin == "clip":  # the median bound clips about half of the 4 updates every round
        assert all(r["fit"]["robust/clipped"] >= 1 for r in rows if "fit" in r)
    if isinstance(plugin, dict):
        assert all(r["fit"]["robust/kept"] == 2 for r in rows if "fit" in r)


# Measured over FedNova (0.748 alone): median 0.751; over FedProx (0.748 alone): krum 0.699.
@pytest.mark.slow
@pytest.mark.parametrize(("host", "plugin"), [("fednova", "median"), ("fedprox", "krum")])
def test_robust_plugins_wrap_other_hosts(tmp_path, host, plugin):
    alone, _ = run_one(tmp_path / "alone", host, None)
    accuracy, _ = run_one(tmp_path / "run", host, plugin)
    assert accuracy >= alone - 0.1

"""FL + TaLoS's experiments: the measures on hand-made runs, the settings runner's configs (splits, J × rounds,
stretched sparse phases), that the paper's numbers name members the experiments run, and one smoke run."""

from pathlib import Path

import pytest
import yaml

from manytask.config import resolve
from manytask.experiments import talos
from manytask.experiments.catalogue import all_experiments
from manytask.experiments.runner import repository_root, units
from manytask.experiments.spec import EXPERIMENTS
from manytask.report.runs import RunRecord


def record(rows: list[dict], label: str = "talos") -> RunRecord:
    return RunRecord(Path(label), {"label": label, "average": rows[-1].get("average")}, rows)


def phased(phases: list[int], averages: dict[int, float]) -> RunRecord:
    """A run whose round r (1-based) is in phase phases[r - 1] and was evaluated where `averages` says."""
    rows = []
    for r, phase in enumerate(phases, 1):
        row = {"round": r, "bytes_up": {"0": 100 * (phase + 1), "1": 300}, "fit": {"phase": float(phase)}}
        if r in averages:
            row["average"] = averages[r]
        rows.append(row)
    return record(rows)


def test_accuracy_at_a_share_of_the_rounds_is_the_last_evaluation_by_then():
    run = phased([0] * 8, {2: 0.1, 4: 0.2, 6: 0.3, 8: 0.4})
    assert talos.accuracy_at_share(0.25)(run, {}) == pytest.approx(10.0)  # round 2
    assert talos.accuracy_at_share(0.6)(run, {}) == pytest.approx(20.0)  # round ceil(4.8) = 5 -> round 4
    assert talos.accuracy_at_share(1.0)(run, {}) == pytest.approx(40.0)


def test_accuracy_into_the_sparse_phase_counts_its_own_rounds():
    # head rounds 1-4, calibration 5, sparse 6-9; halfway: round 6 + ceil(2) - 1 = 7
    run = phased([0, 0, 0, 0, 1, 2, 2, 2, 2], {4: 0.3, 6: 0.35, 7: 0.4, 9: 0.5})
    assert talos.accuracy_into_phase(talos.SPARSE, 0.5)(run, {}) == pytest.approx(40.0)
    assert talos.accuracy_into_phase(talos.SPARSE, 1.0)(run, {}) == pytest.approx(50.0)
    assert talos.accuracy_into_phase(talos.SPARSE, 0.5)(phased([0, 0], {2: 0.1}), {}) is None


def test_upload_per_round_is_the_mean_over_the_last_phase():
    run = phased([0, 0, 1, 2, 2], {5: 0.5})
    assert talos.upload_per_round(run, {}) == pytest.approx((300 + 300) / 1e3)  # 300 + 300 bytes a sparse round
    head_only = record([{"round": r, "bytes_up": {"0": 1000 * r}, "fit": {}} for r in (1, 2)], "head-only")
    assert talos.upload_per_round(head_only, {}) == pytest.approx(1.5)


def test_training_loss_tail_averages_the_last_rounds_and_tasks():
    rows = [{"round": r, "fit": {"train_loss/a": float(r), "train_loss/b": float(r) + 1}} for r in range(1, 11)]
    assert talos.train_loss_tail(0.1)(record(rows), {}) == pytest.approx(10.5)
    assert talos.train_loss_tail(0.2)(record(rows), {}) == pytest.approx(10.0)


def test_mask_measures_read_the_calibration_round():
    fractions = {"trainable/backbone.layers.0.attention.q_proj.weight": 0.4,
                 "trainable/backbone.layers.0.attention.k_proj.weight": 0.2,
                 "trainable/backbone.layers.0.attention.v_proj.weight": 0.0,
                 "trainable/backbone.layers.0.attention.k_proj.bias": 1.0,
                 "trainable/backbone.layers.0.mlp.fc1.weight": 0.01,
                 "trainable/backbone.layers.0.mlp.fc2.weight": 0.0}
    run = record([{"round": 1, "fit": {"phase": 0.0}}, {"round": 2, "fit": {"phase": 1.0, **fractions}}])
    assert talos.mask_parameters(outside_qkv=False)(run, {}) == 4
    assert talos.mask_parameters(outside_qkv=True)(run, {}) == 2  # the key bias and fc1
    assert talos.qkv_share(run, {}) == pytest.approx(100 * 0.6 / 3)
    assert talos.mask_parameters(outside_qkv=False)(record([{"round": 1, "fit": {}}]), {}) is None


def test_a_j_setting_keeps_j_times_rounds_and_a_sparse_share_keeps_the_head_phase():
    config = {"rounds": 240, "train": {"local_steps": 4}, "method": {"name": "talos"}}
    j16 = talos.adjusted(config, talos.Setting("J=16", local_steps=16), "talos J=16")
    assert (j16["rounds"], j16["train"]["local_steps"], j16["method"]["label"]) == (60, 16, "talos J=16")
    assert config["train"]["local_steps"] == 4  # the member's config is left as it was
    longer = talos.adjusted(config, talos.Setting(sparse_share=4.0), "x4")
    assert (longer["method"]["head_rounds"], longer["rounds"]) == (120, 120 + 1 + 476)
    shorter = talos.adjusted({**config, "method": {"name": "talos", "head_rounds": 100}},
                             talos.Setting(sparse_share=0.5), "x")
    assert (shorter["method"]["head_rounds"], shorter["rounds"]) == (100, 100 + 1 + 70)


def test_the_papers_splits_keep_n_c_on_100_classes_and_shrink_with_the_smoke():
    root = str(repository_root() / talos.PROTOCOL)
    assert talos.scaled_shards(resolve(root, []), 5).endswith("classes_per_client: 5}")
    smoke = resolve(root, list(talos.SMOKE))  # 10 classes on 10 clients
    assert talos.scaled_shards(smoke, 50).endswith("classes_per_client: 5}")
    assert talos.scaled_shards(smoke, 1).endswith("classes_per_client: 1}")


def cpu_labels(experiment) -> set[str]:
    scale = experiment.scales["cpu"]
    if experiment.runner == "talos-settings":
        return {unit.label for setting in talos.SETTINGS[experiment.id]
                for unit in talos.setting_units(scale, setting, [0], Path("/nonexistent"))}
    config = resolve(str(repository_root() / scale.config), [*scale.overrides, "seeds=[0]"])
    return {unit.label for unit in units(config, Path("/nonexistent"), scale.members)}


def test_every_experiment_runs_the_members_the_paper_numbers_name():
    mine = [e for e in all_experiments() if e.paper == "talos"]
    assert len(mine) >= 19 and all({"smoke", "cpu", "paper"} <= set(e.scales) for e in mine)
    for experiment in mine:
        labels = cpu_labels(experiment)
        assert set(experiment.paper_numbers) <= labels, experiment.id
        columns = {column.name for column in experiment.columns}
        assert all(set(row) <= columns for row in experiment.paper_numbers.values()), experiment.id


def test_the_j_sweep_runs_every_split_at_a_constant_number_of_steps():
    scale = EXPERIMENTS["talos/fig3-nc-by-j"].scales["cpu"]
    found = [unit for setting in talos.SETTINGS["talos/fig3-nc-by-j"]
             for unit in talos.setting_units(scale, setting, [0], Path("/nonexistent"))]
    steps = {unit.label: yaml.safe_load(unit.config) for unit in found}
    assert len(steps) == 15
    assert {c["rounds"] * c["train"]["local_steps"] for c in steps.values()} == {960}
    assert steps["head-only N_c=5 J=8"]["federation"]["samples"] == {"kind": "shards", "classes_per_client": 5}


@pytest.mark.slow
def test_the_non_iid_table_runs_at_smoke_scale(tmp_path):
    from manytask.experiments.reproduce import reproduce

    result, path = reproduce("talos/table4-nc5", "smoke", jobs=1, out=tmp_path, log=lambda _: None)
    values = result["values"]
    assert path is None and list(values) == ["head-only", "talos", "talos-partition"]
    for label in values:
        assert 0 <= values[label]["accuracy %"][0] <= 100
    talos_row = values["talos"]
    final, start, gain = (talos_row[c][0] for c in ("accuracy %", "head phase's last evaluation %", "gain over it"))
    assert gain == pytest.approx(final - start)
    assert values["head-only"]["gain over it"] == [None]
    assert talos_row["final − FL head-only"][0] == pytest.approx(final - values["head-only"]["accuracy %"][0])
    config = yaml.safe_load((tmp_path / "seed0" / "talos" / "config.yaml").read_text())
    assert config["federation"]["samples"] == {"kind": "shards", "classes_per_client": 1}  # N_c = 5: 0.5 of 10 classes

"""The plug-ins-against-hosts table: Δ% by hand, host matching, uploads per round."""

from pathlib import Path

import pytest

from manytask.report.delta import delta_percent
from manytask.report.plugins import host_of, plot_plugin_sweep, plugin_sweeps, plugin_table
from manytask.report.runs import RunRecord


def _record(label, method="fedavg", plugin=None, acc=0.5, mse=2.0, up=1000, params=None):
    summary = {
        "label": label, "method": method, "method_params": params or {"mu": 0}, "plugin": plugin, "rounds": 10,
        "tasks": {"a": {"accuracy": acc}, "b": {"mse": mse}}, "main_metric": {"a": "accuracy", "b": "mse"},
        "higher_is_better": {"a": True, "b": False}, "average": acc, "bytes_up": up,
    }
    return RunRecord(Path(label), summary)


def test_delta_percent_by_hand():
    host, plugged = _record("fedavg"), _record("fedavg+dea", plugin="dea", acc=0.6, mse=1.5)
    # a: +(0.6 − 0.5)/0.5 = +20 %; b (lower is better): −(1.5 − 2)/2 = +25 %; mean 22.5
    assert delta_percent(plugged, host) == pytest.approx(22.5)
    assert delta_percent(host, host) == 0.0


def test_a_plugged_run_is_matched_to_the_host_with_the_same_parameters():
    records = [_record("fedprox", "fedprox", params={"mu": 0.1}), _record("fedprox-0", "fedprox"),
               _record("fedprox+dea", "fedprox", "dea", params={"mu": 0.1})]
    assert host_of(records[2], records).label == "fedprox"
    assert host_of(_record("fedavg+heal", plugin="fedheal"), records) is None


def test_the_table_has_a_row_per_host_and_a_column_per_plugin():
    records = [_record("fedavg", up=2000), _record("fedavg+dea", plugin="dea", acc=0.55, up=700),
               _record("fedavg+pcgrad", plugin="pcgrad", acc=0.45), _record("local", "local")]
    headers, rows = plugin_table(records)
    assert headers == ["host", "average", "+dea Δ%", "+pcgrad Δ%", "upload/round", "+dea upload/round",
                       "+pcgrad upload/round"]
    # dea: a +10 %, b 0 → +5.00; pcgrad: a −10 % → −5.00; uploads 2000/10, 700/10, 1000/10 bytes; the average of
    # an accuracy and an mse task is shown as a plain number
    assert rows == [["fedavg", "0.5000", "+5.00", "-5.00", "200 B", "70 B", "100 B"]]
    assert plugin_table(records[:1]) is None


def test_a_sweep_of_one_plugin_parameter_gives_delta_by_value(tmp_path):
    records = [_record("fedavg")] + [
        _record(f"fedavg+dea-{rho}", plugin="dea", acc=acc) for rho, acc in ((0.1, 0.4), (0.5, 0.6), (1.0, 0.5))]
    for record, rho in zip(records[1:], (0.1, 0.5, 1.0), strict=True):
        record.summary["plugin_params"] = {"rho": rho, "select": "largest"}
    ablation = _record("fedavg+dea-plain", plugin="dea", acc=0.55)
    ablation.summary["plugin_params"] = {"rho": 0.5, "select": "smallest"}  # a second parameter varies: no sweep
    # a: (0.4 − 0.5)/0.5 = −20 % → Δ −10 (b unchanged); 0.6 → +10; 0.5 → 0
    sweeps = plugin_sweeps(records)
    assert list(sweeps) == [("dea", "rho")] and list(sweeps["dea", "rho"]) == ["fedavg"]
    assert sweeps["dea", "rho"]["fedavg"] == [(0.1, pytest.approx(-10.0)), (0.5, pytest.approx(10.0)), (1.0, 0.0)]
    assert plugin_sweeps([*records, ablation]) == {}
    path = plot_plugin_sweep("dea", "rho", plugin_sweeps(records)[("dea", "rho")], tmp_path / "sweep.png")
    assert path.stat().st_size > 3000

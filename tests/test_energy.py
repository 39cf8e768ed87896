"""Cost accounting: total test loss, the energy estimate, measured energy through an injected meter, and the
'(est.)' label of tables and reports."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from manytask import energy
from manytask.config import validate
from manytask.energy import EnergyMeter, ZeusMeter, available_meter, energy_totals
from manytask.launch import run_config
from manytask.report import comparison_rows, markdown_table, rich_table
from manytask.report.runs import RunRecord
from manytask.report.tables import energy_footnote, format_energy, total_test_loss
from manytask.summary import total_test_loss as summary_total_test_loss
from tests.conftest import small_config_dict

ROWS = [
    {"round": 1, "client_seconds": {"0": 1.5, "1": 2.0}},
    {"round": 2, "client_seconds": {"0": 0.25, "2": 0.75}},
]  # 4.5 client compute seconds


class FixedMeter(EnergyMeter):
    """A meter that reads `joules` for every measurement; counts its calls."""

    def __init__(self, joules: float, source: str = "rapl") -> None:
        self.joules, self.source = joules, source
        self.started = self.stopped = 0

    def start(self) -> None:
        assert self.started == self.stopped, "start() twice without stop()"
        self.started += 1

    def stop(self) -> float:
        assert self.started == self.stopped + 1, "stop() without start()"
        self.stopped += 1
        return self.joules


def test_estimate_is_client_seconds_times_watts() -> None:
    assert energy_totals(ROWS, 15.0) == {"energy_joules": 4.5 * 15.0, "energy_estimated": True,
                                         "energy_source": "estimate: 15 W × client compute seconds"}
    assert energy_totals(ROWS, 2.5)["energy_joules"] == pytest.approx(11.25)
    assert energy.estimate_joules(4.5, 15.0) == 67.5


def test_measured_energy_is_summed_only_when_every_round_has_it() -> None:
    measured = [{**row, "energy_joules": j, "energy_source": "nvml"} for row, j in zip(ROWS, (10.0, 32.5), strict=True)]
    assert energy_totals(measured, 15.0) == {"energy_joules": 42.5, "energy_estimated": False,
                                             "energy_source": "nvml"}
    partly = [measured[0], ROWS[1]]  # e.g. resumed on a machine without a meter
    assert energy_totals(partly, 15.0) == energy_totals(ROWS, 15.0)


def test_total_test_loss_is_the_hand_sum() -> None:
    tasks = {"digit": {"accuracy": 0.9, "loss": 0.25}, "parity": {"accuracy": 0.8, "loss": 0.5},
             "sum": {"mse": 0.1, "loss": 0.125}}
    assert summary_total_test_loss(tasks) == 0.875
    assert summary_total_test_loss({**tasks, "edges": {"odsF": 0.7}}) is None
    assert total_test_loss({"tasks": tasks}) == 0.875  # tables: summed for summaries written before the key
    assert total_test_loss({"tasks": tasks, "total_test_loss": 1.5}) == 1.5


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_injected_meter_measures_every_round_and_training_is_unchanged(tmp_path: Path, monkeypatch) -> None:
    config = validate(small_config_dict(rounds=2, power_watts=40.0))
    meter = FixedMeter(2.5, "rapl+nvml")
    monkeypatch.setattr(energy, "available_meter", lambda: meter)
    measured = run_config(config, tmp_path / "measured")["fedavg"]
    assert meter.started == meter.stopped == 2
    rows = _rows(tmp_path / "measured")
    assert [(r["energy_joules"], r["energy_source"]) for r in rows] == [(2.5, "rapl+nvml")] * 2
    assert measured["energy_estimated"] is False
    assert measured["energy_joules"] == 5.0 and measured["energy_source"] == "rapl+nvml"
    assert measured["total_test_loss"] == pytest.approx(sum(m["loss"] for m in measured["tasks"].values()))

    monkeypatch.setattr(energy, "available_meter", lambda: None)
    estimated = run_config(config, tmp_path / "estimated")["fedavg"]
    assert not any("energy_joules" in row for row in _rows(tmp_path / "estimated"))
    assert estimated["energy_estimated"] is True
    assert estimated["energy_joules"] == pytest.approx(40.0 * estimated["client_compute_seconds"])
    assert estimated["energy_source"] == "estimate: 40 W × client compute seconds"
    assert estimated["tasks"] == measured["tasks"]  # energy is recorded, never fed back
    assert estimated["total_test_loss"] == measured["total_test_loss"]


def test_a_failed_reading_leaves_the_row_without_energy() -> None:
    failing = FixedMeter(float("nan"))
    failing.start()
    assert energy.reading(failing) == {}
    assert energy.reading(None) == {}
    meter = FixedMeter(3.0, "nvml")
    meter.start()
    assert energy.reading(meter) == {"energy_joules": 3.0, "energy_source": "nvml"}


def _record(label: str, **summary: Any) -> RunRecord:
    return RunRecord(Path(label), {"label": label, "tasks": {"digit": {"accuracy": 0.9, "loss": 0.5}},
                                   "main_metric": {"digit": "accuracy"}, **summary})


def test_table_marks_energy_as_estimated_exactly_when_it_is() -> None:
    measured = _record("measured", energy_joules=1234.0, energy_estimated=False, energy_source="rapl")
    estimated = _record("estimated", energy_joules=1234.0, energy_estimated=True, power_watts=15.0,
                        energy_source="estimate: 15 W × client compute seconds")
    assert format_energy(measured.summary) == "1.23 kJ"
    assert format_energy(estimated.summary) == "1.23 kJ (est.)"
    assert format_energy({}) == "–"

    headers, rows = comparison_rows([measured, estimated])
    column = headers.index("energy")
    assert [row[column] for row in rows] == ["1.23 kJ", "1.23 kJ (est.)"]
    assert rows[0][headers.index("total test loss")] == "0.5000"
    assert energy_footnote([measured]) is None
    note = energy_footnote([measured, estimated])
    assert note is not None and note.startswith("energy (est.) is estimated, not measured")
    assert "client compute seconds × 15 W" in note

    assert "(est.)" not in markdown_table(*comparison_rows([measured]))
    assert rich_table(*comparison_rows([measured])).caption is None
    assert "estimated, not measured" in str(rich_table(*comparison_rows([estimated])).caption)


def test_report_labels_the_estimate(tmp_path: Path, monkeypatch) -> None:
    from manytask.report import write_report

    monkeypatch.setattr(energy, "available_meter", lambda: None)
    config = validate(small_config_dict(rounds=1))
    run_config(config, tmp_path / "run")
    text = write_report(tmp_path / "run").read_text()
    assert "- energy: " in text and "(est.) — estimate: 15 W × client compute seconds" in text
    assert "- total test loss: " in text


def _fake_zeus(monkeypatch, cpus: list[int], gpus: list[int]) -> None:
    """Stand-in `zeus.monitor` module whose ZeusMonitor sees the given RAPL packages and GPUs."""

    class Measurement:
        def __init__(self) -> None:
            self.gpu_energy = dict.fromkeys(gpus, 100.0)
            self.cpu_energy = dict.fromkeys(cpus, 20.0) or None
            self.dram_energy = dict.fromkeys(cpus, 1.5) or None

    class ZeusMonitor:
        def __init__(self, **_: Any) -> None:
            self.cpu_indices, self.gpu_indices, self.gpus = cpus, gpus, object()

        def begin_window(self, key: str, sync_execution: bool = True) -> None:
            self.key = key

        def end_window(self, key: str, sync_execution: bool = True) -> Measurement:
            assert key == self.key
            return Measurement()

    zeus = types.ModuleType("zeus")
    monitor = types.ModuleType("zeus.monitor")
    monitor.ZeusMonitor = ZeusMonitor  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "zeus", zeus)
    monkeypatch.setitem(sys.modules, "zeus.monitor", monitor)


@pytest.fixture
def fresh_probe():
    """available_meter probes zeus once per process: clear that around a test that fakes it."""
    energy._zeus_monitor.cache_clear()
    yield
    energy._zeus_monitor.cache_clear()


def test_zeus_meter_sums_rapl_dram_and_gpu_joules(monkeypatch, fresh_probe) -> None:
    _fake_zeus(monkeypatch, cpus=[0, 1], gpus=[0])
    meter = available_meter()
    assert isinstance(meter, ZeusMeter) and meter.source == "rapl+nvml"
    meter.start()
    assert meter.stop() == pytest.approx(100.0 + 2 * 20.0 + 2 * 1.5)


def test_zeus_without_a_readable_meter_gives_none(monkeypatch, fresh_probe) -> None:
    _fake_zeus(monkeypatch, cpus=[], gpus=[])
    assert available_meter() is None


def test_no_meter_library_gives_none(monkeypatch, fresh_probe) -> None:
    monkeypatch.setitem(sys.modules, "zeus", None)  # as if zeus were not installed: its import fails
    monkeypatch.setitem(sys.modules, "zeus.monitor", None)
    assert available_meter() is None


def test_available_meter_is_none_on_a_machine_without_one(fresh_probe) -> None:
    try:
        import zeus.monitor  # noqa: F401
    except ImportError:
        assert available_meter() is None
        return
    meter = available_meter()
    if meter is not None:
        pytest.skip(f"the energy library is installed and reads a meter here ({meter.source})")
    assert meter is None

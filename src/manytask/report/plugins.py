"""Plug-ins against their hosts, read back from a comparison: for every member run with a plug-in whose host also
ran alone in the comparison (the same method and parameters, no plug-in), the multi-task gain Δ% (FedDEA's spec,
shared/specs/feddea.md) and the upload per round with and without the plug-in; and parameter sweeps (one plug-in
on one host at several values of one numeric parameter, e.g. DEA's ρ) as Δ% against the parameter."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from manytask.report.delta import delta_percent, signed
from manytask.report.plots import new_figure, save_figure
from manytask.report.runs import RunRecord
from manytask.report.tables import MISSING, format_average, human_bytes


def host_of(record: RunRecord, records: Sequence[RunRecord]) -> RunRecord | None:
    """The member that ran `record`'s method with the same parameters and no plug-in."""
    for other in records:
        same = (other.summary.get("method"), other.summary.get("method_params")) == (
            record.summary.get("method"), record.summary.get("method_params"))
        if same and other.summary.get("plugin") is None:
            return other
    return None


def upload_per_round(record: RunRecord) -> float | None:
    up, rounds = record.summary.get("bytes_up"), record.summary.get("rounds")
    return None if up is None or not rounds else up / rounds


def plugin_table(records: Sequence[RunRecord]) -> tuple[list[str], list[list[str]]] | None:
    """One row per host that ran alone and with plug-ins: its average, each plug-in's Δ% against it, and the
    upload per round of the host and of each plug-in; None when no member has a plug-in and its host."""
    pairs = [(record, host) for record in records if record.summary.get("plugin")
             if (host := host_of(record, records)) is not None]
    if not pairs:
        return None
    plugins = list(dict.fromkeys(_plugin(record) for record, _ in pairs))
    hosts = list(dict.fromkeys(host.label for _, host in pairs))
    by_host = {label: {_plugin(r): r for r, h in pairs if h.label == label} for label in hosts}
    host_records = {host.label: host for _, host in pairs}
    headers = ["host", "average", *(f"+{p} Δ%" for p in plugins), "upload/round",
               *(f"+{p} upload/round" for p in plugins)]
    rows = []
    for label in hosts:
        host, plugged = host_records[label], by_host[label]
        deltas = [signed(delta_percent(plugged[p], host)) if p in plugged else MISSING for p in plugins]
        uploads = [human_bytes(upload_per_round(plugged[p])) if p in plugged else MISSING for p in plugins]
        rows.append([label, format_average(host), *deltas, human_bytes(upload_per_round(host)), *uploads])
    return headers, rows


def _plugin(record: RunRecord) -> str:
    """The plug-in column of a run: its plug-in entry's label, else the plug-in's name."""
    return str(record.summary.get("plugin_label") or record.summary["plugin"])


Sweep = dict[str, list[tuple[float, float]]]  # host label -> (parameter value, Δ% against the host), by value


def plugin_sweeps(records: Sequence[RunRecord]) -> dict[tuple[str, str], Sweep]:
    """(plug-in, parameter) -> per host, its Δ% at each value, where at least three runs of one plug-in on one
    host differ in that numeric parameter alone."""
    groups: dict[tuple[str, str], list[tuple[RunRecord, RunRecord]]] = {}
    for record in records:
        host = host_of(record, records) if record.summary.get("plugin") else None
        if host is not None:
            groups.setdefault((host.label, str(record.summary["plugin"])), []).append((record, host))
    sweeps: dict[tuple[str, str], Sweep] = {}
    for (host_label, plugin), members in groups.items():
        param = _swept_parameter([record.summary.get("plugin_params") or {} for record, _ in members])
        if param is None:
            continue
        points = sorted((float(r.summary["plugin_params"][param]), delta) for r, host in members
                        if (delta := delta_percent(r, host)) is not None)
        sweeps.setdefault((plugin, param), {})[host_label] = points
    return sweeps


def _swept_parameter(params: list[dict]) -> str | None:
    """The one numeric parameter that takes ≥ 3 values while every other parameter is the same, else None."""
    keys = set().union(*params) if params else set()
    varying = [k for k in keys if len({repr(p.get(k)) for p in params}) > 1]
    if len(varying) != 1:
        return None
    values = [p.get(varying[0]) for p in params]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    return varying[0] if numeric and len(set(values)) >= 3 else None


def plot_plugin_sweep(plugin: str, param: str, sweep: Sweep, path: str | Path) -> Path:
    """Δ% against the host by parameter value, one line per host (0 = the host alone)."""
    figure = new_figure((6, 4))
    axes = figure.add_subplot()
    axes.axhline(0.0, color="gray", linewidth=1, linestyle="--")
    for host, points in sweep.items():
        axes.plot([v for v, _ in points], [d for _, d in points], marker="o", label=f"{host}+{plugin}")
    axes.set_xlabel(param)
    axes.set_ylabel("Δ% against the host")
    axes.set_title(f"{plugin}: Δ% by {param}")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    return save_figure(figure, path)

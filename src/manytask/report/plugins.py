"""Plug-ins against their hosts, read back from a comparison: for every member run with a plug-in whose host also
ran alone in the comparison (the same method and parameters, no plug-in), the multi-task gain Δ% (FedDEA's spec,
shared/specs/feddea.md) and the upload per round with and without the plug-in."""

from __future__ import annotations

from collections.abc import Sequence

from manytask.report.delta import delta_percent, signed
from manytask.report.runs import RunRecord, all_accuracy
from manytask.report.tables import MISSING, format_metric, human_bytes


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
        average = format_metric(host.summary.get("average"), "accuracy" if all_accuracy([host]) else "mse")
        rows.append([label, average, *deltas, human_bytes(upload_per_round(host)), *uploads])
    return headers, rows


def _plugin(record: RunRecord) -> str:
    """The plug-in column of a run: its plug-in entry's label, else the plug-in's name."""
    return str(record.summary.get("plugin_label") or record.summary["plugin"])

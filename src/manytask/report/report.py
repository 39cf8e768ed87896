"""The markdown report of a finished run or comparison, built from its run directory alone."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from manytask.metric_names import CLIENT_VIEW_PREFIX
from manytask.report.delta import delta_table, resolve_base
from manytask.report.figures import comparison_figures, run_figures
from manytask.report.graph import CommunitySummary, community_summary
from manytask.report.plugins import plugin_table
from manytask.report.runs import (
    RunRecord,
    all_accuracy,
    is_comparison,
    load_run,
    load_runs,
    read_oracle,
    read_summary,
)
from manytask.report.seeds import NOISE_NOTE, seed_table
from manytask.report.tables import (
    MISSING,
    comparison_rows,
    energy_footnote,
    format_average,
    format_energy,
    format_loss,
    format_metric,
    format_ratio,
    format_seconds,
    human_bits,
    human_bytes,
    markdown_table,
    task_rows,
    total_test_loss,
)

REPORT = "report.md"
PLOTS = "plots"


def _describe(value: Any) -> str:
    """Render a config-like value on one line: mappings as 'k=v, ...', null as 'none'."""
    if value is None or value == {}:
        return "none"
    if isinstance(value, dict):
        return ", ".join(f"{key}={_describe(item)}" for key, item in value.items())
    return str(value)


def _bullets(items: list[tuple[str, Any]]) -> str:
    """A markdown bullet list of 'name: value' lines."""
    return "\n".join(f"- {name}: {value}" for name, value in items) + "\n"


def _setup_section(record: RunRecord) -> str:
    """What was run: method, benchmark, seed, rounds, clients, backbone and pretraining."""
    s = record.summary
    return _bullets([
        ("method", f"{s.get('method', MISSING)} ({_describe(s.get('method_params'))})"),
        ("benchmark", s.get("benchmark", MISSING)),
        ("seed", s.get("seed", MISSING)),
        ("rounds", s.get("rounds", MISSING)),
        ("clients", s.get("num_clients", MISSING)),
        ("backbone", s.get("backbone", MISSING)),
        ("clients' optimizer", s.get("optimizer", MISSING)),
        ("pretraining", _describe(s.get("pretraining"))),
    ])


def _average_lines(record: RunRecord) -> list[tuple[str, str]]:
    """The average main metric and the average normalized to the reference run."""
    s = record.summary
    metric = "accuracy" if all_accuracy([record]) else "mse"
    normalized = format_ratio(s.get("normalized_average"))
    if s.get("normalized_average") is not None and s.get("reference"):
        normalized += f" of {s['reference']}"
    lines = [("average main metric", format_average(record)), ("normalized average", normalized),
             ("total test loss", format_loss(total_test_loss(s)))]
    client_view = _client_view_average(s)
    if client_view is not None:
        lines.append(("average main metric, clients' view", format_metric(client_view, metric)))
    if s.get("fairness"):
        f = s["fairness"]
        spread = ", ".join(f"{k} {format_metric(f[k], metric)}" for k in ("worst_10", "worst_20"))
        basis = (" (the server's per-task models on each client's tasks: clients holding the same tasks score the "
                 "same)" if s.get("clients_scored_by") == "server" else "")
        lines.append((f"across clients{basis}",
                      f"mean {format_metric(f['mean'], metric)}, {spread}, std {f['std']:.4f}"))
    return lines


def _client_view_average(summary: dict[str, Any]) -> float | None:
    """Mean over tasks of `client_<main metric>`, where a method reports its clients' view of every task (MaTU)."""
    tasks, main = summary.get("tasks") or {}, summary.get("main_metric") or {}
    values = [metrics.get(CLIENT_VIEW_PREFIX + main.get(task, "")) for task, metrics in tasks.items()]
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values)


def _communication_lines(record: RunRecord) -> list[tuple[str, str]]:
    """Total bytes up and down and the bits per task per round."""
    s = record.summary
    return [
        ("total up", human_bytes(s.get("bytes_up"))),
        ("total down", human_bytes(s.get("bytes_down"))),
        ("bits per task per round", human_bits(s.get("bits_per_task_per_round"))),
    ]


def _seconds(value: Any) -> str:
    """Seconds with a unit, or the missing marker."""
    return MISSING if value is None else f"{format_seconds(value)} s"


def _energy(summary: dict[str, Any]) -> str:
    """A run's energy with how it was obtained: '1.20 kJ — measured: rapl', or '1.20 kJ (est.) — estimate: 15 W ×
    client compute seconds'."""
    text = format_energy(summary)
    if summary.get("energy_joules") is None:
        return text
    source = summary.get("energy_source") or MISSING
    return f"{text} — {source}" if summary.get("energy_estimated", True) else f"{text} — measured: {source}"


def _time_lines(record: RunRecord) -> list[tuple[str, str]]:
    """Wall-clock time, summed client compute time and energy (measured, or marked as an estimate)."""
    s = record.summary
    return [
        ("wall time", _seconds(s.get("wall_seconds"))),
        ("client compute", _seconds(s.get("client_compute_seconds"))),
        ("energy", _energy(s)),
    ]


def _ari_text(value: float | None, decimals: int = 2) -> str:
    """An adjusted Rand index (or a modularity) with two decimals, or the missing marker."""
    return MISSING if value is None else f"{value:.{decimals}f}"


def _community_lines(record: RunRecord) -> list[tuple[str, str]]:
    """Bullet lines on a run's final communities; none for runs without communities."""
    found = community_summary(record)
    if found is None:
        return []
    last = found.last_round
    if found.ari_rounds:
        mean = f"mean {_ari_text(found.mean_ari)} over {found.ari_rounds} rounds"
        ari = f"{_ari_text(found.ari)} at round {last} ({mean})"
    else:
        ari = f"{MISSING} (the benchmark has no true client clusters)"
    lines = [("client communities", f"{found.communities} at round {last}"),
             ("community ARI vs the true client clusters", ari),
             ("modularity on the method's graph, mean over rounds", _modularities(found))]
    ceiling = read_oracle(record.path)
    if ceiling is not None and ceiling["ari"] is not None:
        lines.append(("cross-evaluation oracle (a ceiling)", f"ARI {ceiling['ari']:.2f} with "
                      f"{len(ceiling['communities'])} communities; models on their own data {ceiling['own']:.3f}, "
                      f"on the others' {ceiling['others']:.3f}"))
    return lines


def _modularities(found: CommunitySummary) -> str:
    """The found communities' modularity and, as a reference, the true clusters' on the same graphs."""
    true = (f"; the true clusters: {found.true_modularity:.3f}" if found.true_modularity is not None else
            "; no true clusters to compare")
    return f"the communities found: {_ari_text(found.found_modularity, 3)}{true}"


def _community_section(record: RunRecord) -> list[str]:
    """The client-communities section of a single-run report, when the run logged communities."""
    lines = _community_lines(record)
    return ["## Client communities\n", _bullets(lines)] if lines else []


def _community_table(records: list[RunRecord]) -> list[str]:
    """A comparison's table of final communities and their ARI, for the runs that logged communities."""
    found = [(record.label, community_summary(record)) for record in records]
    rows = [[label, str(c.last_round), str(c.communities), _ari_text(c.ari), _ari_text(c.mean_ari),
             _ari_text(c.found_modularity, 3), _ari_text(c.true_modularity, 3)]
            for label, c in found if c is not None]
    headers = ["run", "last round", "communities", "community ARI", "mean ARI over rounds",
               "modularity found (mean)", "modularity of the true clusters (mean)"]
    return ["## Client communities\n", markdown_table(headers, rows)] if rows else []


def _image(title: str, path: Path, root: Path) -> str:
    """A markdown image link relative to the report's folder."""
    return f"{title}:\n\n![{title}]({path.relative_to(root).as_posix()})\n"


FAILED_SHOWN = 10  # clients listed by name in a report; the rest are counted


def _failure_lines(record: RunRecord) -> list[tuple[str, str]]:
    """The simulated attack, if any, and every client that failed a round (lost, dropped or refused) with why."""
    s = record.summary
    lines = []
    if s.get("adversaries"):
        attack = dict(s["adversaries"])
        lines.append(("attack simulated", f"{attack.pop('attack')} by clients {attack.pop('attackers')} "
                      f"({_describe(attack)})"))
    failed = s.get("failed_clients") or {}
    for client, entry in list(failed.items())[:FAILED_SHOWN]:
        lines.append((f"client {client}", f"failed {entry['rounds']} round(s), the last in round "
                      f"{entry['last_round']}: {entry['reason']}"))
    if len(failed) > FAILED_SHOWN:
        lines.append(("other clients", f"{len(failed) - FAILED_SHOWN} more failed at least one round"))
    return lines


def _privacy_lines(record: RunRecord) -> list[tuple[str, str]]:
    """The (ε, δ) spent (the `dp` plug-in), with its mechanism."""
    spent = record.summary.get("privacy")
    if not spent:
        return []
    kind = "central DP" if spent["where"] == "server" else "local DP"
    bound = f"C = {spent['clip']:.3g}" + (" (adaptive, the last round's)" if spent["adaptive"] else "")
    return [("privacy", f"(ε, δ) = ({spent['epsilon']:.3g}, {spent['delta']:g}) after round {spent['after_round']}: "
             f"{kind}, z = {spent['noise_multiplier']:g}, {bound}; Opacus's RDP accountant")]


def _failure_section(record: RunRecord) -> list[str]:
    lines = _failure_lines(record)
    return ["## Failed clients and attacks\n", _bullets(lines)] if lines else []


def _stopped_note(record: RunRecord) -> list[str]:
    stopped = record.summary.get("stopped")
    if not stopped:
        return []
    return [f"**This run stopped in round {stopped['round']}.** The results are those of the model after the "
            f"{stopped['rounds_completed']} rounds that completed. Reason: {stopped['reason']}\n"]


def _single_report(
    record: RunRecord, graph_rounds: Sequence[int] | None = None, base: RunRecord | None = None
) -> str:
    """The full report of one run, writing its plots under plots/."""
    root = record.path
    images = run_figures(record, root / PLOTS, graph_rounds)
    return "\n".join([
        f"# Run report: {record.label}\n",
        *_stopped_note(record),
        _setup_section(record),
        "## Per-task results\n",
        markdown_table(*task_rows(record)),
        "## Averages\n",
        _bullets(_average_lines(record)),
        "## Communication\n",
        _bullets(_communication_lines(record)),
        "## Time and energy\n",
        _bullets(_time_lines(record)),
        *(["## Privacy\n", _bullets(_privacy_lines(record))] if _privacy_lines(record) else []),
        *_failure_section(record),
        *_community_section(record),
        *([] if base is None else _delta_section([record], base)),
        "## Plots\n",
        *(_image(title, path, root) for title, path in images),
        *_provenance_section(record),
    ])


def _provenance_section(record: RunRecord) -> list[str]:
    """Where the numbers came from (summary.json's `provenance`; a run made before it was recorded has none)."""
    facts = record.summary.get("provenance")
    if not facts:
        return []
    commit = facts.get("git_commit")
    changes = " with uncommitted changes" if facts.get("git_dirty") else ""
    code = f"{facts.get('manytask')}" + ("" if commit is None else f", git {commit[:12]}{changes}")
    return ["## Provenance\n", _bullets([
        ("manytask", code), ("Python", facts.get("python")), ("torch", facts.get("torch")),
        ("Flower", facts.get("flwr") or "not installed"), ("device", facts.get("device")),
        ("platform", facts.get("platform")), ("command", f"`{facts.get('command')}`")])]


def _delta_section(records: list[RunRecord], base: RunRecord) -> list[str]:
    return [f"## Δ% against {base.label}\n",
            "Δ% = mean over tasks of s_t·(M_t − M_t^base)/M_t^base × 100; s_t = +1 where higher is better (↑), −1 "
            "where lower is (↓).\n",
            markdown_table(*delta_table(records, base))]


def _run_section(record: RunRecord) -> str:
    """A short section on one member of a comparison: setup line, per-task table, averages."""
    s = record.summary
    setup = f"{s.get('method', MISSING)} ({_describe(s.get('method_params'))})"
    return "\n".join([
        f"### {record.label}\n",
        *_stopped_note(record),
        f"method: {setup}; clients' optimizer: {s.get('optimizer', MISSING)}; pretraining: "
        f"{_describe(s.get('pretraining'))}\n",
        markdown_table(*task_rows(record)),
        _bullets(_average_lines(record) + _communication_lines(record) + _time_lines(record)
                 + _community_lines(record) + _privacy_lines(record) + _failure_lines(record)),
    ])


def _comparison_report(
    root: Path, records: list[RunRecord], graph_rounds: Sequence[int] | None = None, base: str | None = None
) -> str:
    """The report of a comparison directory, writing its comparison and per-run plots under plots/. Δ% is taken
    against `base` (a member's label or a run directory), else the comparison's reference run, else its first
    member."""
    first = records[0].summary if records else {}
    root_summary = read_summary(root)
    reference = root_summary.get("reference")
    seeds = root_summary.get("seeds")
    base_name = base or reference or (records[0].label if records else None)
    # Over seeds, Δ% is taken seed by seed in the seeds' table, never against one seed's run
    base_record = None if base_name is None or seeds else resolve_base(records, base_name)
    images = comparison_figures(records, root / PLOTS, base_record, graph_rounds)
    return "\n".join([
        "# Comparison report\n",
        _bullets([
            ("benchmark", first.get("benchmark", MISSING)),
            ("seeds" if seeds else "seed", ", ".join(map(str, seeds)) if seeds else first.get("seed", MISSING)),
            ("rounds", first.get("rounds", MISSING)),
            ("clients", first.get("num_clients", MISSING)),
            ("backbone", first.get("backbone", MISSING)),
            ("reference", reference or "none"),
        ]),
        *_seed_section(records, base_name),
        *_tuning_section(records),
        "## Comparison\n",
        markdown_table(*comparison_rows(records)),
        *_footnote(energy_footnote(records)),
        *_plugin_section(records),
        *([] if base_record is None or len(records) < 2 else _delta_section(records, base_record)),
        *_community_table(records),
        "## Plots\n",
        *(_image(title, path, root) for title, path in images),
        "## Runs\n",
        *(_run_section(record) for record in records),
        *(_provenance_section(records[0]) if records else []),
    ])


def _tuning_section(records: list[RunRecord]) -> list[str]:
    """The budget of `manytask tune`, each member's search space, best values and validation score, when the runs'
    config came from it."""
    tuned = next((r.config["tuned"] for r in records if r.config.get("tuned")), None)
    if not tuned:
        return []
    rows = [[label, "; ".join(f"{k}: {d}" for k, d in m["space"].items()),
             ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in m["best"].items()),
             f"{m['validation_score']:.4f}", f"{m['trials']['complete']} / {m['trials']['pruned']} / "
             f"{m['trials']['failed']}"] for label, m in tuned["members"].items()]
    return ["## Tuning\n",
            f"Every member had the same budget: {tuned['trials']} Optuna trials (TPE; pruned trials count), each "
            f"scored over {tuned.get('repeats', 1)} seed(s) on "
            f"a validation split of {tuned['validation']:g} of every task's training data, never on the test set "
            f"(to {tuned['direction']} the average main metric). The study is `{tuned['study']}` in "
            "the tuning directory.\n",
            markdown_table(["member", "search space", "best values", "validation score",
                            "trials complete / pruned / failed"], rows)]


def _seed_section(records: list[RunRecord], base: str | None) -> list[str]:
    """Each member's mean ± std over its seeds, when the comparison ran several seeds."""
    table = seed_table(records, base)
    return [] if table is None else ["## Over seeds\n", markdown_table(*table), f"{NOISE_NOTE}\n"]


def _footnote(text: str | None) -> list[str]:
    """A note under a table, when there is one."""
    return [] if text is None else [f"{text}\n"]


def _plugin_section(records: list[RunRecord]) -> list[str]:
    """Each plug-in's Δ% against its host and the uploads, when the comparison ran hosts with and without them."""
    table = plugin_table(records)
    if table is None:
        return []
    return ["## Plug-ins against their hosts\n",
            "Δ% = mean over tasks of ±(metric − host's metric) / host's metric × 100 (+ where higher is better).\n",
            markdown_table(*table)]


def write_report(run_dir: str | Path, graph_rounds: Sequence[int] | None = None, base: str | None = None) -> Path:
    """Write report.md and plots/*.png inside a run or comparison directory; return the report's path.

    `graph_rounds` chooses the rounds of the client-graph plots of runs that logged communities; `base` the run
    Δ% is measured against (a run directory, or a member's label in a comparison)."""
    root = Path(run_dir)
    if is_comparison(root):
        text = _comparison_report(root, load_runs([root]), graph_rounds, base)
    else:
        record = load_run(root)
        text = _single_report(record, graph_rounds, None if base is None else resolve_base([record], base))
    out = root / REPORT
    out.write_text(text, encoding="utf-8")
    return out

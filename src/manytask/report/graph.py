"""SFMTL-Graph's client-similarity graph read back from a run: its communities per round, their adjusted Rand
index against the benchmark's true client clusters, and a plot of the graph coloured by community."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import networkx as nx
import numpy as np
from matplotlib import patheffects
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from manytask.errors import ManytaskError
from manytask.metric_names import COMMUNITIES, COMMUNITY_PREFIX, GRAPH_PREFIX
from manytask.report.plots import new_figure, save_figure
from manytask.report.runs import RunRecord

FEDERATION = "federation.json"
MARKERS = "os^Dv<>phP*X"  # one marker per true cluster
LAYOUT_SEED = 0  # a fixed seed, so the same run always gives the same picture

Edges = dict[tuple[int, int], float]


def community_rounds(record: RunRecord) -> list[int]:
    """The rounds whose fit scalars logged communities, in order."""
    return [int(row["round"]) for row in record.metrics if COMMUNITIES in (row.get("fit") or {})]


def _community_fit(record: RunRecord, round_: int) -> dict[str, Any]:
    """The fit scalars of `round_`, which must have logged communities."""
    for row in record.metrics:
        fit = row.get("fit") or {}
        if row.get("round") == round_ and COMMUNITIES in fit:
            return fit
    rounds = community_rounds(record)
    logged = f"it logged them at {len(rounds)} rounds from {rounds[0]} to {rounds[-1]}" if rounds else "it logged none"
    raise ManytaskError(f"run '{record.label}' logged no communities at round {round_}; {logged}.")


def client_graph(record: RunRecord, round_: int) -> tuple[list[int], Edges, dict[int, int]]:
    """The participants of `round_` (client ids, sorted), the positive edge weights {(a, b): w} with a < b, and
    each participant's community number."""
    fit = _community_fit(record, round_)
    community = {int(key[len(COMMUNITY_PREFIX):]): int(value)
                 for key, value in fit.items() if key.startswith(COMMUNITY_PREFIX)}
    edges: Edges = {}
    for key, weight in fit.items():
        if key.startswith(GRAPH_PREFIX):
            a, b = key[len(GRAPH_PREFIX):].split("/")
            edges[int(a), int(b)] = float(weight)
    return sorted(community), edges, community


def _read_holdings(path: Path) -> list[dict[str, list[int]]]:
    """Each client's tasks and sample indices from federation.json."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))["clients"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ManytaskError(f"cannot read the clients of '{path}' ({exc}).") from exc


def client_groups(record: RunRecord) -> dict[int, Any] | None:
    """Each client's true cluster: the group of the task it holds most samples of (its only task when it holds
    one). None when the benchmark has no groups or the run directory has no federation.json."""
    groups, path = record.summary.get("task_groups"), record.path / FEDERATION
    if not groups or not path.is_file():
        return None
    out = {}
    for client, holding in enumerate(_read_holdings(path)):
        main_task = max(holding, key=lambda task: len(holding[task]), default=None)
        if main_task in groups:
            out[client] = groups[main_task]
    return out


def _ari(community: dict[int, int], groups: dict[int, Any]) -> float | None:
    """Adjusted Rand index of the communities against the true clusters of the clients that have one."""
    clients = [client for client in community if client in groups]
    if not clients:
        return None
    from sklearn.metrics import adjusted_rand_score  # here: importing sklearn slows every `manytask run`

    return float(adjusted_rand_score([groups[c] for c in clients], [community[c] for c in clients]))


def community_ari(record: RunRecord, round_: int | None = None) -> float | None:
    """Adjusted Rand index of the communities of `round_` (default: the last round that logged them) against
    the participants' true clusters; None when the run logged no communities or the benchmark has no groups."""
    rounds, groups = community_rounds(record), client_groups(record)
    if not rounds or groups is None:
        return None
    return _ari(client_graph(record, rounds[-1] if round_ is None else round_)[2], groups)


def community_ari_curve(record: RunRecord) -> tuple[list[int], list[float]]:
    """Rounds with communities and the adjusted Rand index at each; empty when there is nothing to compare."""
    groups = client_groups(record)
    if groups is None:
        return [], []
    points = [(r, _ari(client_graph(record, r)[2], groups)) for r in community_rounds(record)]
    kept = [(r, ari) for r, ari in points if ari is not None]
    return [r for r, _ in kept], [ari for _, ari in kept]


def partition_modularity(edges: Edges, clients: list[int], label: dict[int, Any]) -> float | None:
    """Weighted modularity Q of the partition of `clients` by `label` on the graph `edges` (networkx's Q, the
    quantity Louvain maximizes); None on a graph without edges."""
    if not edges:
        return None
    graph = nx.Graph()
    graph.add_nodes_from(clients)
    graph.add_weighted_edges_from((a, b, w) for (a, b), w in edges.items())
    parts: dict[Any, set[int]] = {}
    for client in clients:
        parts.setdefault(label[client], set()).add(client)
    return float(nx.community.modularity(graph, list(parts.values()), weight="weight"))


def modularity_curves(record: RunRecord) -> dict[str, tuple[list[int], list[float]]]:
    """Per round with communities, on the method's own graph: the modularity of the communities it found and of
    the participants' true clusters (a reference: what the graph says of the true partition); the latter only where
    the benchmark has clusters."""
    groups = client_groups(record)
    curves: dict[str, tuple[list[int], list[float]]] = {"found": ([], []), "true": ([], [])}
    for round_ in community_rounds(record):
        clients, edges, community = client_graph(record, round_)
        labelled = {"found": (clients, community)}
        if groups is not None and all(c in groups for c in clients):
            labelled["true"] = (clients, groups)
        for name, (members, label) in labelled.items():
            value = partition_modularity(edges, members, label)
            if value is not None:
                curves[name][0].append(round_)
                curves[name][1].append(value)
    return curves


class CommunitySummary(NamedTuple):
    """A run's communities at the last round that logged them, and how well they matched the true clusters."""

    last_round: int
    communities: int
    ari: float | None  # at the last round
    mean_ari: float | None  # over the rounds that logged communities
    ari_rounds: int  # how many rounds the mean covers
    found_modularity: float | None = None  # mean over rounds, the communities found, on the method's graph
    true_modularity: float | None = None  # mean over rounds, the true clusters, on the same graph


def community_summary(record: RunRecord) -> CommunitySummary | None:
    """The communities of the last round that logged them and their adjusted Rand index (there and on average
    over rounds); None for runs without communities."""
    rounds = community_rounds(record)
    if not rounds:
        return None
    count = len(set(client_graph(record, rounds[-1])[2].values()))
    ari_rounds, aris = community_ari_curve(record)
    final = aris[-1] if ari_rounds and ari_rounds[-1] == rounds[-1] else None
    mean = sum(aris) / len(aris) if aris else None
    found, true = (_mean(values) for _, values in modularity_curves(record).values())
    return CommunitySummary(rounds[-1], count, final, mean, len(aris), found, true)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def default_graph_rounds(record: RunRecord) -> list[int]:
    """The first, middle and last round with communities (fewer when the run logged fewer)."""
    rounds = community_rounds(record)
    if not rounds:
        return []
    return list(dict.fromkeys([rounds[0], rounds[len(rounds) // 2], rounds[-1]]))


def _layout(clients: list[int], edges: Edges) -> dict[int, np.ndarray]:
    """Seeded spring layout where heavier edges pull clients closer."""
    graph = nx.Graph()
    graph.add_nodes_from(clients)
    graph.add_weighted_edges_from((a, b, w) for (a, b), w in edges.items())
    return nx.spring_layout(graph, weight="weight", seed=LAYOUT_SEED)


def _draw_edges(axes: Axes, layout: dict[int, np.ndarray], edges: Edges) -> None:
    """Edges in grey, wider and darker the heavier they are (relative to the panel's heaviest)."""
    if not edges:
        return
    heaviest = max(edges.values())
    strength = [w / heaviest for w in edges.values()]
    lines = LineCollection(
        [(layout[a], layout[b]) for a, b in edges],
        linewidths=[0.2 + 3.3 * s for s in strength],
        colors=[(0.3, 0.3, 0.3, 0.05 + 0.55 * s) for s in strength],
        zorder=1,
    )
    axes.add_collection(lines)


def _draw_nodes(
    axes: Axes, layout: dict[int, np.ndarray], community: dict[int, int], markers: dict[int, str]
) -> None:
    """Clients filled with their community's colour, shaped by their true cluster, labelled with their id."""
    for marker in dict.fromkeys(markers.values()):
        members = [c for c in community if markers[c] == marker]
        points = np.array([layout[c] for c in members])
        colours = [f"C{community[c] % 10}" for c in members]
        axes.scatter(points[:, 0], points[:, 1], s=330, c=colours, marker=marker, edgecolors="black",
                     linewidths=0.8, zorder=2)
    outline = [patheffects.withStroke(linewidth=2, foreground="black")]
    for client in community:
        x, y = layout[client]
        axes.text(x, y, str(client), ha="center", va="center", fontsize=7, color="white", fontweight="bold",
                  path_effects=outline, zorder=3)


def _panel_title(round_: int, community: dict[int, int], groups: dict[int, Any] | None) -> str:
    """Round, number of communities and, where clusters are known, the adjusted Rand index."""
    count = len(set(community.values()))
    title = f"round {round_}: {count} {'community' if count == 1 else 'communities'}"
    ari = None if groups is None else _ari(community, groups)
    return title if ari is None else f"{title}, ARI {ari:.2f}"


def _cluster_markers(groups: dict[int, Any] | None) -> dict[Any, str]:
    """A marker per true cluster, in sorted cluster order; empty when clusters are unknown."""
    if not groups:
        return {}
    ordered = sorted(set(groups.values()))
    return {group: MARKERS[i % len(MARKERS)] for i, group in enumerate(ordered)}


def _cluster_legend(axes: Axes, cluster_markers: dict[Any, str]) -> None:
    """A legend of the true-cluster markers, outside the panel on its right."""
    handles = [Line2D([], [], linestyle="", marker=m, markersize=9, markerfacecolor="white",
                      markeredgecolor="black", label=str(g)) for g, m in cluster_markers.items()]
    axes.legend(handles=handles, title="true cluster", loc="upper left", bbox_to_anchor=(1.0, 1.0),
                fontsize="small", frameon=False)


def _draw_panel(
    axes: Axes, record: RunRecord, round_: int, groups: dict[int, Any] | None, cluster_markers: dict[Any, str]
) -> None:
    """The graph of one round; clients of unknown cluster are circles."""
    clients, edges, community = client_graph(record, round_)
    layout = _layout(clients, edges)
    markers = {c: cluster_markers.get((groups or {}).get(c), "o") for c in clients}
    _draw_edges(axes, layout, edges)
    _draw_nodes(axes, layout, community, markers)
    axes.set_title(_panel_title(round_, community, groups), fontsize="medium")
    axes.set_aspect("equal", adjustable="datalim")
    axes.margins(0.12)
    axes.set_axis_off()


def draw_client_graph(record: RunRecord, rounds: Sequence[int]) -> Figure:
    """One panel per round: the participants' similarity graph, coloured by community, shaped by true cluster."""
    groups = client_groups(record)
    cluster_markers = _cluster_markers(groups)
    figure = new_figure((4.2 * len(rounds) + 1.0, 4.6))
    for index, round_ in enumerate(rounds, start=1):
        _draw_panel(figure.add_subplot(1, len(rounds), index), record, round_, groups, cluster_markers)
    if cluster_markers:
        _cluster_legend(figure.axes[-1], cluster_markers)
    shape = ", shape = true cluster" if cluster_markers else ""
    figure.suptitle(f"Client graph of {record.label} (colour = community{shape}, edge width ∝ weight)")
    return figure


def plot_client_graph(record: RunRecord, path: str | Path, rounds: Sequence[int] | None = None) -> Path | None:
    """Write the client-graph panels for `rounds` (default: first, middle and last round with communities);
    None when the run logged no communities."""
    if not community_rounds(record):
        return None
    chosen = list(rounds) if rounds else default_graph_rounds(record)
    return save_figure(draw_client_graph(record, chosen), path)

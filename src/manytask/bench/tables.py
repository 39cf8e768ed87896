"""The terminal's tables of `manytask bench`'s parts (docs/performance.md), one function per part's JSON key."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

BenchTable = tuple[list[str], list[list[str]], str]  # headers, rows, title


def _kernels_table(rows: list[dict]) -> BenchTable:
    few, many = rows[0]["clients"]
    return (
        ["host", "federation", f"ops, {few} clients", f"ops, {many} clients", f"{many} ÷ {few}", "host syncs"],
        [[r["host"], r["federation"], str(r["ops"][0]), str(r["ops"][1]), f"{r['ratio']:.2f}",
          f"{r['syncs'][0]} / {r['syncs'][1]}"] for r in rows],
        "kernels (non-view aten ops) per training round, execution auto (CNN + BatchNorm, grad clip, 4 local steps)")


def _limit_table(limit: dict) -> BenchTable:
    return (
        ["clients", "batched s/round", "concatenated s/round", "batched / concatenated", "sequential s/round",
         "bare sequential s/round", "sequential / bare", "checkpoint / batched round"],
        [[str(limit["clients"]), f"{limit['batched_s_per_round']:.4f}", f"{limit['concatenated_s_per_round']:.4f}",
          f"{limit['batched_ratio']:.3f}", f"{limit['sequential_s_per_round']:.4f}",
          f"{limit['bare_s_per_round']:.4f}", f"{limit['sequential_ratio']:.3f}", f"{limit['checkpoint_share']:.1%}"]],
        f"the compute limit (SFMTL's CNN on {limit['source']}, {limit['steps']} local steps, FedAvg, 1 thread; "
        f"median rounds and median paired ratios over {limit['turns']} turns)")


def _members_table(rows: list[dict]) -> BenchTable:
    first = rows[0]
    return (
        ["member", "steps", "batched s/round", "concatenated s/round", "batched / concatenated",
         "checkpoint / batched round"],
        [[r["member"], str(r["steps"]), f"{r['batched_s_per_round']:.4f}", f"{r['concatenated_s_per_round']:.4f}",
          f"{r['ratio']:.3f}", f"{r['checkpoint_share']:.1%}"] for r in rows],
        f"every member of the SFMTL comparison against the batched limit ({first['clients']} clients, SFMTL's CNN on "
        f"{first['source']}, 1 thread; median rounds and median paired ratios over {first['turns']} turns)")


def _paper_table(paper: dict) -> BenchTable:
    def figure(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:,.{digits}f}"

    return (
        ["member", "batched s/round", "sequential s/round", "batched images/s", "sequential images/s",
         "batched ÷ bare images/s", "checkpoint / batched round"],
        [[r["member"], figure(r["batched_s_per_round"], 3), figure(r["sequential_s_per_round"], 3),
          figure(r["batched_images_per_s"], 0), figure(r["sequential_images_per_s"], 0),
          f"{r['batched_over_bare']:.1f}", f"{r['checkpoint_share']:.1%}"] for r in paper["members"]]
        + [["bare sequential loop", "-", f"{paper['bare_s_per_round']:.3f}", "-", f"{paper['bare_images_per_s']:,.0f}",
            "1.0", ""], ["all members, batched", f"{paper['all_batched_s_per_round']:.3f}", "", "", "", "", ""]],
        f"paper scale ({paper['config']}, {paper['clients_per_round']} clients a round, on {paper['device']}; "
        "images/s counts sample passes)")


def _engine_table(rows: list[dict]) -> BenchTable:
    return (
        ["clients", "local engine s/round", "vectorized s/round", "bare loop s/round", "bare, PlainSGD s/round",
         "engine / bare", "engine / bare (PlainSGD)", "bare / vectorized"],
        [[str(r["clients"]), f"{r['engine_s_per_round']:.4f}", f"{r['vectorized_s_per_round']:.4f}",
          f"{r['bare_s_per_round']:.4f}", f"{r['bare_plain_sgd_s_per_round']:.4f}", f"{r['ratio']:.2f}",
          f"{r['ratio_plain_sgd']:.2f}", f"{r['vectorized_speedup']:.2f}"] for r in rows],
        "engine overhead (FedAvg, digits-tasks, MLP [64], 1 thread)")


def _workers_table(par: dict) -> BenchTable:
    return (
        ["workers", "1 process s/round", f"{par['workers']} workers s/round", "speed-up"],
        [[str(par["workers"]), f"{par['one_process_s_per_round']:.4f}", f"{par['workers_s_per_round']:.4f}",
          f"{par['speedup']:.2f}"]],
        "parallel clients (FedAvg, 20 clients, MLP [256, 256], 4 local epochs, same numbers)")


def _memory_table(runs: list[dict]) -> BenchTable:
    return (
        ["registered clients", "participation", "peak resident MB"],
        [[str(m["clients"]), f"{m['participation']:.0%}", f"{m['peak_rss_mb']:.0f}"] for m in runs],
        "memory (FedAvg on synthetic, 5 rounds, a whole run in a fresh process)")


def _matu_table(matu: dict) -> BenchTable:
    return (
        ["d", "tasks", "server step s", "one pass s", "step / pass"],
        [[f"{matu['d']:,}", str(matu["tasks"]), f"{matu['server_step_s']:.2f}", f"{matu['one_pass_s']:.3f}",
          f"{matu['ratio']:.0f}"]],
        "MaTU's server step against one pass over its uploads' memory")


def _sfmtl_table(graph: dict) -> BenchTable:
    return (
        ["clients", "similarity graph s", "Louvain s"],
        [[str(graph["clients"]), f"{graph['graph_s']:.2f}", f"{graph['louvain_s']:.2f}"]],
        "SFMTL-Graph's server step")


def _flower_table(sim: dict) -> BenchTable:
    return (
        ["clients", "local s/round", "local vectorized s/round", "Flower simulation s/round", "Flower / local",
         "Flower / vectorized"],
        [[str(sim["clients"]), f"{sim['local_s_per_round']:.4f}", f"{sim['vectorized_s_per_round']:.4f}",
          f"{sim['flower_sim_s_per_round']:.4f}", f"{sim['ratio']:.1f}", f"{sim['vectorized_ratio']:.1f}"]],
        "the local engine against Flower's simulation (same workload, same numbers)")


TABLES: dict[str, Callable[[Any], BenchTable]] = {  # the printed tables, in order, by their part's JSON key
    "kernels_per_round": _kernels_table,
    "compute_limit": _limit_table, "member_limits": _members_table, "paper_members": _paper_table,
    "engine_overhead": _engine_table, "parallel_clients": _workers_table, "peak_memory": _memory_table,
    "matu_server_step": _matu_table, "sfmtl_graph": _sfmtl_table, "flower_simulation": _flower_table,
}


def tables(results: Mapping[str, Any]) -> list[BenchTable]:
    """The terminal's tables of the parts `results` holds (the scale part: one paper-scale table per check)."""
    printed = [table(results[key]) for key, table in TABLES.items() if key in results]
    return printed + [_paper_table(check) for check in results.get("scale_members", {}).values()]

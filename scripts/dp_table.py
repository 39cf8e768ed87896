"""The `dp` plug-in's privacy–utility table (docs/privacy.md): FedAvg alone and with central DP (fixed clipping
bound C) at the noise multipliers z that spend ε ≈ 1, 4 and 8 (δ = 1e-5) over the run's rounds at its sampling rate,
on the default job's setting (10 clients, all of them every round, 20 rounds) and at 1 000 clients with 10 %
participation (100 rounds; IID samples: the default's label skew leaves some of 1 000 clients without a sample).
The default job's FedAvg is `per_task`, which `dp` refuses (one client's copies would multiply its sensitivity), so
FedAvg here sends one model per client.

    python scripts/dp_table.py OUT [--seeds 0 1 2] [--clip 0.1]

Each (setting, seed) is one comparison run in OUT/<setting>-seed<s>; finished ones are read back, not rerun. Writes
OUT/table.md and OUT/table.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
from importlib import resources
from pathlib import Path
from typing import Any

import manytask
from manytask.config_sources import load_yaml
from manytask.engine.loop import RoundFailed
from manytask.methods.plugins.dp import epsilon, round_rdp

TARGETS = (8.0, 4.0, 1.0)
DELTA = 1e-5
# (clients, participation, rounds, sample partition): the default job's, and a federation large enough for DP
SETTINGS = {"default job (10 clients, all every round, 20 rounds)": (10, 1.0, 20, None),
            "1 000 clients, 10 % a round, 100 rounds, IID": (1000, 0.1, 100, {"kind": "iid"})}


def noise_for(target: float, q: float, rounds: int) -> float:
    """The z whose `rounds` sampled Gaussian mechanisms at rate q spend ε = `target` (bisection on log z)."""
    low, high = 0.05, 500.0
    for _ in range(60):
        middle = (low * high) ** 0.5
        if epsilon(round_rdp(q, middle, rounds), DELTA) > target:
            low = middle
        else:
            high = middle
    return high


def members(q: float, rounds: int, clip: float) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = [{"name": "fedavg", "label": "fedavg"}]
    for target in TARGETS:
        z = noise_for(target, q, rounds)
        entries.append({"name": "fedavg", "label": f"dp-eps{target:g}",
                        "plugin": {"name": "dp", "clip": clip, "noise_multiplier": round(z, 4), "delta": DELTA}})
    return entries


def run_setting(out: Path, name: str, seed: int, clip: float) -> dict[str, dict[str, Any]]:
    """Each member's summary of one setting and seed (read back where the run finished)."""
    clients, q, rounds, samples = SETTINGS[name]
    path = out / f"clients{clients}-seed{seed}"
    if (path / "summary.json").exists():
        return manytask.load(path).summaries
    config = load_yaml(resources.files("manytask") / "configs" / "default.yaml")
    config.update(reference=None, rounds=rounds, seed=seed, eval_every=rounds,
                  method=members(q, rounds, clip), participation=q)
    config["federation"] = {**config["federation"], "num_clients": clients,
                            **({} if samples is None else {"samples": samples})}
    print(f"{name}, seed {seed}: {path}", flush=True)
    try:
        return manytask.run(config, path).summaries
    except RoundFailed as failed:  # a member the noise made diverge; the others finished
        print(failed, flush=True)
        return manytask.load(path).summaries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--clip", type=float, default=0.1)
    args = parser.parse_args()
    table: dict[str, dict[str, Any]] = {}
    for name in SETTINGS:
        per_seed = [run_setting(args.out, name, s, args.clip) for s in args.seeds]
        rows = {}
        for label in per_seed[0]:
            accuracy = [100 * summaries[label]["average"] for summaries in per_seed]
            privacy = per_seed[0][label].get("privacy") or {}
            diverged = [summaries[label].get("stopped") is not None for summaries in per_seed]
            rows[label] = {"accuracy": accuracy, "diverged": diverged, "epsilon": privacy.get("epsilon"),
                           "noise_multiplier": privacy.get("noise_multiplier")}
        table[name] = rows
    lines = [f"C = {args.clip:g}, δ = {DELTA:g}; average accuracy over the six tasks (%), "
             f"seeds {' / '.join(map(str, args.seeds))}.", "",
             "| setting | member | z | ε spent | accuracy, each seed | mean ± std |", "|---|---|---|---|---|---|"]
    for name, rows in table.items():
        for label, row in rows.items():
            accuracy = row["accuracy"]
            if any(row["diverged"]):
                lines.append(f"| {name} | {label} | {row['noise_multiplier']:.3g} | – | diverged on "
                             f"{sum(row['diverged'])} of {len(accuracy)} seeds | – |")
                continue
            spread = statistics.stdev(accuracy) if len(accuracy) > 1 else 0.0
            eps = "∞ (no noise)" if row["epsilon"] is None else f"{row['epsilon']:.2f}"
            z = "–" if row["noise_multiplier"] is None else f"{row['noise_multiplier']:.3g}"
            lines.append(f"| {name} | {label} | {z} | {eps} | {' / '.join(f'{a:.1f}' for a in accuracy)} | "
                         f"{statistics.mean(accuracy):.1f} ± {spread:.1f} |")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    (args.out / "table.json").write_text(json.dumps(table, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

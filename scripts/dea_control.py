"""FedDEA against its server-step control (docs/results.md): on a hosts × DEA config, every host alone, with DEA
(which logs its norm inflation c = ‖Δ̃‖ / ‖Δ‖ every round), with DEA's `rule: paper` for the stateful hosts (FedDyn,
FedACG: eq. 6 in place of their rule), and alone with its server step scaled by c ("host × c": `server_lr` = the
mean of the c that DEA logged on the same host and seed). Every line's Δ% is against its host on the same seed.

    python scripts/dea_control.py configs/feddea/scenes_nyud_step_control.yaml runs/dea-control --seeds 0 1 2
    python scripts/dea_control.py CONFIG OUT --table-only       # the table of finished runs

The config gives the shared settings, the hosts (`method`, a list) and the DEA entry (`plugins`, the one named dea).
Each member is a single run in OUT/seed<s>/<label>; finished runs are kept, so a rerun only does what is missing.
Runs go `--jobs` at a time, one torch thread each. Writes OUT/table.md and OUT/table.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from manytask.config_sources import load_yaml

STATEFUL = ("feddyn", "fedacg")  # hosts whose server rule keeps state fed by the updates
INFLATION = "dea/inflation"


def load(config: Path) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """(the shared settings, the host names, the DEA plug-in entry) of a hosts × DEA config."""
    raw = load_yaml(config)
    hosts = [m if isinstance(m, str) else m["name"] for m in raw.pop("method")]
    plugins = raw.pop("plugins", None) or []
    dea = next((p for p in plugins if isinstance(p, dict) and p.get("name") == "dea"), None)
    if dea is None:
        raise SystemExit(f"{config}: 'plugins' has no dea entry")
    return raw, hosts, dea


def first_members(hosts: list[str], dea: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs that need nothing measured first: each host alone, with DEA, and with DEA's paper rule."""
    entries = []
    for host in hosts:
        entries += [{"name": host, "label": host}, {"name": host, "label": f"{host}+dea", "plugin": dea}]
        if host in STATEFUL:
            entries.append({"name": host, "label": f"{host}+dea-paper", "plugin": {**dea, "rule": "paper"}})
    return entries


def inflation(run: Path) -> float:
    """The mean over rounds of the norm inflation c a DEA run logged."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    values = [row["fit"][INFLATION] for row in rows if INFLATION in row.get("fit", {})]
    if not values:
        raise SystemExit(f"{run} logged no {INFLATION}")
    return sum(values) / len(values)


def run_member(job: tuple[dict[str, Any], Path]) -> str:
    """One single run (resumed where it stopped, skipped where it finished); its directory."""
    import torch

    from manytask.config import validate
    from manytask.launch import resume, run_config
    from manytask.rundir import RunDir

    torch.set_num_threads(1)
    settings, out = job
    if RunDir(out).is_finished():
        return str(out)
    if out.exists():
        resume(out)
    else:
        run_config(validate(settings), out)
    return str(out)


def run_all(jobs: list[tuple[dict[str, Any], Path]], workers: int) -> None:
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for done in pool.map(run_member, jobs):
            print("finished", done, flush=True)


def table(out: Path, hosts: list[str], seeds: list[int]) -> tuple[str, dict[str, Any]]:
    """The Δ% of every line against its host, seed by seed, with the mean; c per host."""
    from manytask.report.delta import delta_percent
    from manytask.report.runs import load_run

    figures: dict[str, Any] = {}
    lines = ["| host | c (mean over seeds) | +DEA Δ% | host × c Δ% | +DEA, rule: paper Δ% |", "|---|---|---|---|---|"]
    for host in hosts:
        row: dict[str, Any] = {"c": [inflation(out / f"seed{s}" / f"{host}+dea") for s in seeds]}
        for line in ("+dea", "×c", "+dea-paper"):
            if line == "+dea-paper" and host not in STATEFUL:
                continue
            row[line] = [delta_percent(load_run(out / f"seed{s}" / f"{host}{line}"), load_run(out / f"seed{s}" / host))
                         for s in seeds]
        figures[host] = row

        def cell(values: list[float] | None) -> str:
            if values is None:
                return "–"
            return " / ".join(f"{v:+.1f}" for v in values) + f"; **{statistics.mean(values):+.1f}**"

        lines.append(f"| {host} | {statistics.mean(row['c']):.2f} | {cell(row['+dea'])} | {cell(row['×c'])} | "
                     f"{cell(row.get('+dea-paper'))} |")
    return "\n".join(lines) + "\n", figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--table-only", action="store_true", help="only write the table of finished runs")
    args = parser.parse_args()
    settings, hosts, dea = load(args.config)
    if not args.table_only:
        run_all([({**settings, "seed": s, "method": entry}, args.out / f"seed{s}" / entry["label"])
                 for s in args.seeds for entry in first_members(hosts, dea)], args.jobs)
        controls = [({**settings, "seed": s, "method": {"name": h, "label": f"{h}×c",
                                                         "server_lr": inflation(args.out / f"seed{s}" / f"{h}+dea")}},
                     args.out / f"seed{s}" / f"{h}×c") for s in args.seeds for h in hosts]
        run_all(controls, args.jobs)
    text, figures = table(args.out, hosts, args.seeds)
    (args.out / "table.md").write_text(text)
    (args.out / "table.json").write_text(json.dumps({"config": str(args.config), "seeds": args.seeds,
                                                     "hosts": figures}, indent=2))
    print(text)


if __name__ == "__main__":
    main()

"""The first step off the default job: `manytask run benchmark=X rounds=1` for every offline benchmark, and
`method=M benchmark=B rounds=1` for every method on digits-tasks and scenes. Prints a Markdown table of the
pairs: exit code, whether a run directory was left, and the last line a user sees.

    python scripts/first_try.py [--out DIR] [--only-benchmarks] [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

OFFLINE = ["digits-tasks", "label-skew", "mnist1d", "rotated-masked-digits", "scene-objects", "scenes", "synthetic"]
METHOD_BENCHMARKS = ["digits-tasks", "scenes"]


def attempt(overrides: list[str], root: Path) -> dict:
    out = root / "-".join(o.split("=")[1] for o in overrides)
    command = [sys.executable, "-m", "manytask", "run", *overrides, "rounds=1", "--quiet", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    error = next((line for line in lines if line.startswith("error:")), None)
    traceback = "Traceback" in done.stderr
    return {"overrides": " ".join(overrides), "exit": done.returncode, "traceback": traceback,
            "left_directory": out.exists() and done.returncode != 0,
            "said": error or (lines[-1] if lines else "")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    parser.add_argument("--only-benchmarks", action="store_true")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    from manytask.methods import METHODS

    cases = [[f"benchmark={b}"] for b in OFFLINE]
    if not args.only_benchmarks:
        cases += [[f"benchmark={b}", f"method={m}"] for b in METHOD_BENCHMARKS for m in sorted(METHODS.names())]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda case: attempt(case, Path(tmp)), cases))
    print("| overrides (rounds=1) | exit | traceback | directory left | last line |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        said = row["said"].replace("|", "\\|")[:160]
        print(f"| {row['overrides']} | {row['exit']} | {'yes' if row['traceback'] else 'no'} | "
              f"{'yes' if row['left_directory'] else 'no'} | {said} |")
    bad = [r for r in rows if r["exit"] not in (0, 2) or r["traceback"] or r["left_directory"]]
    print(f"\n{len(rows)} pairs: {sum(r['exit'] == 0 for r in rows)} ran, "
          f"{sum(r['exit'] == 2 for r in rows)} refused in one sentence, {len(bad)} failed badly")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

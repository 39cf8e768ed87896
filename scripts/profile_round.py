"""Where a batched round's time goes, for the next lent GPU: one member of SFMTL-Graph's paper-scale comparison,
one warm-up round, then one round under torch's profiler (CPU and, where there is one, CUDA activity); prints the
ops that took the most device time and the most host time, and the round's batched steps.

    python scripts/profile_round.py [--member fedavg] [--top 15] [key=value ...]   # overrides of the paper config
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from manytask.bench.paper_scale import PAPER_CONFIG, member_config
from manytask.bench.timing import engine_runner
from manytask.config import resolve
from manytask.method_entry import method_label


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--member", default="fedavg", help="a member's label in the paper config")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    config = resolve(str(PAPER_CONFIG), args.overrides)
    method = next(m for m in config.methods if method_label(m) == args.member)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with engine_runner(member_config(config, method, "auto", 4)) as run:
        run(1)
        began = time.perf_counter()
        with profile(activities=activities) as trace:
            run(1)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        seconds = time.perf_counter() - began
    print(f"{args.member}: one batched round {seconds:.3f} s under the profiler")
    events = trace.key_averages()
    if torch.cuda.is_available():
        print(events.table(sort_by="cuda_time_total", row_limit=args.top))
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()

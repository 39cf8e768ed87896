"""A SIGKILL campaign (issue 17): kill `manytask run` at each write, rename, mkdir, ftruncate, unlink and creating
open that touches its run directory while it creates the directory and runs its first two rounds, resume it as a
user would, and check that every resumed run ends with the uninterrupted run's numbers.

    .venv/bin/python scripts/kill_campaign.py [--quick] [--keep] [--json PATH] [--workdir DIR] [--jobs N]

How a kill point is chosen. One uninterrupted run is traced with strace; each call on the run directory gets its
index N among the process's calls of that syscall. A kill run is the same command under
`strace -e trace=SYSCALL -e inject=SYSCALL:signal=KILL:when=N`: SIGKILL arrives on entering that call, before it runs,
so the directory is left as the calls before it made it. Nothing depends on time, and each kill is checked: the call
strace killed (its log line ends `= ?`) must be the expected one, on the expected path. strace counts calls per
thread, so the check also catches a thread that reached N first. PYTHONDONTWRITEBYTECODE=1 keeps `.pyc` writes from
shifting the counts when a source file changes.

Both kinds of run are covered: a single FedAvg run and a FedAvg-vs-Local comparison (3 rounds each, 4 clients,
`threads: 1`, checkpoints written by the round loop's thread: strace's N counts per thread, and a writer thread
would race the loop's to it; tests/test_checkpoint_writer.py crashes a background write from the code). Every kill
is resumed with `manytask run --resume DIR`; a directory without config.yaml, which `--resume` refuses, is started
again with `manytask run CONFIG --out DIR`. The resumed run must have the uninterrupted metric rows (less the
clock's `wall_seconds`, `client_seconds` and `energy_joules`) and the same summaries (less their clock fields and
the provenance of the process that finished them). In full mode, a few resumes are themselves killed (at unlink, the
metrics rewrite, the first append and the first checkpoint rename) and resumed again.

Prints a table and "N kills, M resumed to the uninterrupted numbers"; exits 1 when any kill missed its call or any
resumed run differs or keeps files the uninterrupted run does not have (leftovers)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROUNDS = 3
CONFIG = """name: kill-{kind}
method: {method}
benchmark: {{name: digits-tasks, tasks: [digit, parity, rotated]}}
federation: {{num_clients: 4, tasks: {{kind: dirichlet, zeta: 1.0}}, samples: {{kind: iid}}}}
model: {{backbone: mlp, hidden: [32]}}
train: {{lr: 0.05, local_steps: 5, batch_size: 32}}
rounds: {rounds}
seed: 7
eval_every: 1
threads: 1
checkpoint_background: false
"""
METHODS = {"single": ["fedavg"], "comparison": ["fedavg", "local"]}
TRACED = ("mkdir", "openat", "write", "ftruncate", "rename", "renameat", "renameat2", "unlink", "unlinkat")
ROW_CLOCK = ("wall_seconds", "client_seconds", "energy_joules")
# and the provenance, which names the process that finished the run (a resumed run's command line is --resume)
SUMMARY_CLOCK = ("wall_seconds", "client_compute_seconds", "energy_joules", "provenance")
COMPARISON_CLOCK = ("warmup_seconds",)  # the process's warm-up before its first member (a resumed one warms up too)
KILLED_PHASES = re.compile(r"^(create|(\w+ )?round [12]|(\w+ )?summary|comparison summary)$")
# --quick: (kind, phase, syscall, path) of six kills, renames and writes, in both kinds of run; each kills the first
# call that matches it (a checkpoint is written in several calls: the first leaves a torn temporary).
QUICK = {
    ("single", "create", "rename", "config.yaml"),  # left only config.yaml.tmp: once a directory nothing resumed
    ("single", "round 1", "write", "checkpoint.safetensors.tmp"),
    ("single", "round 2", "rename", "checkpoint.safetensors"),
    ("comparison", "create", "rename", "local/config.yaml"),
    ("comparison", "fedavg round 2", "write", "fedavg/metrics.jsonl"),
    ("comparison", "local round 1", "write", "local/checkpoint.safetensors.tmp"),
}
# Full mode: the kills whose directory is resumed by a resume that is itself killed at a few of its own calls.
RESUME_BASES = {
    "single": ("round 2", "rename", "checkpoint.safetensors"),
    "comparison": ("local round 1", "rename", "local/checkpoint.safetensors"),
}
LINE = re.compile(r"^(?P<pid>\d+)\s+(?P<name>\w+)\((?P<rest>.*)$")
QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
FD_PATH = re.compile(r"^\d+<(?P<path>[^>]*)>")
RANDOM_TEMPORARY = re.compile(r"(^|/)\.tmp\w{6}$")  # safetensors' own temporary, renamed to X.tmp when written


@dataclass(frozen=True)
class Call:
    """One traced call on the run directory. `when` is strace's N: its rank among the process's calls of `syscall`."""

    syscall: str
    when: int
    path: str  # relative to the run directory ('.' for itself); a rename's destination
    source: str = ""  # a rename's source
    flags: str = ""
    phase: str = ""
    pid: int = 0
    killed: bool = False  # the log line ends '= ?': the call the injected SIGKILL stopped

    def shown(self) -> str:
        return f"{self.source} -> {self.path}" if self.source else self.path


@dataclass
class Outcome:
    """One kill and its resume."""

    kind: str
    during: str  # 'run' (the first run was killed) or 'resume' (a resume was)
    call: Call
    exit_code: int = 0
    hit: str = ""  # the call strace killed, when it is not the expected one
    on_disk: str = ""
    resumed_with: str = ""
    resume_exit: int = 0
    same_numbers: bool = False
    problems: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    directory: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == -9 and not self.hit and self.same_numbers


@dataclass
class Kind:
    """One kind of run: its config, members and the uninterrupted run's numbers and files."""

    name: str
    config: Path
    members: list[str]
    reference: dict[str, Any] = field(default_factory=dict)
    files: set[str] = field(default_factory=set)


def manytask() -> list[str]:
    """The `manytask` entry point beside this interpreter, as a user runs it (else its module)."""
    entry = Path(sys.executable).parent / "manytask"
    return [str(entry)] if entry.exists() else [sys.executable, "-m", "manytask.cli"]


def fresh_command(kind: Kind, out: Path) -> list[str]:
    return [*manytask(), "run", str(kind.config), "--out", str(out), "--quiet"]


def resume_command(out: Path) -> list[str]:
    return [*manytask(), "run", "--resume", str(out), "--quiet"]


def strace(log: Path, trace: str, inject: Call | None = None) -> list[str]:
    """strace options: follow threads and children, one line per call with fds shown as paths, no signal lines."""
    argv = ["strace", "-f", "-qq", "-y", "-s", "8", "-e", "signal=none", "-o", str(log), "-e", f"trace={trace}"]
    if inject is not None:
        argv += ["-e", f"inject={inject.syscall}:signal=KILL:when={inject.when}"]
    return argv


def execute(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)


def relative(path: str, root: Path) -> str | None:
    """`path` relative to the run directory, a random temporary shown as `.tmp*`; None outside the directory."""
    base = str(root)
    if path != base and not path.startswith(base + "/"):
        return None
    rel = os.path.relpath(path, base)
    return RANDOM_TEMPORARY.sub(r"\1.tmp*", rel)


def paths_of(name: str, rest: str) -> list[str]:
    """The paths a call names: the fd's path for write and ftruncate, else its quoted path arguments."""
    if name in ("write", "ftruncate"):
        found = FD_PATH.match(rest)
        return [found["path"]] if found else []
    quoted = QUOTED.findall(rest)
    return quoted[:2] if name.startswith("rename") else quoted[:1]


def parse_trace(log: Path, root: Path) -> list[Call]:
    """The calls on `root` in an strace log, in order, each with its per-process, per-syscall index."""
    counts: Counter[tuple[int, str]] = Counter()
    calls = []
    for line in log.read_text(errors="replace").splitlines():
        found = LINE.match(line)
        if found is None:
            continue  # '<... resumed>' halves and exit lines: the call was counted at its entry
        pid, name, rest = int(found["pid"]), found["name"], found["rest"]
        counts[pid, name] += 1
        rels = [relative(p, root) for p in paths_of(name, rest)]
        if not any(r is not None for r in rels):
            continue
        flags = "|".join(re.findall(r"\bO_[A-Z]+", rest)) if name == "openat" else ""
        source, target = (rels[0] or "", rels[1] or "") if len(rels) == 2 else ("", rels[0] or "")
        killed = rest.rstrip().endswith("= ?")
        calls.append(Call(name, counts[pid, name], target, source, flags, pid=pid, killed=killed))
    return calls


def label_phases(calls: list[Call], members: list[str]) -> list[Call]:
    """Name each call's phase: 'create' until the first round starts, then '[MEMBER ]round R' for a member's files,
    '[MEMBER ]summary' after its last round, 'comparison summary' and 'report'."""
    comparison = members != [""]
    done = dict.fromkeys(members, 0)
    started = False
    labelled = []
    for call in calls:
        head = call.path.split("/", 1)[0]
        member = head if comparison and head in done else ("" if not comparison else None)
        started = started or call.path.endswith("metrics.jsonl.tmp")
        prefix = f"{member} " if member else ""
        if call.path == "report.md" or call.path.startswith("plots"):
            phase = "report"
        elif not started:
            phase = "create"
        elif member is None:
            phase = "comparison summary"
        else:
            phase = f"{prefix}round {done[member] + 1}" if done[member] < ROUNDS else f"{prefix}summary"
        if member is not None and call.syscall.startswith("rename") and call.path.endswith("checkpoint.safetensors"):
            done[member] += 1
        labelled.append(replace(call, phase=phase))
    return labelled


def killable(call: Call) -> bool:
    """Calls that change the directory: every one but opens that create nothing."""
    return call.syscall != "openat" or "O_CREAT" in call.flags


def select(calls: list[Call], kind: str, quick: bool) -> list[Call]:
    """The kill points: in --quick the six of QUICK, else every change of the creation, the first two rounds and the
    summaries, and the write of report.md."""
    if quick:
        first: dict[tuple[str, str, str, str], Call] = {}
        for c in calls:
            first.setdefault((kind, c.phase, c.syscall, c.path), c)
        return [c for key, c in first.items() if key in QUICK]
    return [c for c in calls if chosen(c)]


def chosen(call: Call) -> bool:
    if call.phase == "report":
        return call.syscall == "write" and call.path == "report.md"
    return killable(call) and KILLED_PHASES.match(call.phase) is not None


def select_resume(calls: list[Call]) -> list[Call]:
    """A resume's own kill points: its unlinks of stray temporaries, the rename of its rewritten metrics, its first
    metrics append and its first checkpoint rename."""
    picks = [c for c in calls if c.syscall.startswith("unlink") or (c.path.endswith("metrics.jsonl")
             and c.syscall == "rename")]
    appends = [c for c in calls if c.syscall == "write" and c.path.endswith("metrics.jsonl")]
    renames = [c for c in calls if c.syscall == "rename" and c.path.endswith("checkpoint.safetensors")]
    return picks + appends[:1] + renames[:1]


def kill_check(log: Path, root: Path, expected: Call) -> str:
    """'' when the call strace killed is `expected`; else what was killed instead."""
    killed = [c for c in parse_trace(log, root) if c.killed]
    if not killed:
        return "no call on the run directory was killed"
    got = killed[-1]
    if (got.syscall, got.when, got.path, got.source) != (expected.syscall, expected.when, expected.path,
                                                          expected.source):
        return f"{got.syscall} #{got.when} {got.shown()}"
    return ""


def checkpoint_round(path: Path) -> str:
    """The round a checkpoint holds, read from its metadata (without torch), or why it cannot be read."""
    try:
        with path.open("rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(size))
        return str(json.loads(header["__metadata__"]["manytask"])["round"])
    except (OSError, ValueError, KeyError, TypeError):
        return "unreadable"


def metrics_state(path: Path) -> str:
    """Complete rows, and '+torn' for a last line without its newline."""
    text = path.read_text(errors="replace")
    rows = text.count("\n")
    return f"{rows}" + ("+torn" if text and not text.endswith("\n") else "")


def describe(root: Path) -> str:
    """What a kill left, compactly: e.g. 'cfg fed metrics(1) ckpt(r1) checkpoint.safetensors.tmp'."""
    if not root.exists():
        return "(no directory)"
    short = {"config.yaml": "cfg", "federation.json": "fed", "summary.json": "summary"}
    parts = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "plots" not in p.parts):
        rel = relative(str(path), root) or path.name
        folder, _, name = rel.rpartition("/")
        if name == "metrics.jsonl":
            name = f"metrics({metrics_state(path)})"
        elif name == "checkpoint.safetensors":
            name = f"ckpt(r{checkpoint_round(path)})"
        parts.append(f"{folder}/" * bool(folder) + short.get(name, name))
    return " ".join(parts) or "(empty directory)"


def rows(path: Path) -> list[dict[str, Any]] | None:
    if not path.is_file():
        return None
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def without(data: dict[str, Any] | None, keys: tuple[str, ...]) -> dict[str, Any] | None:
    return None if data is None else {k: v for k, v in data.items() if k not in keys}


def load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def numbers(root: Path, members: list[str]) -> dict[str, Any]:
    """What must not change when a run is killed and resumed: each member's metric rows and summary without what a
    clock measured, and a comparison's combined summary."""
    found: dict[str, Any] = {}
    for member in members:
        folder = root / member if member else root
        metric_rows = rows(folder / "metrics.jsonl")
        found[member or "run"] = {
            "rows": None if metric_rows is None else [without(r, ROW_CLOCK) for r in metric_rows],
            "summary": without(load(folder / "summary.json"), SUMMARY_CLOCK),
        }
    if members != [""]:
        combined = load(root / "summary.json")
        if combined is not None:
            combined = {**without(combined, COMPARISON_CLOCK),
                        "runs": {k: without(v, SUMMARY_CLOCK) for k, v in combined["runs"].items()}}
        found["comparison"] = combined
    return found


def differences(expected: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Where the resumed numbers differ: the first differing round and fields of each part."""
    problems = []
    for part, want in expected.items():
        have = got.get(part)
        if have == want:
            continue
        if have is None or not isinstance(want, dict) or "rows" not in want:
            problems.append(f"{part}: {'missing' if have is None else 'differs'}")
            continue
        problems += row_differences(part, want["rows"], have["rows"])
        if have["summary"] is None:
            problems.append(f"{part}: no summary.json")
        elif have["summary"] != want["summary"]:
            keys = sorted(k for k in set(want["summary"]) | set(have["summary"])
                          if have["summary"].get(k) != want["summary"].get(k))
            problems.append(f"{part}/summary.json differs in {keys}")
    return problems


def row_differences(part: str, want: list[dict[str, Any]], have: list[dict[str, Any]] | None) -> list[str]:
    if have is None:
        return [f"{part}: no metrics.jsonl"]
    rounds = [r.get("round") for r in have]
    if rounds != [r["round"] for r in want]:
        return [f"{part}: rounds {rounds}, expected {[r['round'] for r in want]}"]
    for index, (a, b) in enumerate(zip(want, have, strict=True)):
        if a != b:
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            return [f"{part}: round {index + 1} differs in {keys}: {[(a.get(k), b.get(k)) for k in keys][:2]}"]
    return []


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} if root.exists() else set()


def resume_as_user(kind: Kind, out: Path) -> tuple[str, int, str]:
    """Resume as a user would: `--resume DIR`; where that is refused because the kill came before config.yaml,
    start the run again into the same directory. Returns (what was run, exit code, the end of its stderr)."""
    done = execute(resume_command(out), out.parent)
    if done.returncode == 0 or (out / "config.yaml").is_file():
        return "--resume", done.returncode, tail(done.stderr)
    refused = tail(done.stderr)
    again = execute(fresh_command(kind, out), out.parent)
    how = f"--resume refused ({refused}); run --out"
    return how, again.returncode, tail(again.stderr)


def tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def judge(outcome: Outcome, kind: Kind, out: Path) -> Outcome:
    """Describe what the kill left, resume as a user would and compare with the uninterrupted run."""
    outcome.on_disk = describe(out)
    outcome.resumed_with, outcome.resume_exit, stderr = resume_as_user(kind, out)
    if outcome.resume_exit != 0:
        outcome.problems.append(f"resume exited {outcome.resume_exit}: {stderr}")
    outcome.problems += differences(kind.reference, numbers(out, kind.members))
    outcome.leftovers = sorted(files(out) - kind.files)
    if outcome.leftovers:  # a resumed directory must be as clean as an uninterrupted one
        outcome.problems.append(f"left behind: {' '.join(outcome.leftovers)}")
    outcome.same_numbers = not outcome.problems
    return outcome


def kill(kind: Kind, call: Call, case: Path, state: Path | None = None) -> Outcome:
    """Kill a fresh run at `call` (or, given the `state` a kill left, a resume of a copy of it) into `case`/run,
    and check that the call strace killed is `call`."""
    case.mkdir(parents=True)
    out, log = case / "run", case / "strace.log"
    if state is None:
        argv = fresh_command(kind, out)
    else:
        shutil.copytree(state, out)
        argv = resume_command(out)
    done = execute(strace(log, call.syscall, call) + argv, case)
    outcome = Outcome(kind.name, "run" if state is None else "resume", call, done.returncode, directory=str(case))
    outcome.hit = kill_check(log, out, call) if done.returncode == -9 else f"not killed (exit {done.returncode})"
    return outcome


def kill_run(kind: Kind, call: Call, case: Path) -> Outcome:
    """Kill a fresh run at `call`, resume it and compare."""
    outcome = kill(kind, call, case)
    return judge(outcome, kind, case / "run")


def enumerate_calls(argv: list[str], out: Path, members: list[str], log: Path) -> list[Call]:
    """Trace one uninterrupted command and list its calls on the run directory, with their phases."""
    done = execute(strace(log, ",".join(TRACED)) + argv, log.parent)
    if done.returncode != 0:
        raise SystemExit(f"traced run failed ({done.returncode}): {tail(done.stderr)}")
    return label_phases(parse_trace(log, out), members)


def prepare(name: str, work: Path) -> tuple[Kind, list[Call]]:
    """Write the config, run it uninterrupted for the reference numbers, then trace a second run for the calls
    (and check it has the same numbers, else kill points from it would not be comparable)."""
    methods = METHODS[name]
    method = methods[0] if len(methods) == 1 else "[" + ", ".join(methods) + "]"
    config = work / f"{name}.yaml"
    config.write_text(CONFIG.format(kind=name, method=method, rounds=ROUNDS))
    kind = Kind(name, config, [""] if len(methods) == 1 else methods)
    full = work / f"{name}-uninterrupted"
    done = execute(fresh_command(kind, full), work)
    if done.returncode != 0:
        raise SystemExit(f"the uninterrupted {name} run failed: {tail(done.stderr)}")
    kind.reference, kind.files = numbers(full, kind.members), files(full)
    traced = work / f"{name}-traced"
    traced.mkdir()
    calls = enumerate_calls(fresh_command(kind, traced / "run"), traced / "run", kind.members, traced / "strace.log")
    if differences(kind.reference, numbers(traced / "run", kind.members)):
        raise SystemExit(f"the traced {name} run does not reproduce the uninterrupted numbers; nothing to compare")
    return kind, calls


def resume_campaign(kind: Kind, calls: list[Call], work: Path) -> list[Outcome]:
    """Kill a run at its RESUME_BASES call and keep what it left; resume a copy of that (the base kill's check); trace
    the resume of another copy for the resume's own calls; kill further copies' resumes at a few of those calls and
    resume them again."""
    phase, syscall, path = RESUME_BASES[kind.name]
    base = next(c for c in calls if (c.phase, c.syscall, c.path) == (phase, syscall, path))
    root = work / f"{kind.name}-resume-kills"
    state = root / "state"
    killed = kill(kind, base, state)
    if killed.exit_code != -9 or killed.hit:
        return [judge(killed, kind, state / "run")]
    first = kill(kind, base, root / "base")
    first = judge(first, kind, root / "base" / "run")
    traced = root / "traced"
    shutil.copytree(state / "run", traced / "run")
    resume_calls = enumerate_calls(resume_command(traced / "run"), traced / "run", kind.members,
                                   traced / "strace.log")
    picks = [replace(c, phase="resume") for c in select_resume(resume_calls)]
    again = [kill(kind, c, root / f"{i:02d}-{c.syscall}", state / "run") for i, c in enumerate(picks)]
    return [first] + [judge(o, kind, Path(o.directory) / "run") for o in again]


def campaign(work: Path, quick: bool, jobs: int) -> list[Outcome]:
    """Every kill of both kinds of run, `jobs` at a time."""
    tasks = []
    kinds = [prepare(name, work) for name in METHODS]
    for kind, calls in kinds:
        for index, call in enumerate(select(calls, kind.name, quick)):
            tasks.append((kind, call, work / f"{kind.name}-{index:03d}-{call.syscall}"))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        outcomes = list(pool.map(lambda t: kill_run(*t), tasks))
        if not quick:
            outcomes += [o for batch in pool.map(lambda k: resume_campaign(k[0], k[1], work), kinds) for o in batch]
    return outcomes


def print_table(outcomes: list[Outcome]) -> None:
    """One line a kill: where it struck, how it was resumed, the verdict, and what the kill left on disk."""
    header = (f"{'#':>3} {'kind':<10} {'killed':<6} {'phase':<19} {'syscall':<9} {'N':>5}  {'path':<60} "
              f"{'resumed with':<12} {'result':<6} on disk after the kill")
    print(header)
    print("-" * len(header))
    for index, o in enumerate(outcomes, 1):
        how = o.resumed_with if len(o.resumed_with) <= 12 else "run --out"
        print(f"{index:>3} {o.kind:<10} {o.during:<6} {o.call.phase:<19} {o.call.syscall:<9} {o.call.when:>5}  "
              f"{o.call.shown():<60} {how:<12} {'ok' if o.ok else 'FAIL':<6} {o.on_disk}")
        if not o.ok:
            print("      " + "; ".join(filter(None, [o.hit, *o.problems])))
        if o.leftovers:
            print(f"      left after resuming: {' '.join(o.leftovers)}")


def print_totals(outcomes: list[Outcome], seconds: float) -> None:
    good = sum(o.ok for o in outcomes)
    by_syscall = Counter(o.call.syscall for o in outcomes)
    by_kind = Counter(f"{o.kind} {o.during}" for o in outcomes)
    print("\nby syscall: " + ", ".join(f"{k} {v}" for k, v in sorted(by_syscall.items())))
    print("by run: " + ", ".join(f"{k} {v}" for k, v in sorted(by_kind.items())))
    refused = sum("refused" in o.resumed_with for o in outcomes)
    if refused:
        print(f"{refused} directories had no config.yaml: --resume refused them and they were run again with --out")
    leftovers = Counter(RANDOM_TEMPORARY.sub(r"\1.tmp*", name).rsplit("/", 1)[-1] for o in outcomes
                        for name in o.leftovers)
    if leftovers:
        print(f"files left after resuming that the uninterrupted run lacks: {dict(leftovers)}")
    print(f"{len(outcomes)} kills, {good} resumed to the uninterrupted numbers ({seconds:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="six kills (renames and writes, both kinds of run)")
    parser.add_argument("--keep", action="store_true", help="keep every directory (failed cases are always kept)")
    parser.add_argument("--json", type=Path, help="write every kill and its outcome here")
    parser.add_argument("--workdir", type=Path, help="where the runs go (default: a new temporary directory)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="kills run side by side")
    args = parser.parse_args(argv)
    if shutil.which("strace") is None:
        print("strace is not installed", file=sys.stderr)
        return 2
    work = (args.workdir or Path(tempfile.mkdtemp(prefix="kill-campaign-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    outcomes = campaign(work, args.quick, args.jobs)
    seconds = time.perf_counter() - began
    print_table(outcomes)
    print_totals(outcomes, seconds)
    if args.json:
        report = {"kills": len(outcomes), "resumed_to_same_numbers": sum(o.ok for o in outcomes),
                  "seconds": seconds, "outcomes": [asdict(o) | {"ok": o.ok} for o in outcomes]}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    tidy(work, outcomes, args.keep, args.workdir is None)
    return 0 if all(o.ok for o in outcomes) else 1


def tidy(work: Path, outcomes: list[Outcome], keep: bool, temporary: bool) -> None:
    """Without --keep, remove the directories of passing kills, and a temporary workdir when every kill passed."""
    failed = [o.directory for o in outcomes if not o.ok]
    if failed:
        print("failed cases kept in: " + ", ".join(failed))
    if keep:
        print(f"directories: {work}")
        return
    for o in outcomes:
        if o.ok:
            shutil.rmtree(o.directory, ignore_errors=True)
    if temporary and not failed:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

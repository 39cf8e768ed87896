"""The strace kill campaign in --quick (issue 17): six SIGKILLs injected at renames and writes of a single run and of
a comparison, each resumed to the uninterrupted numbers. Kill points are calls found by tracing, never times, so the
test does not depend on the machine's speed. It needs strace and permission to ptrace; without either it is skipped."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "kill_campaign.py"


def _strace_problem() -> str | None:
    """Why strace cannot run here, or None."""
    if shutil.which("strace") is None:
        return "strace is not installed"
    try:
        done = subprocess.run(["strace", "-o", "/dev/null", "true"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"strace does not run: {err}"
    if done.returncode != 0:
        return f"ptrace is not permitted here: {done.stderr.strip()[:200]}"
    return None


@pytest.mark.slow
def test_quick_kill_campaign_resumes_every_kill_to_the_uninterrupted_numbers(tmp_path):
    problem = _strace_problem()
    if problem is not None:
        pytest.skip(problem)
    report = tmp_path / "kills.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(report), "--workdir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=1200, check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    results = json.loads(report.read_text())
    outcomes = results["outcomes"]
    assert results["kills"] == len(outcomes) == 6
    assert all(o["ok"] for o in outcomes), [o for o in outcomes if not o["ok"]]
    assert all(o["exit_code"] == -9 and o["hit"] == "" for o in outcomes)  # killed by SIGKILL, at the traced call
    assert {o["kind"] for o in outcomes} == {"single", "comparison"}
    syscalls = {o["call"]["syscall"] for o in outcomes}
    assert {"write", "rename"} <= syscalls
    assert "6 kills, 6 resumed to the uninterrupted numbers" in done.stdout

"""`LocalCluster`'s start-up waits: a daemon that exits while it is awaited is an error that names its log, and
a log line that is there ends the wait at once. Driven by processes that have already ended: nothing races."""

import subprocess
import sys

import pytest

from manytask.engine.flower.cluster import REGISTERED, wait_for_log_line
from manytask.errors import ManytaskError


def _ended(code: int) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    process.wait()
    return process


def test_a_daemon_that_exited_before_registering_is_reported_with_its_log(tmp_path):
    log = tmp_path / "supernode0.log"
    log.write_text("Starting Flower SuperNode\n")
    with pytest.raises(ManytaskError, match=r"exited at start \(code 3\); see .*supernode0.log"):
        wait_for_log_line(REGISTERED, 60, _ended(3), log)


def test_a_registered_daemon_ends_the_wait(tmp_path):
    log = tmp_path / "supernode0.log"
    log.write_text(f"Starting Flower SuperNode\nINFO: {REGISTERED} 7147848296807338980\n")
    running = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        wait_for_log_line(REGISTERED, 60, running, log)
    finally:
        running.communicate(b"")
    assert running.returncode == 0

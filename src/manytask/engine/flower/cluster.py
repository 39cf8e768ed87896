"""`LocalCluster`: a SuperLink and N SuperNodes on loopback, for trying a deployment on one machine (and for the
tests). Every daemon binds 127.0.0.1 only, is started with its own log file, and is stopped by PID."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from manytask.errors import ManytaskError
from manytask.extras import missing_extra

QUIET_FLOWER = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}
HOST = "127.0.0.1"
REGISTERED = "SuperNode ID:"  # what a SuperNode logs once the SuperLink has given it its node ID


@dataclass(frozen=True)
class TLSFiles:
    """PEM files: the CA certificate clients trust, and the SuperLink's certificate and key."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


def flower_env(flwr_home: Path) -> dict[str, str]:
    """Environment for Flower's commands: quiet, offline, this interpreter's bin first on PATH (Flower starts
    its child processes by bare command name) and a private FLWR_HOME."""
    bin_dir = str(Path(sys.executable).parent)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, **QUIET_FLOWER, "PATH": path, "FLWR_HOME": str(flwr_home)}


def flower_command(name: str) -> str:
    """Path of one of Flower's console scripts next to this interpreter."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        raise missing_extra(f"'{name}'", "flwr")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float, process: subprocess.Popen, log: Path) -> None:
    def listening() -> bool:
        with socket.socket() as sock:
            return sock.connect_ex((HOST, port)) == 0

    _wait_at_start(listening, timeout, process, log, f"nothing listened on {HOST}:{port}")


def wait_for_log_line(text: str, timeout: float, process: subprocess.Popen, log: Path) -> None:
    """Until a daemon's log has a line with `text` (it reads the log from the start each time: logs here are
    a few lines long when this is called)."""
    _wait_at_start(lambda: text in log.read_text(errors="replace"), timeout, process, log, f"no '{text}' in its log")


def _wait_at_start(ready: Callable[[], bool], timeout: float, process: subprocess.Popen, log: Path,
                   missing: str) -> None:
    """Poll `ready` until it holds; a ManytaskError naming `log` if the daemon exits first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ManytaskError(f"a Flower daemon exited at start (code {process.returncode}); see {log}.")
        if ready():
            return
        time.sleep(0.1)
    raise ManytaskError(f"{missing} within {timeout:.0f} s; see {log}.")


class LocalCluster:
    def __init__(self, nodes: int, workdir: Path, tls: TLSFiles | None = None, port: int | None = None,
                 data_paths: list[Path | None] | None = None) -> None:
        if nodes < 1:
            raise ManytaskError(f"a cluster needs at least one SuperNode, got {nodes}.")
        if data_paths is not None and len(data_paths) != nodes:
            raise ManytaskError(f"{len(data_paths)} data paths for {nodes} SuperNodes; give one per node.")
        self.nodes = nodes
        self.data_paths = data_paths or [None] * nodes  # each node's `data-path` (exported partitions), or none
        self.workdir = Path(workdir)
        self.tls = tls
        self.port = port or free_port()
        self.superlink: subprocess.Popen | None = None
        self.supernodes: list[subprocess.Popen] = []
        self.reported: set[int] = set()  # SuperNodes whose exit `dead_nodes` has already returned

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return flower_env(self.workdir / "flwr_home")

    def start(self, timeout: float = 60.0) -> LocalCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        link_security = (
            ["--insecure"] if self.tls is None else
            ["--ssl-ca-certfile", str(self.tls.ca_cert), "--ssl-certfile", str(self.tls.server_cert),
             "--ssl-keyfile", str(self.tls.server_key)]
        )
        self.superlink = self._spawn(
            "superlink", [flower_command("flower-superlink"), *link_security, "--host", HOST, "--port",
                          str(self.port), "--disable-runtime-dependency-installation"],
        )
        wait_for_port(self.port, timeout, self.superlink, self._log("superlink"))
        node_security = ["--insecure"] if self.tls is None else ["--root-certificates", str(self.tls.ca_cert)]
        ports = [free_port() for _ in range(self.nodes)]
        for index, port in enumerate(ports):
            self.supernodes.append(self._spawn(f"supernode{index}", [
                flower_command("flower-supernode"), *node_security, "--superlink", self.address, "--host", HOST,
                "--port", str(port), "--node-config", self.node_config(index),
            ]))
        for index, (port, process) in enumerate(zip(ports, self.supernodes, strict=True)):
            wait_for_port(port, timeout, process, self._log(f"supernode{index}"))
        for index, process in enumerate(self.supernodes):
            # logged once the node has registered with the SuperLink, after it started its flower-superexec:
            # from here a run sees every node, and every node's process group is complete
            wait_for_log_line(REGISTERED, timeout, process, self._log(f"supernode{index}"))
        return self

    def node_config(self, index: int) -> str:
        """Flower's `--node-config` of SuperNode `index`: its partition, and its own data folder when it has one."""
        config = f"partition-id={index} num-partitions={self.nodes}"
        path = self.data_paths[index]
        return config if path is None else f"{config} data-path={json.dumps(str(Path(path).resolve()))}"

    def kill_node(self, index: int) -> None:
        """SIGKILL one SuperNode (a crashed machine), for failure tests."""
        _signal_group(self.supernodes[index], signal.SIGKILL)
        self.supernodes[index].wait(timeout=30)

    def dead_nodes(self) -> list[int]:
        """SuperNodes that exited since the last call, each returned once. Each one's process group is killed: a
        SuperNode that dies alone leaves its children (flower-superexec, flwr-clientapp) running otherwise."""
        dead = [i for i, p in enumerate(self.supernodes) if i not in self.reported and p.poll() is not None]
        for index in dead:
            _signal_group(self.supernodes[index], signal.SIGKILL)
        self.reported.update(dead)
        return dead

    def describe_exit(self, index: int) -> str:
        """One line on a SuperNode that exited: which, its exit code (negative: the signal) and where its log is."""
        process = self.supernodes[index]
        return (f"SuperNode {index} (pid {process.pid}) exited with code {process.returncode}; "
                f"its log: {self._log(f'supernode{index}')}")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every daemon we started, and its process group, then wait; SIGKILL what lingers."""
        for process in [*self.supernodes, self.superlink]:
            if process is not None and process.poll() is None:
                _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in [*self.supernodes, self.superlink]:
            if process is None:
                continue
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait(timeout=10)
            _signal_group(process, signal.SIGKILL)  # children (superexec, apps) outliving their parent

    def pids(self) -> list[int]:
        return [p.pid for p in [self.superlink, *self.supernodes] if p is not None]

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if threading.current_thread() is not threading.main_thread():
            self.stop()
            return
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not orphan the daemons
        try:
            self.stop()
        finally:
            signal.signal(signal.SIGINT, previous)

    def _log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        log = self._log(name).open("wb")
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir, start_new_session=True
        )


def _signal_group(process: subprocess.Popen, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
